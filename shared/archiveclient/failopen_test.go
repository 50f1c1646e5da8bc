package archiveclient_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/lambda"
	"github.com/stretchr/testify/require"

	"github.com/idemarchive/idemarchive/shared/archive"
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
// ended in context.DeadlineExceeded. Refused with an error of its own on
// lookup only, it became an "archive error" that FailOpen runs through:
// every late retry of an archived key ran again. idempotency.New refuses
// such a client (and one without a function or a client) before any
// request; a lookup through it fails with archive.ErrMisconfigured,
// invoking nothing.
func TestANegativeTimeoutIsRefusedBeforeAnyRequest(t *testing.T) {
	t.Parallel()
	f := &ctxFunction{function{out: archived}}
	for name, c := range map[string]archiveclient.Lambda{
		"negative Timeout":   {Client: f, FunctionName: "lookup", Timeout: -time.Second},
		"no FunctionName":    {Client: f},
		"no Client":          {FunctionName: "lookup"},
		"nil *lambda.Client": {Client: (*lambda.Client)(nil), FunctionName: "lookup"},
	} {
		_, err := idempotency.New(idempotency.Config{Store: freshStore{}, Archive: c, SingleTenant: true, OnArchiveError: idempotency.FailOpen})
		require.Error(t, err, name)
		require.ErrorContains(t, err, "idempotency: archive: archiveclient: ", name)
	}
	c := archiveclient.Lambda{Client: f, FunctionName: "lookup", Timeout: -time.Second}
	_, err := c.Lookup(context.Background(), "archived-key", nil)
	require.ErrorIs(t, err, archive.ErrMisconfigured)
	require.Empty(t, f.asked, "nothing is invoked")
}

// A lookup function that is slow (a cold start, a throttled account) is a
// slow archive, whether the client's own Timeout or the middleware's
// ArchiveTimeout ended the invocation, while the request itself has time
// left: OnArchiveError decides. FailOpen runs the fresh key; FailClosed
// answers 503 and runs nothing. (The SDK's deadline error used to reach the
// middleware as context.DeadlineExceeded, which it never fails open on.)
func TestASlowFunctionIsAnArchiveErrorTheSettingDecides(t *testing.T) {
	t.Parallel()
	slow := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-time.After(3 * time.Second):
		case <-r.Context().Done():
		}
		_, _ = w.Write([]byte(`{"status":404,"problem":{"code":"key_not_found"}}`))
	}))
	t.Cleanup(slow.Close)
	client := lambda.New(lambda.Options{Region: "us-east-1", BaseEndpoint: aws.String(slow.URL),
		Credentials: credentials.NewStaticCredentialsProvider("AKIDEXAMPLE", "secret", ""), RetryMaxAttempts: 1})
	cases := []struct {
		name                          string
		clientTimeout, archiveTimeout time.Duration
		policy                        idempotency.OnArchiveError
		ran                           int32
	}{
		{"client Timeout, FailOpen", 300 * time.Millisecond, 0, idempotency.FailOpen, 1},
		{"ArchiveTimeout, FailOpen", 5 * time.Second, 300 * time.Millisecond, idempotency.FailOpen, 1},
		{"client Timeout, FailClosed", 300 * time.Millisecond, 0, idempotency.FailClosed, 0},
		{"ArchiveTimeout, FailClosed", 5 * time.Second, 300 * time.Millisecond, idempotency.FailClosed, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c := archiveclient.Lambda{Client: client, FunctionName: "lookup", Timeout: tc.clientTimeout}
			var ran atomic.Int32
			mw, err := idempotency.New(idempotency.Config{Store: freshStore{}, Archive: c, SingleTenant: true,
				OnArchiveError: tc.policy, ArchiveTimeout: tc.archiveTimeout})
			require.NoError(t, err)
			w := charge(mw, "fresh-key", &ran)
			require.Equal(t, tc.ran, ran.Load(), "answered %d %s", w.Code, w.Body)
			if tc.ran == 0 {
				require.Equal(t, http.StatusServiceUnavailable, w.Code, w.Body.String())
			}
		})
	}
}

// tracedArchive is an ordinary decorator (metrics, tracing) of an Archive:
// it hides the wrapped client's Validate from idempotency.New.
type tracedArchive struct{ inner idempotency.Archive }

func (a tracedArchive) Lookup(ctx context.Context, k string, fp []byte) (archive.Record, error) {
	return a.inner.Lookup(ctx, k, fp)
}

type errArchive struct{ err error }

func (a errArchive) Lookup(context.Context, string, []byte) (archive.Record, error) {
	return archive.Record{}, a.err
}

// Behind a decorator, a client that can never look a key up (a negative
// Timeout, no FunctionName, no Client) reaches the first lookup. Its error
// is archive.ErrMisconfigured, without invoking anything, and the
// middleware never fails open on that error, from any Archive: a key the
// archive holds never runs, whatever OnArchiveError says. A nil *Lambda is
// refused by New, not a panic.
func TestAMisconfiguredClientBehindADecoratorNeverFailsOpen(t *testing.T) {
	t.Parallel()
	f := &ctxFunction{function{out: archived}}
	for name, a := range map[string]idempotency.Archive{
		"negative Timeout":   tracedArchive{archiveclient.Lambda{Client: f, FunctionName: "lookup", Timeout: -time.Second}},
		"no FunctionName":    tracedArchive{archiveclient.Lambda{Client: f}},
		"no Client":          tracedArchive{archiveclient.Lambda{FunctionName: "lookup"}},
		"nil *lambda.Client": tracedArchive{archiveclient.Lambda{Client: (*lambda.Client)(nil), FunctionName: "lookup"}},
		"bare error":         errArchive{archive.ErrMisconfigured},
		"wrapped error":      errArchive{fmt.Errorf("tracing: %w", archive.ErrMisconfigured)},
	} {
		mw, err := idempotency.New(idempotency.Config{Store: freshStore{}, Archive: a, SingleTenant: true,
			OnArchiveError: idempotency.FailOpen})
		require.NoError(t, err)
		var ran atomic.Int32
		var w *httptest.ResponseRecorder
		require.NotPanics(t, func() { w = charge(mw, "archived-key", &ran) }, name)
		require.EqualValues(t, 0, ran.Load(), "%s: a key the archive holds ran under FailOpen: %d %s", name, w.Code, w.Body)
		require.Equal(t, http.StatusServiceUnavailable, w.Code, name)
	}
	require.Empty(t, f.asked, "nothing is invoked")

	var nilClient *archiveclient.Lambda
	var err error
	require.NotPanics(t, func() {
		_, err = idempotency.New(idempotency.Config{Store: freshStore{}, Archive: nilClient, SingleTenant: true})
	})
	require.ErrorContains(t, err, "idempotency: Archive is a nil *archiveclient.Lambda")
}

// charge sends a charge with key through mw, counting the handler's runs.
func charge(mw *idempotency.Middleware, key string, ran *atomic.Int32) *httptest.ResponseRecorder {
	srv := mw.Wrap(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		ran.Add(1)
		w.WriteHeader(http.StatusCreated)
	}))
	r := httptest.NewRequest(http.MethodPost, "/v1/charges", strings.NewReader(`{}`))
	r.Header.Set(idempotency.HeaderKey, key)
	w := httptest.NewRecorder()
	srv.ServeHTTP(w, r)
	return w
}
