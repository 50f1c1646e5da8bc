package stack

import (
	"fmt"
	"strconv"
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
			// A run that starts when its event is oldest (it waited for
			// the account's concurrency) still answers while CloudFormation
			// waits: a later one would migrate beside the rollback.
			age, _ := r.Properties["MaximumEventAgeInSeconds"].(float64)
			require.EqualValues(t, 5*60, age)
			fn := b.ofType("AWS::Lambda::Function")[migrate]
			timeout, _ := fn.Properties["Timeout"].(float64)
			require.EqualValues(t, 900, timeout)
			var service float64
			for _, c := range b.ofType(SchemaResourceType) {
				service, _ = strconv.ParseFloat(fmt.Sprint(c.Properties["ServiceTimeout"]), 64)
			}
			require.Positive(t, service)
			require.LessOrEqual(t, age+timeout, service, "a migrate run may still be running when CloudFormation gives up")
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
