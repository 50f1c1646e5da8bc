package stack

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemarchive/idemarchive/shared/sweep"
)

// A sweep that the backlog keeps busy stops starting batches when less than
// SWEEP_DEADLINE_MARGIN of its timeout is left (35 s by default), so it lasts
// about its timeout minus the margin: 205 s of a 240 s timeout. The
// sweep-duration alarm is there for exactly that run ("a run used its whole
// window"); at 90% of the timeout (216 s) it fired only when the last batch
// happened to run long, never for the run it describes.
func TestSweepDurationAlarmFiresForARunTheDeadlineStopped(t *testing.T) {
	margin := sweep.Config{}.WithDefaults().DeadlineMargin
	for _, interval := range []time.Duration{2 * time.Minute, 5 * time.Minute, 16 * time.Minute, time.Hour} {
		// GIVEN the stack with this sweep interval
		b := setup(t, func(p *Props) { p.SweepInterval = interval })
		timeout := min(interval-time.Minute, 15*time.Minute)
		// WHEN a sweep runs until the deadline margin stops it
		stopped := timeout - margin
		// THEN its duration breaches the sweep-duration alarm
		found := false
		for _, a := range b.ofType("AWS::CloudWatch::Alarm") {
			if a.Properties["AlarmName"] != "Test-sweep-duration" {
				continue
			}
			found = true
			threshold, _ := a.Properties["Threshold"].(float64)
			require.Less(t, threshold, float64(stopped.Milliseconds()),
				"interval %s: a run the deadline stopped lasts about %s, under the alarm's %v ms", interval, stopped, threshold)
			require.Greater(t, threshold, float64(stopped.Milliseconds())/2,
				"interval %s: the alarm must not fire for runs far shorter than the window", interval)
		}
		require.True(t, found, "no sweep-duration alarm")
	}
}
