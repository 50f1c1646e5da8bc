package sweep

import (
	"testing"
	"time"
)

// pauseAfter never overflows and never exceeds MaxInvocation, whatever the
// batch took and the ratio, and is exact below that.
func TestPauseAfterIsBoundedAndExact(t *testing.T) {
	for _, c := range []struct {
		pause time.Duration
		ratio float64
		took  time.Duration
		want  time.Duration
	}{
		{0, 0, time.Hour, 0},
		{200 * time.Millisecond, 0, time.Hour, 200 * time.Millisecond},
		{200 * time.Millisecond, 3, 100 * time.Millisecond, 500 * time.Millisecond},
		{0, 0.5, 3 * time.Millisecond, 1500 * time.Microsecond},
		{0, MaxPauseRatio, MaxInvocation, MaxInvocation},
		{MaxInvocation, MaxPauseRatio, 1<<63 - 1, MaxInvocation},
		{MaxInvocation, 1, time.Minute, MaxInvocation},
		{time.Second, 3, -time.Second, time.Second}, // a clock step back
	} {
		if got := pauseAfter(c.pause, c.ratio, c.took); got != c.want {
			t.Errorf("pauseAfter(%s, %g, %s) = %s, want %s", c.pause, c.ratio, c.took, got, c.want)
		}
	}
}
