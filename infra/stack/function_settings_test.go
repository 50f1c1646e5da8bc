package stack

import (
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemarchive/idemarchive/shared/sweep"
)

// Every function setting an alarm or an error tells the operator to change
// has a prop, lands in the functions' environment as the variable the
// functions read, and a prop whose zero means something (no fixed pause, no ratio, no
// grace, no compaction) is passed on as 0, never dropped for the default.
func TestFunctionSettingsPropsReachTheFunctions(t *testing.T) {
	// GIVEN every function setting set, the zero-meaning ones to zero
	b := setup(t, func(p *Props) {
		p.SweepPause = new(time.Duration(0))
		p.SweepPauseRatio = new(0.0)
		p.SweepInFlightGrace = new(time.Duration(0))
		p.SweepStatementTimeout = 45 * time.Second
		p.SweepLockTimeout = 3 * time.Second
		p.SweepDeadlineMargin = 50 * time.Second
		p.SweepResourceIDPath = "data.charge.id"
		p.PartitionStatementTimeout = 4 * time.Minute
		p.PartitionLockTimeout = 10 * time.Second
		p.PartitionCompactPerRun = new(0)
	})
	want := map[string]string{
		"SWEEP_PAUSE": "0s", "SWEEP_PAUSE_RATIO": "0", "SWEEP_IN_FLIGHT_GRACE": "0s", "SWEEP_STATEMENT_TIMEOUT": "45s", "SWEEP_LOCK_TIMEOUT": "3s",
		"SWEEP_DEADLINE_MARGIN": "50s", "SWEEP_RESOURCE_ID_PATH": "data.charge.id", "PARTITION_STATEMENT_TIMEOUT": "4m0s",
		"PARTITION_LOCK_TIMEOUT": "10s", "PARTITION_COMPACT_PER_RUN": "0",
	}
	// THEN every function has them (each validates them all at start)
	for _, fn := range FunctionNames {
		env := b.env(b.functionID(t, fn))
		for name, v := range want {
			require.Equal(t, v, env[name], "%s: %s", fn, name)
		}
	}
	// AND the partitions function's timeout makes room for a 4-minute
	// statement: 6 minutes
	require.EqualValues(t, 360, b.json.Resources[b.functionID(t, "partitions")].Properties["Timeout"])

	// AND unset, none is in the environment: the functions' defaults apply
	b = setup(t, nil)
	env := b.env(b.functionID(t, "sweep"))
	for name := range want {
		require.NotContains(t, env, name)
	}
	require.EqualValues(t, 300, b.json.Resources[b.functionID(t, "partitions")].Properties["Timeout"])
}

// A bad combination fails the synth with a message naming what to change,
// not a function that fails (or, worse, runs and does nothing) after the
// deploy.
func TestFunctionSettingsPropsAreValidatedAtSynth(t *testing.T) {
	code := placeholderCode(t)
	validate := func(mutate func(*Props)) error {
		p := Props{CodeDir: code}
		mutate(&p)
		return p.validate()
	}
	for name, c := range map[string]struct {
		mutate func(*Props)
		want   string // "" when valid
	}{
		// The sweep starts batches while its deadline is further than the
		// margin: at a 2-minute interval its timeout is 60 s.
		"margin leaves exactly the minimum window": {func(p *Props) {
			p.SweepInterval = 2 * time.Minute
			p.SweepDeadlineMargin = 50 * time.Second
			p.SweepStatementTimeout = 40 * time.Second
		}, ""},
		"margin leaves a millisecond less": {func(p *Props) {
			p.SweepInterval = 2 * time.Minute
			p.SweepDeadlineMargin = 50*time.Second + time.Millisecond
			p.SweepStatementTimeout = 40 * time.Second
		}, "leaves 9.999s of its 1m0s timeout"},
		"default margin of a long statement timeout eats the timeout": {func(p *Props) {
			p.SweepInterval = 2 * time.Minute
			p.SweepStatementTimeout = time.Minute
		}, "deadline margin (1m5s"},
		"margin longer than the timeout": {func(p *Props) {
			p.SweepDeadlineMargin = 5 * time.Minute
		}, "leaves -1m0s of its 4m0s timeout"},
		"lock timeout not under the statement timeout": {func(p *Props) {
			p.SweepStatementTimeout = 10 * time.Second
			p.SweepLockTimeout = 10 * time.Second
		}, "SWEEP_LOCK_TIMEOUT"},
		"margin under the statement timeout": {func(p *Props) {
			p.SweepStatementTimeout = 40 * time.Second
			p.SweepDeadlineMargin = 30 * time.Second
		}, "SWEEP_DEADLINE_MARGIN"},
		"negative pause":                         {func(p *Props) { p.SweepPause = new(-time.Second) }, "SWEEP_PAUSE"},
		"pause under a millisecond":              {func(p *Props) { p.SweepPause = new(time.Microsecond) }, "SWEEP_PAUSE"},
		"pause ratio past its maximum":           {func(p *Props) { p.SweepPauseRatio = new(99.5) }, "SWEEP_PAUSE_RATIO"},
		"negative pause ratio":                   {func(p *Props) { p.SweepPauseRatio = new(-1.0) }, "SWEEP_PAUSE_RATIO"},
		"NaN pause ratio":                        {func(p *Props) { p.SweepPauseRatio = new(math.NaN()) }, "SWEEP_PAUSE_RATIO"},
		"largest pause ratio":                    {func(p *Props) { p.SweepPauseRatio = new(sweep.MaxPauseRatio) }, ""},
		"grace over a day":                       {func(p *Props) { p.SweepInFlightGrace = new(25 * time.Hour) }, "SWEEP_IN_FLIGHT_GRACE"},
		"negative statement timeout":             {func(p *Props) { p.SweepStatementTimeout = -time.Second }, "SWEEP_STATEMENT_TIMEOUT"},
		"compaction past its maximum":            {func(p *Props) { p.PartitionCompactPerRun = new(25) }, "PARTITION_COMPACT_PER_RUN"},
		"negative compaction":                    {func(p *Props) { p.PartitionCompactPerRun = new(-1) }, "PARTITION_COMPACT_PER_RUN"},
		"partition lock timeout in microseconds": {func(p *Props) { p.PartitionLockTimeout = 1500 * time.Microsecond }, "PARTITION_LOCK_TIMEOUT"},
		"longest partition statement":            {func(p *Props) { p.PartitionStatementTimeout = MaxPartitionStatementTimeout }, ""},
		"partition statement past it": {func(p *Props) {
			p.PartitionStatementTimeout = MaxPartitionStatementTimeout + time.Millisecond
		}, "PartitionStatementTimeout must be at most 13m0s"},
	} {
		t.Run(name, func(t *testing.T) {
			err := validate(c.mutate)
			if c.want == "" {
				require.NoError(t, err)
				return
			}
			require.ErrorContains(t, err, c.want)
		})
	}
}

// The partitions function's timeout follows its statement timeout, within
// Lambda's 15 minutes: a DDL statement allowed to run its whole timeout is
// never cut off by the function's end.
func TestPartitionsTimeoutCoversItsStatementTimeout(t *testing.T) {
	for stmt, want := range map[time.Duration]time.Duration{
		0:                            5 * time.Minute, // the 2-minute default
		time.Second:                  5 * time.Minute,
		3 * time.Minute:              5 * time.Minute,
		3*time.Minute + time.Second:  5*time.Minute + time.Second,
		MaxPartitionStatementTimeout: 15 * time.Minute,
	} {
		p := Props{PartitionStatementTimeout: stmt}
		require.Equal(t, want, p.partitionsTimeout(), "statement timeout %s", stmt)
		if stmt != 0 {
			require.GreaterOrEqual(t, p.partitionsTimeout()-stmt, partitionsSlack)
		}
	}
}

// The sweep-duration alarm is judged against the window the margin leaves,
// whatever the margin: a longer margin lowers the threshold with it.
func TestSweepDurationAlarmFollowsTheDeadlineMargin(t *testing.T) {
	b := setup(t, func(p *Props) { p.SweepDeadlineMargin = 100 * time.Second })
	for _, a := range b.ofType("AWS::CloudWatch::Alarm") {
		if a.Properties["AlarmName"] == "Test-sweep-duration" {
			require.EqualValues(t, DurationNearTimeout*float64((240*time.Second-100*time.Second).Milliseconds()), a.Properties["Threshold"])
			return
		}
	}
	t.Fatal("no sweep-duration alarm")
}
