package cfnresponse_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"math"
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

type bodyRecorder struct {
	mu     sync.Mutex
	bodies [][]byte
	srv    *httptest.Server
}

func newRawCF(t *testing.T) *bodyRecorder {
	c := &bodyRecorder{}
	c.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		c.mu.Lock()
		c.bodies = append(c.bodies, b)
		c.mu.Unlock()
	}))
	t.Cleanup(c.srv.Close)
	return c
}

func (c *bodyRecorder) n() int { c.mu.Lock(); defer c.mu.Unlock(); return len(c.bodies) }

func eventFor(url string) cfn.Event {
	return cfn.Event{RequestType: cfn.RequestCreate, RequestID: "req-1", LogicalResourceID: "Schema",
		StackID: "arn:aws:cloudformation:eu-west-1:1:stack/s/1", ResponseURL: url + "/response?" + signature}
}

// CloudFormation refuses an answer over 4096 bytes ("Response object is too
// long") and shows that instead of the reason: a long reason is cut to fit.
func TestALongReasonFitsCloudFormationsLimit(t *testing.T) {
	t.Parallel()
	c := newRawCF(t)
	h := cfnresponse.Wrap(func(context.Context, cfn.Event) (string, map[string]any, error) {
		return "", nil, errors.New("migration failed: " + strings.Repeat("ERROR: relation does not exist; ", 300))
	}, cfnresponse.Options{})
	require.NoError(t, h(context.Background(), eventFor(c.srv.URL)))
	require.Equal(t, 1, c.n())
	require.LessOrEqual(t, len(c.bodies[0]), cfnresponse.MaxResponseBytes, "the answer is %d bytes", len(c.bodies[0]))
	require.Contains(t, string(c.bodies[0]), "migration failed: ERROR: relation does not exist")
	require.Contains(t, string(c.bodies[0]), "the function's log has the rest")
}

// A long reason of runes wider than a byte, or of characters JSON writes as
// six bytes ('<', '&'), keeps as much of itself as fits, its first words
// included. Cut by the bytes it was over, counted as runes, it once kept
// none of itself.
func TestALongReasonOfWideRunesKeepsWhatFits(t *testing.T) {
	t.Parallel()
	for name, reason := range map[string]string{
		"two bytes":         strings.Repeat("é", 3000),
		"three bytes":       strings.Repeat("€", 2000),
		"four bytes":        strings.Repeat("🙂", 1500),
		"six bytes escaped": strings.Repeat("<", 1500),
		"quotes":            strings.Repeat(`relation "x" `, 500),
	} {
		c := newRawCF(t)
		h := cfnresponse.Wrap(func(context.Context, cfn.Event) (string, map[string]any, error) {
			return "", nil, errors.New("migration failed: " + reason)
		}, cfnresponse.Options{})
		require.NoError(t, h(context.Background(), eventFor(c.srv.URL)))
		require.Equal(t, 1, c.n())
		body := c.bodies[0]
		require.LessOrEqual(t, len(body), cfnresponse.MaxResponseBytes, name)
		var r cfn.Response
		require.NoError(t, json.Unmarshal(body, &r), name)
		require.True(t, strings.HasPrefix(r.Reason, "migration failed: "), "%s: %.80q", name, r.Reason)
		require.True(t, strings.HasSuffix(r.Reason, "the function's log has the rest)"), name)
		// The longest prefix that fits: one more rune would not.
		require.Greater(t, len(body), cfnresponse.MaxResponseBytes-7, "%s: the reason was cut further than it had to be: %d bytes", name, len(body))
	}
}

// A physical id too long for any answer to fit is answered FAILED, under
// the resource's logical id (a create), with a reason that says why: sent
// as it is, CloudFormation would show "Response is too long" instead.
func TestAPhysicalIDTooLongToFitIsAnsweredFailed(t *testing.T) {
	t.Parallel()
	c := newRawCF(t)
	h := cfnresponse.Wrap(func(context.Context, cfn.Event) (string, map[string]any, error) {
		return strings.Repeat("x", 5000), map[string]any{"k": "v"}, nil
	}, cfnresponse.Options{})
	require.NoError(t, h(context.Background(), eventFor(c.srv.URL)))
	require.Equal(t, 1, c.n())
	body := c.bodies[0]
	require.LessOrEqual(t, len(body), cfnresponse.MaxResponseBytes)
	var r cfn.Response
	require.NoError(t, json.Unmarshal(body, &r))
	require.Equal(t, cfn.StatusFailed, r.Status)
	require.Equal(t, "Schema", r.PhysicalResourceID)
	require.Contains(t, r.Reason, "its physical resource id (5000 bytes) is longer than CloudFormation takes")
	require.Empty(t, r.Data)

	// Data that would fit beside a short id is not blamed alone: the
	// reason gives the id's size beside it.
	c = newRawCF(t)
	h = cfnresponse.Wrap(func(context.Context, cfn.Event) (string, map[string]any, error) {
		return strings.Repeat("x", 2500), map[string]any{"k": strings.Repeat("v", 1500)}, nil
	}, cfnresponse.Options{})
	require.NoError(t, h(context.Background(), eventFor(c.srv.URL)))
	require.NoError(t, json.Unmarshal(c.bodies[0], &r))
	require.Equal(t, cfn.StatusFailed, r.Status)
	require.Contains(t, r.Reason, "beside its physical resource id (2500 bytes)")
}

// A handler that runs until its context ends (a migration that is too slow)
// still leaves the answer time before the invocation's deadline: otherwise
// nothing is sent, and CloudFormation waits out its ServiceTimeout.
func TestAHandlerThatUsesAllItsTimeIsStillAnswered(t *testing.T) {
	t.Parallel()
	c := newRawCF(t)
	h := cfnresponse.Wrap(func(ctx context.Context, _ cfn.Event) (string, map[string]any, error) {
		<-ctx.Done()
		return "", nil, ctx.Err()
	}, cfnresponse.Options{SendMargin: 300 * time.Millisecond})
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	require.NoError(t, h(ctx, eventFor(c.srv.URL)))
	require.Equal(t, 1, c.n(), "the answer reached CloudFormation")
	require.Contains(t, string(c.bodies[0]), `"Status":"FAILED"`)
	require.Contains(t, string(c.bodies[0]), "context deadline exceeded")
}

// Data that JSON cannot hold (NaN) is answered FAILED, saying why, rather
// than not answered at all.
func TestDataJSONCannotHoldIsAnsweredFailed(t *testing.T) {
	t.Parallel()
	c := newRawCF(t)
	h := cfnresponse.Wrap(func(context.Context, cfn.Event) (string, map[string]any, error) {
		return "id", map[string]any{"Ratio": math.NaN()}, nil
	}, cfnresponse.Options{})
	require.NoError(t, h(context.Background(), eventFor(c.srv.URL)))
	require.Equal(t, 1, c.n(), "the answer reached CloudFormation")
	require.Contains(t, string(c.bodies[0]), `"Status":"FAILED"`)
	require.Contains(t, string(c.bodies[0]), "cannot be written as JSON")
}

// A redirect would turn the PUT into a GET (net/http's rules), whose 200
// would pass for a delivered answer: it is an answer not delivered.
func TestARedirectIsNotADeliveredAnswer(t *testing.T) {
	t.Parallel()
	var puts, gets int
	var mu sync.Mutex
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		if r.URL.Path == "/response" {
			http.Redirect(w, r, "/elsewhere", http.StatusFound)
			return
		}
		if r.Method == http.MethodPut {
			puts++
		} else {
			gets++
		}
	}))
	t.Cleanup(srv.Close)
	h := cfnresponse.Wrap(func(context.Context, cfn.Event) (string, map[string]any, error) { return "id", nil, nil }, cfnresponse.Options{Attempts: 1})
	err := h(context.Background(), eventFor(srv.URL))
	require.ErrorContains(t, err, "the response URL answered 302 Found")
	require.Zero(t, gets, "never followed")
}

// Neither user information nor the signature of a response URL, however
// odd, reaches the error.
func TestNoResponseURLLeaks(t *testing.T) {
	t.Parallel()
	h := cfnresponse.Wrap(func(context.Context, cfn.Event) (string, map[string]any, error) { return "id", nil, nil },
		cfnresponse.Options{Attempts: 1, AttemptTimeout: time.Second})
	for _, u := range []string{
		"http://user:SECRETPASS@127.0.0.1:1/response?" + signature,
		"http://127.0.0.1:1/response#" + signature,
		"http://nohost.invalid/response?" + signature,
		"https://127.0.0.1:1/r%zz?" + signature,
		"http:opaque/response?" + signature,
	} {
		ev := eventFor("")
		ev.ResponseURL = u
		err := h(context.Background(), ev)
		require.Error(t, err, u)
		for _, s := range []string{"SECRETPASS", "SECRETSIGNATURE", "AKIAEXAMPLE"} {
			require.NotContains(t, err.Error(), s, u)
		}
	}
}

// Options under zero are the defaults: a negative Attempts never means
// "send no answer", a negative timeout or margin never leaves none.
func TestOptionsUnderZeroAreTheDefaults(t *testing.T) {
	t.Parallel()
	c := newRawCF(t)
	h := cfnresponse.Wrap(func(context.Context, cfn.Event) (string, map[string]any, error) { return "id", nil, nil },
		cfnresponse.Options{Attempts: -1, AttemptTimeout: -time.Second, SendMargin: -time.Hour})
	require.NoError(t, h(context.Background(), eventFor(c.srv.URL)))
	require.Equal(t, 1, c.n(), "the answer reached CloudFormation")
}

// A failure whose error says nothing still gives CloudFormation a reason.
func TestAFailureWithAnEmptyErrorHasAReason(t *testing.T) {
	t.Parallel()
	for _, text := range []string{"", " \n"} {
		c := newRawCF(t)
		h := cfnresponse.Wrap(func(context.Context, cfn.Event) (string, map[string]any, error) { return "", nil, errors.New(text) },
			cfnresponse.Options{})
		require.NoError(t, h(context.Background(), eventFor(c.srv.URL)))
		require.Equal(t, 1, c.n())
		var r cfn.Response
		require.NoError(t, json.Unmarshal(c.bodies[0], &r))
		require.Equal(t, cfn.StatusFailed, r.Status)
		require.Equal(t, "the function failed without saying why", r.Reason)
	}
}
