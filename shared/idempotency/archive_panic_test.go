package idempotency_test

import (
	"context"
	"net/http"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemarchive/idemarchive/shared/archive"
	"github.com/idemarchive/idemarchive/shared/idempotency"
)

// panicky is an Archive with a bug: it panics while panics is set.
type panicky struct {
	panics atomic.Bool
	inner  idempotency.Archive
}

func (p *panicky) Lookup(ctx context.Context, key string, fp []byte) (archive.Record, error) {
	if p.panics.Load() {
		panic("archive bug")
	}
	return p.inner.Lookup(ctx, key, fp)
}

// An Archive that panics on a fresh key's lookup leaves the key free: the
// operation never ran, and once the archive is mended the retry runs it,
// instead of meeting 409 in flight for the whole window.
func TestAnArchiveThatPanicsLeavesTheKeyFree(t *testing.T) {
	forEachStore(t, func(t *testing.T, b bundle) {
		arch := &panicky{inner: b.reader}
		arch.panics.Store(true)
		h := &charges{}
		mw := b.middleware(t, idempotency.Config{Archive: arch}).Wrap(h)

		// A key without a timestamp: every store looks it up.
		func() {
			defer func() { require.Equal(t, "archive bug", recover(), "the panic goes on") }()
			post(mw, "order-panics", `{"amount":100}`)
		}()
		require.Zero(t, h.calls.Load())

		arch.panics.Store(false)
		w := post(mw, "order-panics", `{"amount":100}`)
		require.Equal(t, http.StatusCreated, w.Code, w.Body.String())
		require.EqualValues(t, 1, h.calls.Load())
	})
}
