package idempotency

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// The recording of an outcome outlives the client (its cancellation is
// dropped) and is bounded by completeBudget, and by the request's deadline
// while that lies ahead: it may be the process's end (a Lambda
// invocation's). One already passed is not kept.
func TestCompletionContext(t *testing.T) {
	t.Parallel()
	within := func(ctx context.Context, from, to time.Duration) {
		t.Helper()
		d, ok := ctx.Deadline()
		require.True(t, ok, "no deadline")
		left := time.Until(d)
		require.True(t, left > from && left <= to, "%s left, want (%s, %s]", left, from, to)
	}

	cctx, cancel := completionContext(context.Background())
	within(cctx, completeBudget-time.Second, completeBudget)
	cancel()

	req, reqCancel := context.WithTimeout(context.Background(), 3*time.Second)
	cctx, cancel = completionContext(req)
	within(cctx, 2*time.Second, 3*time.Second)
	reqCancel() // the client went: the deadline stays, the cancellation does not reach it
	require.NoError(t, cctx.Err())
	cancel()
	require.Error(t, cctx.Err())

	far, farCancel := context.WithTimeout(context.Background(), time.Hour)
	defer farCancel()
	cctx, cancel = completionContext(far)
	within(cctx, completeBudget-time.Second, completeBudget)
	cancel()

	passed, passedCancel := context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
	defer passedCancel()
	cctx, cancel = completionContext(passed)
	within(cctx, completeBudget-time.Second, completeBudget)
	require.NoError(t, cctx.Err(), "a deadline already passed is not kept")
	cancel()
}
