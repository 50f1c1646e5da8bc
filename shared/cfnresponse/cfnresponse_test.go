package cfnresponse_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/cfn"
	"github.com/stretchr/testify/require"

	"github.com/idemarchive/idemarchive/shared/cfnresponse"
)

const signature = "X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=AKIAEXAMPLE&X-Amz-Signature=SECRETSIGNATURE"

// cloudFormation records the answers PUT to it; status, when set, chooses
// each attempt's HTTP status.
type cloudFormation struct {
	mu      sync.Mutex
	answers []cfn.Response
	headers []http.Header
	status  func(attempt int) int
	srv     *httptest.Server
}

func newCloudFormation(t *testing.T) *cloudFormation {
	c := &cloudFormation{}
	c.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c.mu.Lock()
		defer c.mu.Unlock()
		attempt := len(c.answers) + len(c.headers)
		if c.status != nil {
			if s := c.status(attempt); s != http.StatusOK {
				c.headers = append(c.headers, r.Header.Clone())
				w.WriteHeader(s)
				return
			}
		}
		var resp cfn.Response
		body, _ := io.ReadAll(r.Body)
		if r.Method != http.MethodPut || json.Unmarshal(body, &resp) != nil {
			http.Error(w, "want a PUT of a JSON response", http.StatusBadRequest)
			return
		}
		c.answers = append(c.answers, resp)
		c.headers = append(c.headers, r.Header.Clone())
	}))
	t.Cleanup(c.srv.Close)
	return c
}

func (c *cloudFormation) event() cfn.Event {
	return cfn.Event{
		RequestType: cfn.RequestCreate, RequestID: "req-1", LogicalResourceID: "Schema", StackID: "arn:aws:cloudformation:eu-west-1:1:stack/s/1",
		ResponseURL: c.srv.URL + "/response?" + signature,
	}
}

func (c *cloudFormation) only(t *testing.T) cfn.Response {
	t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	require.Len(t, c.answers, 1, "exactly one answer")
	return c.answers[0]
}

func TestSuccessAndFailureAreAnswered(t *testing.T) {
	t.Parallel()
	c := newCloudFormation(t)
	ok := cfnresponse.Wrap(func(context.Context, cfn.Event) (string, map[string]any, error) {
		return "the-id", map[string]any{"SchemaVersion": 7}, nil
	}, cfnresponse.Options{})
	require.NoError(t, ok(context.Background(), c.event()))
	got := c.only(t)
	require.Equal(t, cfn.StatusSuccess, got.Status)
	require.Equal(t, "the-id", got.PhysicalResourceID)
	require.Equal(t, "req-1", got.RequestID)
	require.Equal(t, "Schema", got.LogicalResourceID)
	require.EqualValues(t, 7, got.Data["SchemaVersion"])
	require.Empty(t, c.headers[0].Get("Content-Type"), "the URL is signed without a content type")

	c = newCloudFormation(t)
	failing := cfnresponse.Wrap(func(context.Context, cfn.Event) (string, map[string]any, error) {
		return "", map[string]any{"ignored": true}, errors.New("the owner user is reserved")
	}, cfnresponse.Options{})
	ev := c.event()
	ev.PhysicalResourceID = "existing-id"
	require.NoError(t, failing(context.Background(), ev), "a failure is an answer, not an error")
	got = c.only(t)
	require.Equal(t, cfn.StatusFailed, got.Status)
	require.Equal(t, "the owner user is reserved", got.Reason)
	require.Equal(t, "existing-id", got.PhysicalResourceID, "never an answer without a physical id")
	require.Empty(t, got.Data)
}

func TestAPanicIsAnsweredAndLogged(t *testing.T) {
	t.Parallel()
	c := newCloudFormation(t)
	var logs bytes.Buffer
	h := cfnresponse.Wrap(func(context.Context, cfn.Event) (string, map[string]any, error) {
		var m map[string]int
		m["boom"]++ // a nil map: panics
		return "", nil, nil
	}, cfnresponse.Options{Logger: slog.New(slog.NewJSONHandler(&logs, nil))})
	require.NoError(t, h(context.Background(), c.event()))
	got := c.only(t)
	require.Equal(t, cfn.StatusFailed, got.Status)
	require.Equal(t, "the function panicked: its log has the details", got.Reason)
	require.Equal(t, "Schema", got.PhysicalResourceID)
	require.NotContains(t, got.Reason, "nil map", "no internals in the stack's events")
	require.Contains(t, logs.String(), "assignment to entry in nil map")
	require.Contains(t, logs.String(), "cfnresponse_test.go", "the stack goes to the log")
}

func TestAFailedAttemptIsTriedAgain(t *testing.T) {
	t.Parallel()
	c := newCloudFormation(t)
	c.status = func(attempt int) int {
		if attempt == 0 {
			return http.StatusServiceUnavailable
		}
		return http.StatusOK
	}
	h := cfnresponse.Wrap(func(context.Context, cfn.Event) (string, map[string]any, error) { return "id", nil, nil }, cfnresponse.Options{})
	require.NoError(t, h(context.Background(), c.event()))
	require.Equal(t, cfn.StatusSuccess, c.only(t).Status)
}

// A response URL that refuses, hangs or cannot be reached: the function
// gives up within its bounds, and its error (which the Lambda runtime logs)
// names where without the signature.
func TestAnUndeliverableAnswerIsBoundedAndRedacted(t *testing.T) {
	t.Parallel()
	handle := func(context.Context, cfn.Event) (string, map[string]any, error) { return "id", nil, nil }

	refusing := newCloudFormation(t)
	refusing.status = func(int) int { return http.StatusForbidden }
	err := cfnresponse.Wrap(handle, cfnresponse.Options{Attempts: 2})(context.Background(), refusing.event())
	require.ErrorContains(t, err, "2 attempts failed, the last: the response URL answered 403 Forbidden")
	require.ErrorContains(t, err, refusing.srv.URL+"/response")

	hanging := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// The server notices the client going away only once the body is
		// read; the timer keeps a broken client from hanging the test.
		_, _ = io.ReadAll(r.Body)
		select {
		case <-r.Context().Done():
		case <-time.After(10 * time.Second):
		}
	}))
	t.Cleanup(hanging.Close)
	ev := refusing.event()
	ev.ResponseURL = hanging.URL + "/response?" + signature
	start := time.Now()
	err = cfnresponse.Wrap(handle, cfnresponse.Options{AttemptTimeout: 200 * time.Millisecond, Attempts: 2})(context.Background(), ev)
	require.Error(t, err)
	require.Less(t, time.Since(start), 5*time.Second, "each attempt is bounded")

	ev.ResponseURL = "http://127.0.0.1:1/response?" + signature
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	err = cfnresponse.Wrap(handle, cfnresponse.Options{})(ctx, ev)
	require.ErrorContains(t, err, "http://127.0.0.1:1/response")
	for _, e := range []error{err} {
		for _, secret := range []string{"SECRETSIGNATURE", "AKIAEXAMPLE", "X-Amz"} {
			require.False(t, strings.Contains(e.Error(), secret), "%q leaks %s", e, secret)
		}
	}
}
