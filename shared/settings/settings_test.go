package settings

import (
	"math"
	"os"
	"strings"
	"testing"
	"time"
)

func env(m map[string]string) func(string) string {
	return func(k string) string { return m[k] }
}

func TestDefaultsAndOverrides(t *testing.T) {
	s, err := FromEnv(env(map[string]string{
		"DATABASE_URL":            "postgres://u@localhost/db",
		"DATABASE_EXEC_MODE":      "exec",
		"SWEEP_BATCH_SIZE":        "500",
		"SWEEP_PAUSE":             "1s",
		"SWEEP_MISSING_PARTITION": "FAIL",
		"PARTITION_LEAD_MONTHS":   "6",
		"LIVE_TTL":                "48h",
	}))
	if err != nil {
		t.Fatal(err)
	}
	if s.Sweep.BatchSize != 500 || s.Sweep.Pause != time.Second || !s.Sweep.FailOnMissingPartition {
		t.Errorf("sweep overrides lost: %+v", s.Sweep)
	}
	if s.Partitions.LeadMonths != 6 || s.Archive.LiveTTL != 48*time.Hour || s.Database.ExecMode != "exec" {
		t.Errorf("overrides lost: %+v", s)
	}
}

func TestZeroPauseStaysZero(t *testing.T) {
	s, err := FromEnv(env(map[string]string{"DATABASE_URL": "postgres://u@localhost/db", "SWEEP_PAUSE": "0"}))
	if err != nil {
		t.Fatal(err)
	}
	if s.Sweep.WithDefaults().Pause != 0 {
		t.Errorf("SWEEP_PAUSE=0 became %v", s.Sweep.WithDefaults().Pause)
	}
	s, err = FromEnv(env(map[string]string{"DATABASE_URL": "postgres://u@localhost/db"}))
	if err != nil {
		t.Fatal(err)
	}
	if s.Sweep.Pause != 200*time.Millisecond {
		t.Errorf("unset SWEEP_PAUSE is %v, want the 200ms default", s.Sweep.Pause)
	}
}

// SWEEP_PAUSE_RATIO: a finite decimal number from 0 (none, honoured) to
// 99; unset is the default, 3.
func TestSweepPauseRatio(t *testing.T) {
	for value, want := range map[string]float64{"": 3, "0": 0, "0.5": 0.5, " 7 ": 7, "99": 99, "1e1": 10, "+2": 2, ".5": 0.5, "3.": 3, "0.0e-9": 0, "0.5e-99": 0.5e-99, "-0": 0} {
		s, err := FromEnv(env(map[string]string{"DATABASE_URL": "postgres://u@localhost/db", "SWEEP_PAUSE_RATIO": value}))
		if err != nil {
			t.Fatalf("SWEEP_PAUSE_RATIO=%q: %v", value, err)
		}
		if got := s.Sweep.WithDefaults().PauseRatio; got != want || math.Signbit(got) {
			t.Errorf("SWEEP_PAUSE_RATIO=%q is %g, want %g", value, got, want)
		}
	}
	for value, msg := range map[string]string{
		"NaN":    "not a decimal number",
		"inf":    "not a decimal number",
		"three":  "not a decimal number",
		"3x":     "not a decimal number",
		"0x1p2":  "not a decimal number",
		"1_0":    "not a decimal number",
		"3,5":    "not a decimal number",
		"1e999":  "out of range",
		"1e-400": "is not 0 but too small to hold",
		"-1":     "between 0 (none) and 99",
		"99.5":   "between 0 (none) and 99",
		"1e2":    "between 0 (none) and 99",
	} {
		_, err := FromEnv(env(map[string]string{"DATABASE_URL": "postgres://u@localhost/db", "SWEEP_PAUSE_RATIO": value}))
		if err == nil || !strings.HasPrefix(err.Error(), "SWEEP_PAUSE_RATIO: ") || !strings.Contains(err.Error(), msg) {
			t.Errorf("SWEEP_PAUSE_RATIO=%q: got %v, want an error naming it that says %q", value, err, msg)
		}
	}
}

func TestErrorsNameTheVariable(t *testing.T) {
	base := map[string]string{"DATABASE_URL": "postgres://u@localhost/db"}
	cases := map[string]string{
		"SWEEP_BATCH_SIZE":           "many",
		"SWEEP_LOCK_TIMEOUT":         "2",
		"PARTITION_LEAD_MONTHS":      "1",
		"PARTITION_RETENTION_MONTHS": "-3",
		"DATABASE_EXEC_MODE":         "turbo",
		"SKIP_MARGIN":                "1m", // removed
		"CLOCK_SKEW":                 "2h",
		"LIVE_TTL":                   "0",
		"SWEEP_MISSING_PARTITION":    "ignore",
	}
	for name, value := range cases {
		m := map[string]string{name: value}
		for k, v := range base {
			m[k] = v
		}
		_, err := FromEnv(env(m))
		if err == nil {
			t.Errorf("%s=%s: no error", name, value)
			continue
		}
		prefix := strings.SplitN(name, "_", 2)[0]
		if !strings.Contains(err.Error(), prefix) && !strings.Contains(err.Error(), "execution mode") && !strings.Contains(err.Error(), name) {
			t.Errorf("%s=%s: error does not point at the variable: %v", name, value, err)
		}
	}
	if _, err := FromEnv(env(nil)); err == nil || !strings.Contains(err.Error(), "DATABASE_URL") {
		t.Errorf("missing DATABASE_URL: %v", err)
	}
}

// An archive setting the reader refuses names its own variable, and says
// what it got.
func TestArchiveErrorsNameTheOneVariable(t *testing.T) {
	for name, c := range map[string]struct{ value, want string }{
		"ARCHIVE_STATEMENT_TIMEOUT": {"1500us", "1.5ms"},
		"MAX_LIVE_TTL":              {"1h", "got 1h0m0s"},
		"LIVE_TTL":                  {"500ms", "got 500ms"},
		// Quoted as written, not as compared.
		"SWEEP_MISSING_PARTITION": {"FAILx", `got "FAILx"`},
	} {
		_, err := FromEnv(env(map[string]string{"DATABASE_URL": "postgres://u@127.0.0.1/db", name: c.value}))
		if err == nil || !strings.HasPrefix(err.Error(), name+":") || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s=%s: want an error naming it and %q, got %v", name, c.value, c.want, err)
		}
	}
}

// testCA is a self-signed CA certificate, for DATABASE_SSL_ROOT_CERT.
const testCA = `-----BEGIN CERTIFICATE-----
MIIBjjCCATOgAwIBAgIUPDoSiSGNdoRMnoX24M5SziIy7TowCgYIKoZIzj0EAwIw
GzEZMBcGA1UEAwwQc2V0dGluZ3MgdGVzdCBDQTAgFw0yNjEyMDIyMTAxMjZaGA8y
MTI2MTEwODIxMDEyNlowGzEZMBcGA1UEAwwQc2V0dGluZ3MgdGVzdCBDQTBZMBMG
ByqGSM49AgEGCCqGSM49AwEHA0IABE+kRI12j/a9ONrXnr8psxtiRBqoWng0XaRm
7hpK3FBcrbjmMzPGFDw7Rz652E54dXUHuTEibC4JYeifLNEOb2OjUzBRMB0GA1Ud
DgQWBBS0LLCbk8AtZO8/RcFwgaOqyuV4NDAfBgNVHSMEGDAWgBS0LLCbk8AtZO8/
RcFwgaOqyuV4NDAPBgNVHRMBAf8EBTADAQH/MAoGCCqGSM49BAMCA0kAMEYCIQDG
JZWi1r+vE3+MPIr/iD1d0LHs9I45zz755AAvK2MYPQIhALposih4YUqk/E3zbQp+
081e2DuauMP8H3oxJxFTb24Y
-----END CERTIFICATE-----
`

func TestDatabaseMaxConnsAndRootCert(t *testing.T) {
	ca := t.TempDir() + "/global-bundle.pem"
	if err := os.WriteFile(ca, []byte(testCA), 0o600); err != nil {
		t.Fatal(err)
	}
	for v, want := range map[string]int32{"": 0, "1": 1, " 2 ": 2, "1000": 1000} {
		s, err := FromEnv(env(map[string]string{
			"DATABASE_URL": "postgres://u@db.example.com/db", "DATABASE_MAX_CONNS": v, "DATABASE_SSL_ROOT_CERT": ca,
		}))
		if err != nil {
			t.Fatalf("DATABASE_MAX_CONNS=%q: %v", v, err)
		}
		if s.Database.MaxConns != want || s.Database.SSLRootCert != ca {
			t.Errorf("DATABASE_MAX_CONNS=%q: got %+v", v, s.Database)
		}
	}
	// With the bundle, a non-local host passes the TLS rule without
	// sslmode in the URL; without it, it does not.
	if _, err := FromEnv(env(map[string]string{"DATABASE_URL": "postgres://u@db.example.com/db"})); err == nil {
		t.Error("a non-local host without verify-full passed")
	}
}

func TestDatabaseAndMetricsErrorsNameTheVariable(t *testing.T) {
	cases := map[string][]string{
		// 4294967297 used to wrap to 1; 0 used to become the default.
		"DATABASE_MAX_CONNS":     {"4294967297", "99999999999999999999", "0", "-1", "1001", "many"},
		"DATABASE_SSL_ROOT_CERT": {"/nonexistent/global-bundle.pem", "settings_test.go"},
		"METRICS_NAMESPACE":      {"AWS/Lambda", "Idempotency Archive", ":x", strings.Repeat("n", 256), "Archiv\u00e9"},
	}
	for name, values := range cases {
		for _, v := range values {
			_, err := FromEnv(env(map[string]string{"DATABASE_URL": "postgres://u@localhost/db", name: v}))
			if err == nil || !strings.Contains(err.Error(), name+":") {
				t.Errorf("%s=%q: want an error naming %s, got %v", name, v, name, err)
			}
		}
	}
}

func TestEveryVariableIsDocumentedInTheREADME(t *testing.T) {
	b, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	readme := string(b)
	for _, v := range Variables {
		if !strings.Contains(readme, "| `"+v.Name+"` |") {
			t.Errorf("README configuration table lacks %s", v.Name)
		}
	}
}

func TestPartitionRetentionIsBounded(t *testing.T) {
	for value, want := range map[string]string{
		"1000000000000000":     "PARTITION_RETENTION_MONTHS: partition retention of 1000000000000000 months is more than 1200 (100 years); to keep the archive forever, set 0",
		"9223372036854775807":  "PARTITION_RETENTION_MONTHS: partition retention of 9223372036854775807 months",
		"1201":                 "PARTITION_RETENTION_MONTHS",
		"-1":                   "PARTITION_RETENTION_MONTHS: partition retention must not be negative, got -1 (0 keeps the archive forever)",
		"99999999999999999999": "PARTITION_RETENTION_MONTHS",
	} {
		_, err := FromEnv(env(map[string]string{"DATABASE_URL": "postgres://u@localhost/db", "PARTITION_RETENTION_MONTHS": value}))
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("PARTITION_RETENTION_MONTHS=%s: got %v, want %q", value, err, want)
		}
	}
	for _, value := range []string{"0", "1200"} {
		if _, err := FromEnv(env(map[string]string{"DATABASE_URL": "postgres://u@localhost/db", "PARTITION_RETENTION_MONTHS": value})); err != nil {
			t.Errorf("PARTITION_RETENTION_MONTHS=%s: %v", value, err)
		}
	}
	_, err := FromEnv(env(map[string]string{"DATABASE_URL": "postgres://u@localhost/db", "PARTITION_LOCK_TIMEOUT": "900us"}))
	if err == nil || !strings.Contains(err.Error(), "PARTITION_LOCK_TIMEOUT") {
		t.Errorf("PARTITION_LOCK_TIMEOUT=900us: %v", err)
	}
	// Sweep timeouts PostgreSQL would read as "no timeout" or shorten, and
	// values no Lambda invocation can honour, are refused naming the variable.
	for name, value := range map[string]string{
		"SWEEP_LOCK_TIMEOUT":          "900us",
		"SWEEP_STATEMENT_TIMEOUT":     "1500us",
		"SWEEP_DEADLINE_MARGIN":       "15m",
		"SWEEP_PAUSE":                 "-1s",
		"SWEEP_PAUSE_RATIO":           "100",
		"PARTITION_LOCK_TIMEOUT":      "1500us",
		"PARTITION_STATEMENT_TIMEOUT": "16m",
	} {
		_, err := FromEnv(env(map[string]string{"DATABASE_URL": "postgres://u@localhost/db", name: value}))
		if err == nil || !strings.HasPrefix(err.Error(), name+": ") {
			t.Errorf("%s=%s: got %v, want an error naming %s", name, value, err, name)
		}
	}
}

// A zero that would only mean "the default" is refused, never silently read
// as the default; a zero that means something (no pause, no clock skew, keep
// forever) is honoured.
func TestZeroIsNeverTheDefault(t *testing.T) {
	for _, name := range []string{
		"LIVE_TTL", "MAX_LIVE_TTL", "ARCHIVE_STATEMENT_TIMEOUT", "SWEEP_BATCH_SIZE", "SWEEP_LOCK_TIMEOUT", "SWEEP_STATEMENT_TIMEOUT",
		"SWEEP_DEADLINE_MARGIN", "PARTITION_LEAD_MONTHS", "PARTITION_LOCK_TIMEOUT", "PARTITION_STATEMENT_TIMEOUT",
	} {
		value := "0"
		if !strings.Contains(name, "SIZE") && !strings.Contains(name, "MONTHS") {
			value = "0s"
		}
		_, err := FromEnv(env(map[string]string{"DATABASE_URL": "postgres://u@localhost/db", name: value}))
		if err == nil || !strings.HasPrefix(err.Error(), name+": must be positive") {
			t.Errorf("%s=%s: got %v, want it refused naming %s", name, value, err, name)
		}
	}
	s, err := FromEnv(env(map[string]string{"DATABASE_URL": "postgres://u@localhost/db", "CLOCK_SKEW": "0", "SWEEP_PAUSE": "0", "PARTITION_RETENTION_MONTHS": "0"}))
	if err != nil {
		t.Fatal(err)
	}
	if s.ClockSkew != 0 || s.Sweep.WithDefaults().Pause != 0 || s.Partitions.WithDefaults().RetentionMonths != 0 {
		t.Errorf("a meaningful zero was not honoured: skew %s, pause %s, retention %d", s.ClockSkew, s.Sweep.Pause, s.Partitions.RetentionMonths)
	}
	s, err = FromEnv(env(map[string]string{"DATABASE_URL": "postgres://u@localhost/db"}))
	if err != nil {
		t.Fatal(err)
	}
	if s.ClockSkew != 5*time.Minute {
		t.Errorf("unset CLOCK_SKEW is %s, want 5m", s.ClockSkew)
	}
}

func TestPartitionCompactPerRunHonoursZero(t *testing.T) {
	for _, tc := range []struct {
		value string
		want  int
		err   string
	}{
		{"", DefaultPartitionCompactPerRun, ""},
		{"0", 0, ""}, // off, not the default
		{"3", 3, ""},
		{"-1", 0, "PARTITION_COMPACT_PER_RUN"},
		{"25", 0, "PARTITION_COMPACT_PER_RUN"},
		{"some", 0, "PARTITION_COMPACT_PER_RUN"},
	} {
		s, err := FromEnv(env(map[string]string{"DATABASE_URL": "postgres://u@localhost/db", "PARTITION_COMPACT_PER_RUN": tc.value}))
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("PARTITION_COMPACT_PER_RUN=%q: error %v, want one naming %s", tc.value, err, tc.err)
			}
			continue
		}
		if err != nil {
			t.Fatalf("PARTITION_COMPACT_PER_RUN=%q: %v", tc.value, err)
		}
		if s.PartitionCompactPerRun != tc.want {
			t.Errorf("PARTITION_COMPACT_PER_RUN=%q is %d, want %d", tc.value, s.PartitionCompactPerRun, tc.want)
		}
		if s.Partitions.CompactPerRun != 0 {
			t.Errorf("PARTITION_COMPACT_PER_RUN=%q reached Partitions, which the migrate function runs the manager with", tc.value)
		}
	}
}

// A variable set to blanks alone is a mistake like any other bad value:
// refused, naming the variable, never silently the default (a blank
// DATABASE_MAX_CONNS gave the pool default of 4 in Lambda, where the
// functions' default is 2). Values are read trimmed.
func TestBlankValuesAreRefusedAndValuesTrimmed(t *testing.T) {
	for _, name := range []string{"LIVE_TTL", "SWEEP_BATCH_SIZE", "DATABASE_MAX_CONNS", "DATABASE_URL", "DATABASE_SECRET_ARN",
		"SWEEP_RESOURCE_ID_PATH", "METRICS_NAMESPACE", "CLOCK_SKEW", "PARTITION_COMPACT_PER_RUN", "DATABASE_EXEC_MODE"} {
		m := map[string]string{"DATABASE_URL": "postgres://u@localhost/db", name: " \t\n"}
		_, err := FromEnv(env(m))
		if err == nil || !strings.Contains(err.Error(), name+": is set to blanks only") {
			t.Errorf("%s set to blanks: got %v", name, err)
		}
	}
	s, err := FromEnv(env(map[string]string{"DATABASE_URL": " postgres://u@localhost/db\n", "SWEEP_RESOURCE_ID_PATH": "data.id\n", "DATABASE_EXEC_MODE": " exec "}))
	if err != nil {
		t.Fatal(err)
	}
	if s.Database.URL != "postgres://u@localhost/db" || s.Sweep.ResourceIDPath != "data.id" || s.Database.ExecMode != "exec" {
		t.Errorf("values not trimmed: %q %q %q", s.Database.URL, s.Sweep.ResourceIDPath, s.Database.ExecMode)
	}
	// Spaces inside a path name no key of any response: every archived row
	// would lose its resource id without a word.
	for _, path := range []string{"data. id", "data .id", "data.id. x"} {
		_, err := FromEnv(env(map[string]string{"DATABASE_URL": "postgres://u@localhost/db", "SWEEP_RESOURCE_ID_PATH": path}))
		if err == nil || !strings.Contains(err.Error(), "SWEEP_RESOURCE_ID_PATH") {
			t.Errorf("SWEEP_RESOURCE_ID_PATH=%q: got %v", path, err)
		}
	}
}
