package stack

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// CloudFormation invokes a custom resource's function asynchronously: with
// Lambda's default retries a failed (or timed-out) migrate invocation would
// run again up to hours later, after CloudFormation gave up on it
// (ServiceTimeout) and while it may be rolling back, racing the rollback's
// own invocation.
func TestMigrateIsNeverRetriedAsynchronously(t *testing.T) {
	b := setup(t, nil)
	migrate := b.functionID(t, "migrate")
	configured := false
	for _, r := range b.ofType("AWS::Lambda::EventInvokeConfig") {
		if fmt.Sprint(r.Properties["FunctionName"]) == fmt.Sprint(map[string]any{"Ref": migrate}) {
			configured = true
			require.EqualValues(t, 0, r.Properties["MaximumRetryAttempts"])
			require.EqualValues(t, 20*60, r.Properties["MaximumEventAgeInSeconds"], "an event older than ServiceTimeout has no one waiting for its answer")
		}
	}
	require.True(t, configured, "the migrate function keeps Lambda's default async retries (2, max event age 6 h)")
}

// sweeper-wedged judges two windows in a row. A sweep reports once per
// interval, so windows shorter than the interval never both hold a report,
// and missing data is not breaching: the alarm could never fire.
func TestSweeperWedgedWindowsSpanASweepInterval(t *testing.T) {
	b := setup(t, func(p *Props) { p.SweepInterval = time.Hour })
	found := 0
	for id, r := range b.ofType("AWS::CloudWatch::Alarm") {
		if r.Properties["AlarmName"] != "Test-sweeper-wedged" {
			continue
		}
		list, _ := r.Properties["Metrics"].([]any)
		for _, m := range list {
			stat, ok := m.(map[string]any)["MetricStat"].(map[string]any)
			if !ok {
				continue
			}
			period, _ := stat["Period"].(float64)
			found++
			require.GreaterOrEqual(t, period, time.Hour.Seconds(),
				"%s: a %v s window with a report every hour: two consecutive windows never both hold one, so the alarm never fires", id, period)
		}
	}
	require.Positive(t, found, "no sweeper-wedged alarm with metric windows")
}
