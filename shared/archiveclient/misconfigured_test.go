package archiveclient_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"unicode/utf8"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/lambda"
	"github.com/stretchr/testify/require"

	"github.com/idemarchive/idemarchive/shared/archive"
	"github.com/idemarchive/idemarchive/shared/archiveclient"
	"github.com/idemarchive/idemarchive/shared/idempotency"
	"github.com/idemarchive/idemarchive/shared/lookupapi"
)

// lambdaAPI is the Lambda service's Invoke endpoint answering every call
// with an error of type code and HTTP status, through the real SDK.
func lambdaAPI(t *testing.T, status int, code string) *lambda.Client {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("X-Amzn-Errortype", code)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		_, _ = io.WriteString(w, `{"Type":"User","message":"`+code+` from the service"}`)
	}))
	t.Cleanup(srv.Close)
	return lambda.New(lambda.Options{Region: "us-east-1", BaseEndpoint: aws.String(srv.URL),
		Credentials: credentials.NewStaticCredentialsProvider("AKIDEXAMPLE", "secret", ""), RetryMaxAttempts: 1})
}

// An Invoke error that every later call gets too (no function of that name,
// a role that may not invoke it) is archive.ErrMisconfigured, which the
// middleware never fails open on: taken for an outage, FailOpen would run
// every late retry again. An error a later call may not get (throttling, a
// function being updated, the service's own) is an outage, for the
// OnArchiveError policy to decide.
func TestAFunctionThatCanNeverBeInvokedNeverFailsOpen(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		code          string
		status        int
		misconfigured bool
	}{
		{"ResourceNotFoundException", 404, true},
		{"AccessDeniedException", 403, true},
		{"InvalidParameterValueException", 400, true},
		{"InvalidRequestContentException", 400, true},
		{"KMSAccessDeniedException", 502, true},
		{"InvalidSubnetIDException", 502, true},
		{"KMSInvalidStateException", 502, true},
		{"EC2AccessDeniedException", 502, true},
		{"UnsupportedMediaTypeException", 415, true},
		{"ENILimitReachedException", 502, false},
		{"TooManyRequestsException", 429, false},
		{"ResourceConflictException", 409, false},
		{"ServiceException", 500, false},
	} {
		t.Run(tc.code, func(t *testing.T) {
			t.Parallel()
			c := archiveclient.Lambda{Client: lambdaAPI(t, tc.status, tc.code), FunctionName: "idemarchive-lookpu"}
			_, err := c.Lookup(context.Background(), "idem:v1:archived-key", nil)
			require.ErrorContains(t, err, tc.code)
			require.Equal(t, tc.misconfigured, errors.Is(err, archive.ErrMisconfigured), "%v", err)
			require.Equal(t, !tc.misconfigured, errors.Is(err, archiveclient.ErrUnavailable), "%v", err)

			mw, err := idempotency.New(idempotency.Config{Store: freshStore{}, Archive: c, SingleTenant: true, OnArchiveError: idempotency.FailOpen})
			require.NoError(t, err)
			var ran atomic.Int32
			w := charge(mw, "archived-key", &ran)
			if tc.misconfigured {
				require.Zero(t, ran.Load(), "a function that can never answer ran the key under FailOpen")
				require.Equal(t, http.StatusServiceUnavailable, w.Code, w.Body.String())
			} else {
				require.EqualValues(t, 1, ran.Load(), "FailOpen runs through an outage, as configured")
			}
		})
	}
}

// A function that refuses a key the client checked as it does is one this
// client does not fit (another version, another route): it refuses every
// key, so the error is archive.ErrMisconfigured and FailOpen runs none. What
// the refusal says is cut short for the log line, at a character's boundary.
func TestAFunctionThatRefusesTheKeyNeverFailsOpen(t *testing.T) {
	t.Parallel()
	huge := strings.Repeat("é", 3<<20)
	c := archiveclient.Lambda{Client: answering(`{"status":400,"problem":{"code":"bad_request","detail":"` + huge + `"}}`), FunctionName: "lookup"}
	_, err := c.Lookup(context.Background(), "idem:v1:k", nil)
	require.ErrorIs(t, err, archive.ErrMisconfigured)
	require.NotErrorIs(t, err, archiveclient.ErrUnavailable)
	require.ErrorContains(t, err, "rejected the key: status 400: bad_request: éé")
	require.Less(t, len(err.Error()), 4096)
	require.True(t, utf8.ValidString(err.Error()), "cut inside a character")
	require.Contains(t, err.Error(), "more bytes)")

	mw, err := idempotency.New(idempotency.Config{Store: freshStore{}, Archive: c, SingleTenant: true, OnArchiveError: idempotency.FailOpen})
	require.NoError(t, err)
	var ran atomic.Int32
	w := charge(mw, "k", &ran)
	require.Zero(t, ran.Load())
	require.Equal(t, http.StatusServiceUnavailable, w.Code, w.Body.String())

	// A 5xx problem's code is an outage's, cut short too.
	c.Client = answering(`{"status":503,"problem":{"code":"` + strings.Repeat("x", 5<<20) + `"}}`)
	_, err = c.Lookup(context.Background(), "idem:v1:k", nil)
	require.ErrorIs(t, err, archiveclient.ErrUnavailable)
	require.Less(t, len(err.Error()), 4096)
}

// nilInvoker wraps the SDK's client (a recorder, a cache) and returns
// neither an answer nor an error.
type nilInvoker struct{}

func (nilInvoker) Invoke(context.Context, *lambda.InvokeInput, ...func(*lambda.Options)) (*lambda.InvokeOutput, error) {
	return nil, nil
}

// An Invoker that returns no answer and no error is an outage, not a panic.
func TestAnInvokerThatReturnsNothingIsUnavailable(t *testing.T) {
	t.Parallel()
	c := archiveclient.Lambda{Client: nilInvoker{}, FunctionName: "lookup"}
	var err error
	require.NotPanics(t, func() { _, err = c.Lookup(context.Background(), "idem:v1:k", nil) })
	require.ErrorIs(t, err, archiveclient.ErrUnavailable)
	require.ErrorContains(t, err, "no answer and no error")
}

// What a failing function says is cut at 1 KiB for the log line: a
// character cut in two is left out whole, bytes that are no character are
// kept as they are, and 1 KiB or less is kept whole.
func TestAFailingFunctionsWordsAreCutAtACharacter(t *testing.T) {
	t.Parallel()
	fe := "Unhandled"
	errorOf := func(payload string) string {
		c := archiveclient.Lambda{Client: &function{out: func(lookupapi.DirectRequest) *lambda.InvokeOutput {
			return &lambda.InvokeOutput{StatusCode: 200, FunctionError: &fe, Payload: []byte(payload)}
		}}, FunctionName: "lookup"}
		_, err := c.Lookup(context.Background(), "idem:v1:k", nil)
		require.ErrorIs(t, err, archiveclient.ErrUnavailable)
		_, said, _ := strings.Cut(err.Error(), "function error Unhandled: ")
		return said
	}
	whole := strings.Repeat("a", 1024)
	require.Equal(t, whole, errorOf(whole))
	require.Equal(t, strings.Repeat("a", 1023)+"... (2 more bytes)", errorOf(strings.Repeat("a", 1023)+"é"), "é cut in two is left out")
	require.Equal(t, strings.Repeat("a", 1021)+"... (8 more bytes)", errorOf(strings.Repeat("a", 1021)+"😀😀"))
	// Not UTF-8 early on: the end is still cut at 1024, not backed off.
	require.Equal(t, "\xff"+strings.Repeat("a", 1023)+"... (10 more bytes)", errorOf("\xff"+strings.Repeat("a", 1033)))
}
