package settings

import (
	"strings"
	"testing"
	"time"
)

func fromEnvWith(vars map[string]string) (Settings, error) {
	m := map[string]string{"DATABASE_URL": "postgres://u@localhost/db"}
	for k, v := range vars {
		m[k] = v
	}
	return FromEnv(env(m))
}

// The deadline margin is how close to the invocation's deadline a batch may
// still start, and a batch runs for up to the statement timeout: a shorter
// margin lets a batch start that the Lambda timeout then kills. Refused at
// start, naming the variable at fault: the margin when it is set, the
// statement timeout when the default margin (capped under 15m) falls short.
func TestTheDeadlineMarginCoversTheStatementTimeout(t *testing.T) {
	for _, tc := range []struct {
		vars map[string]string
		want string // "" accepted
	}{
		{map[string]string{"SWEEP_DEADLINE_MARGIN": "1ms"}, "SWEEP_DEADLINE_MARGIN: must be at least SWEEP_STATEMENT_TIMEOUT (30s)"},
		{map[string]string{"SWEEP_DEADLINE_MARGIN": "10s", "SWEEP_STATEMENT_TIMEOUT": "5m"}, "SWEEP_DEADLINE_MARGIN: must be at least"},
		{map[string]string{"SWEEP_DEADLINE_MARGIN": "30500us"}, "SWEEP_DEADLINE_MARGIN: must be a whole number of milliseconds"},
		{map[string]string{"SWEEP_DEADLINE_MARGIN": "1ns"}, "SWEEP_DEADLINE_MARGIN: must be a whole number of milliseconds"},
		{map[string]string{"SWEEP_STATEMENT_TIMEOUT": "15m"}, "SWEEP_STATEMENT_TIMEOUT: 15m0s is longer than the default deadline margin (14m59s"},
		{map[string]string{"SWEEP_STATEMENT_TIMEOUT": "14m59001ms"}, "use at most 14m59s, or set SWEEP_DEADLINE_MARGIN between the two"},
		// The advice can be followed: a margin between the two is accepted.
		{map[string]string{"SWEEP_STATEMENT_TIMEOUT": "14m59001ms", "SWEEP_DEADLINE_MARGIN": "14m59999ms"}, ""},
		{map[string]string{"SWEEP_STATEMENT_TIMEOUT": "14m59s"}, ""},
		{map[string]string{"SWEEP_DEADLINE_MARGIN": "30s"}, ""},
		{map[string]string{"SWEEP_DEADLINE_MARGIN": "5m", "SWEEP_STATEMENT_TIMEOUT": "5m"}, ""},
		{map[string]string{}, ""},
	} {
		s, err := fromEnvWith(tc.vars)
		if tc.want == "" {
			if err != nil {
				t.Errorf("%v: %v", tc.vars, err)
			} else if c := s.Sweep.WithDefaults(); c.DeadlineMargin < c.StatementTimeout {
				t.Errorf("%v: margin %s under the statement timeout %s", tc.vars, c.DeadlineMargin, c.StatementTimeout)
			}
			continue
		}
		if tc.vars["SWEEP_STATEMENT_TIMEOUT"] == "15m" && err != nil && strings.Contains(err.Error(), "SWEEP_DEADLINE_MARGIN") {
			// No margin is at least 15m and under 15m: no advice to set one.
			t.Errorf("%v: %v advises a margin that cannot be set", tc.vars, err)
		}
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: got %v, want %q", tc.vars, err, tc.want)
		}
	}
}

// Durations counted in milliseconds where they are used (the live store's
// TTL and clock skew, the writers' record) are whole milliseconds, refused
// at start naming the variable rather than refused later without a name or
// cut short.
func TestMillisecondDurationsAreWholeMilliseconds(t *testing.T) {
	for name, value := range map[string]string{
		"LIVE_TTL":     "1.0005s",
		"MAX_LIVE_TTL": "168h0.5ms",
		"CLOCK_SKEW":   "1500us",
	} {
		_, err := fromEnvWith(map[string]string{name: value})
		if err == nil || !strings.HasPrefix(err.Error(), name+": must be a whole number of milliseconds") {
			t.Errorf("%s=%s: got %v", name, value, err)
		}
	}
	s, err := fromEnvWith(map[string]string{"LIVE_TTL": "1.001s", "MAX_LIVE_TTL": "200h", "CLOCK_SKEW": "1ms"})
	if err != nil {
		t.Fatal(err)
	}
	if s.Archive.LiveTTL != 1001*time.Millisecond || s.ClockSkew != time.Millisecond {
		t.Errorf("values lost: %+v", s)
	}
}

// A value past what a number or a duration can hold is out of range, not
// malformed; a nonzero value too small to be anything is refused, never read
// as 0.
func TestOutOfRangeAndVanishingValues(t *testing.T) {
	for _, tc := range []struct{ name, value, want string }{
		{"SWEEP_BATCH_SIZE", "9223372036854775808", "SWEEP_BATCH_SIZE: out of range"},
		{"PARTITION_LEAD_MONTHS", "-9223372036854775809", "PARTITION_LEAD_MONTHS: out of range"},
		{"SWEEP_STATEMENT_TIMEOUT", "9223372036854775807s", "SWEEP_STATEMENT_TIMEOUT: out of range"},
		{"LIVE_TTL", "3000000h", "LIVE_TTL: out of range"},
		{"SWEEP_PAUSE", "0.0000001ms", "SWEEP_PAUSE: is not 0 but shorter than a nanosecond"},
		{"SWEEP_PAUSE", "500us", "SWEEP_PAUSE: must be 0 (no fixed pause) or at least 1ms"},
		{"CLOCK_SKEW", "0.1ns", "CLOCK_SKEW: is not 0 but shorter than a nanosecond"},
		{"SWEEP_IN_FLIGHT_GRACE", "0.0001ns", "SWEEP_IN_FLIGHT_GRACE: is not 0 but shorter than a nanosecond"},
		{"SWEEP_BATCH_SIZE", "12abc", "SWEEP_BATCH_SIZE: not a whole number"},
		{"SWEEP_PAUSE", "1 s", "SWEEP_PAUSE: not a duration"},
	} {
		_, err := fromEnvWith(map[string]string{tc.name: tc.value})
		if err == nil || !strings.HasPrefix(err.Error(), tc.want) {
			t.Errorf("%s=%s: got %v, want %q", tc.name, tc.value, err, tc.want)
		}
	}
	for _, v := range []string{"0", "0s", "0.000ms", "1ms", "1.5ms"} {
		if _, err := fromEnvWith(map[string]string{"SWEEP_PAUSE": v}); err != nil {
			t.Errorf("SWEEP_PAUSE=%s: %v", v, err)
		}
	}
}

// Database errors name the variable at fault, whichever it is, and never
// carry the password.
func TestDatabaseErrorsNameTheirVariable(t *testing.T) {
	for _, tc := range []struct {
		vars map[string]string
		want string
	}{
		{map[string]string{"DATABASE_EXEC_MODE": "turbo"}, "DATABASE_EXEC_MODE: "},
		{map[string]string{"DATABASE_URL": "postgres://u@localhost/db?pool_health_check_period=0s"}, "DATABASE_URL: "},
		{map[string]string{"DATABASE_URL": "postgres://u:Xy@9kLmNpQ@10.0.0.5/db"}, "DATABASE_URL: "},
		{map[string]string{"DATABASE_URL": "postgres://u@db.example.com/db"}, "DATABASE_URL: "},
		{map[string]string{"DATABASE_SECRET_ARN": "arn:x", "DATABASE_IAM_AUTH": "true"}, "DATABASE_IAM_AUTH: "},
	} {
		_, err := fromEnvWith(tc.vars)
		if err == nil || !strings.HasPrefix(err.Error(), tc.want) || strings.Contains(err.Error(), "9kLmNpQ") {
			t.Errorf("%v: got %v, want %q", tc.vars, err, tc.want)
		}
	}
}
