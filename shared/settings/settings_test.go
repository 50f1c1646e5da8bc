package settings

import (
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

func TestErrorsNameTheVariable(t *testing.T) {
	base := map[string]string{"DATABASE_URL": "postgres://u@localhost/db"}
	cases := map[string]string{
		"SWEEP_BATCH_SIZE":           "many",
		"SWEEP_LOCK_TIMEOUT":         "2",
		"PARTITION_LEAD_MONTHS":      "1",
		"PARTITION_RETENTION_MONTHS": "-3",
		"DATABASE_EXEC_MODE":         "turbo",
		"SKIP_MARGIN":                "1m", // below the default 5m clock skew
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
		if !strings.Contains(err.Error(), prefix) && !strings.Contains(err.Error(), "execution mode") && !strings.Contains(err.Error(), "skip margin") {
			t.Errorf("%s=%s: error does not point at the variable: %v", name, value, err)
		}
	}
	if _, err := FromEnv(env(nil)); err == nil || !strings.Contains(err.Error(), "DATABASE_URL") {
		t.Errorf("missing DATABASE_URL: %v", err)
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
}
