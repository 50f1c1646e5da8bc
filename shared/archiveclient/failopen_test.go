package archiveclient_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/lambda"
	"github.com/stretchr/testify/require"

	"github.com/idemarchive/idemarchive/shared/archiveclient"
	"github.com/idemarchive/idemarchive/shared/idempotency"
)

// freshStore registers every key as fresh, one the archive may hold.
type freshStore struct{}

func (freshStore) Register(_ context.Context, req idempotency.Registering) (idempotency.Registration, error) {
	return idempotency.Registration{Fresh: true, MayBeArchived: true, Token: req.Token,
		Entry: idempotency.Entry{Fingerprint: req.Fingerprint, State: idempotency.InFlight}}, nil
}
func (freshStore) Complete(context.Context, string, idempotency.Completion) error { return nil }
func (freshStore) Release(context.Context, string, []byte, []byte) error          { return nil }

// ctxFunction is a lookup function reached as the SDK reaches it: an
// invocation whose context has ended fails without an answer.
type ctxFunction struct{ function }

func (f *ctxFunction) Invoke(ctx context.Context, in *lambda.InvokeInput, opts ...func(*lambda.Options)) (*lambda.InvokeOutput, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return f.function.Invoke(ctx, in, opts...)
}

// A negative Timeout used to be a deadline already passed: every lookup
// ended in context.DeadlineExceeded, which the middleware answers 503 even
// with FailOpen (it never runs a key the archive may hold because the lookup
// had no time). Refused with an error of its own, the lookup became an
// "archive error" that FailOpen runs through: every late retry of an
// archived key ran again.
func TestANegativeTimeoutNeverFailsOpen(t *testing.T) {
	t.Parallel()
	f := &ctxFunction{function{out: archived}}
	c := archiveclient.Lambda{Client: f, FunctionName: "lookup", Timeout: -time.Second}
	var ran atomic.Int32
	mw, err := idempotency.New(idempotency.Config{Store: freshStore{}, Archive: c, SingleTenant: true, OnArchiveError: idempotency.FailOpen})
	require.NoError(t, err)
	srv := mw.Wrap(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		ran.Add(1)
		w.WriteHeader(http.StatusCreated)
	}))
	r := httptest.NewRequest(http.MethodPost, "/v1/charges", strings.NewReader(`{}`))
	r.Header.Set(idempotency.HeaderKey, "archived-key")
	w := httptest.NewRecorder()
	srv.ServeHTTP(w, r)
	require.EqualValues(t, 0, ran.Load(), "a key the archive holds ran again: answered %d %s", w.Code, w.Body)
	require.Equal(t, http.StatusServiceUnavailable, w.Code)
	require.Empty(t, f.asked, "nothing is invoked")
}
