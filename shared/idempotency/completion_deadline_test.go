package idempotency

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// The recording of an outcome outlives the client (its cancellation is
// dropped) and the request's deadline, within completeBudget, and carries
// that deadline for a store to keep what it must before it.
func TestCompletionContext(t *testing.T) {
	t.Parallel()
	budgeted := func(ctx context.Context) {
		t.Helper()
		d, ok := ctx.Deadline()
		require.True(t, ok, "no deadline")
		left := time.Until(d)
		require.True(t, left > completeBudget-time.Second && left <= completeBudget, "%s left", left)
	}

	cctx, cancel := completionContext(context.Background())
	budgeted(cctx)
	_, ok := RequestDeadline(cctx)
	require.False(t, ok, "a request without a deadline")
	cancel()

	req, reqCancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	want, _ := req.Deadline()
	cctx, cancel = completionContext(req)
	budgeted(cctx)
	got, ok := RequestDeadline(cctx)
	require.True(t, ok)
	require.Equal(t, want, got)
	reqCancel() // the client went
	time.Sleep(60 * time.Millisecond)
	require.NoError(t, cctx.Err(), "neither the client's going nor the request's deadline ends it")
	cancel()
	require.Error(t, cctx.Err())

	passed, passedCancel := context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
	defer passedCancel()
	cctx, cancel = completionContext(passed)
	defer cancel()
	budgeted(cctx)
	require.NoError(t, cctx.Err())
	got, ok = RequestDeadline(cctx)
	require.True(t, ok, "a deadline passed is still said: the store sees it is behind")
	require.True(t, got.Before(time.Now()))
}
