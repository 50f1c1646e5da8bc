package main

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"io"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/events"
	"github.com/aws/aws-lambda-go/lambda"
	"github.com/stretchr/testify/require"

	"github.com/idemarchive/idemarchive/shared/archive"
	"github.com/idemarchive/idemarchive/shared/dbtest"
	"github.com/idemarchive/idemarchive/shared/fnenv"
	"github.com/idemarchive/idemarchive/shared/lookupapi"
	"github.com/idemarchive/idemarchive/shared/testenv"
)

type bundle struct {
	db     *dbtest.DB
	env    *fnenv.Env
	invoke func(t *testing.T, payload []byte) []byte
	stdout *testenv.SyncBuffer
	stderr *testenv.SyncBuffer
}

// setup migrates a schema, creates partitions, archives the runbook's probe
// and a key with awkward characters, and returns the handler behind the real
// lambda.NewHandler plumbing.
func setup(t *testing.T) bundle {
	t.Helper()
	db := dbtest.New(t)
	ctx := context.Background()
	db.Partition(t, 0)
	_, err := db.Pool.Exec(ctx, `INSERT INTO idempotency_key_archive
		(scoped_key, fingerprint, status_code, resource_id, created_at, expired_at)
		VALUES ('idem:v1:probe', '\x00', 201, 'ch_probe', now() - interval '30 hours', now() - interval '6 hours'),
		       ('idem:v1:a b/c%d:e', '\x01', 200, NULL, now() - interval '30 hours', now() - interval '6 hours')`)
	require.NoError(t, err)

	env, stdout, stderr := testenv.FunctionEnv(t, db, nil)
	h := lambda.NewHandler(newHandler(env))
	return bundle{db: db, env: env, stdout: stdout, stderr: stderr, invoke: func(t *testing.T, payload []byte) []byte {
		t.Helper()
		out, err := h.Invoke(testenv.Invocation("req-"+t.Name()), payload)
		require.NoError(t, err, "the lookup function answers every input itself")
		return out
	}}
}

type problem struct {
	Type, Title, Code, Detail string
	Status                    int
	RequestID                 string `json:"request_id"`
}

func TestSampleEvents(t *testing.T) {
	t.Parallel()
	b := setup(t)

	t.Run("HTTP API 2.0", func(t *testing.T) {
		var resp events.APIGatewayV2HTTPResponse
		require.NoError(t, json.Unmarshal(b.invoke(t, testenv.Event(t, "lookup-http-api-v2.json")), &resp))
		require.Equal(t, 200, resp.StatusCode, resp.Body)
		require.Equal(t, "application/json", resp.Headers["Content-Type"])
		var rec map[string]any
		require.NoError(t, json.Unmarshal([]byte(resp.Body), &rec))
		require.EqualValues(t, 201, rec["original_status"])
		require.Equal(t, "ch_probe", rec["resource_id"])
		require.Equal(t, true, rec["fingerprint_match"])
		require.Contains(t, rec, "created_at")
		require.Contains(t, rec, "expired_at")
	})
	t.Run("REST proxy 1.0", func(t *testing.T) {
		var resp events.APIGatewayProxyResponse
		require.NoError(t, json.Unmarshal(b.invoke(t, testenv.Event(t, "lookup-rest-v1.json")), &resp))
		require.Equal(t, 200, resp.StatusCode, resp.Body)
		require.Contains(t, resp.Body, `"resource_id":"ch_probe"`)
	})
	t.Run("direct invoke", func(t *testing.T) {
		var resp struct {
			Status int
			Record map[string]any
		}
		require.NoError(t, json.Unmarshal(b.invoke(t, testenv.Event(t, "lookup-direct.json")), &resp))
		require.Equal(t, 200, resp.Status)
		require.Equal(t, "ch_probe", resp.Record["resource_id"])
		require.Equal(t, true, resp.Record["fingerprint_match"])
	})
	t.Run("investigation over HTTP API", func(t *testing.T) {
		var resp events.APIGatewayV2HTTPResponse
		require.NoError(t, json.Unmarshal(b.invoke(t, testenv.Event(t, "query-http-api-v2.json")), &resp))
		require.Equal(t, 200, resp.StatusCode, resp.Body)
		require.Contains(t, resp.Body, `"scoped_key":"idem:v1:probe"`)
		require.Contains(t, resp.Body, `"scoped_key":"idem:v1:a b/c%d:e"`)
	})
	t.Run("investigation direct", func(t *testing.T) {
		var resp struct {
			Status int
			Page   struct{ Records []map[string]any }
		}
		require.NoError(t, json.Unmarshal(b.invoke(t, testenv.Event(t, "query-direct.json")), &resp))
		require.Equal(t, 200, resp.Status)
		require.Len(t, resp.Page.Records, 2)
	})
	// Every lookup emitted its duration as an EMF line on stdout.
	require.NotEmpty(t, testenv.Lines(b.stdout.String(), `"idempotency_archive_lookup_duration_ms"`))
}

func v2(method, rawPath string, query map[string]string) []byte {
	ev := events.APIGatewayV2HTTPRequest{Version: "2.0", RawPath: rawPath, QueryStringParameters: query}
	ev.RequestContext.HTTP.Method = method
	b, _ := json.Marshal(ev)
	return b
}

func v1(method, path string, query map[string]string) []byte {
	b, _ := json.Marshal(events.APIGatewayProxyRequest{HTTPMethod: method, Path: path, QueryStringParameters: query})
	return b
}

func functionURLEvent(method, rawPath string) []byte {
	ev := events.APIGatewayV2HTTPRequest{Version: "2.0", RawPath: rawPath}
	ev.RequestContext.HTTP.Method = method
	ev.RequestContext.DomainName = "abcdefghij0123456789klmnop.lambda-url.eu-west-1.on.aws"
	b, _ := json.Marshal(ev)
	return b
}

// An HTTP API integration of payload format 1.0 delivers its path decoded,
// where a REST API's is encoded: the two cannot be told apart by the path,
// so such events are refused with a 400 that says what to change, rather
// than a key with '%' in it being read as another key.
func TestHTTPAPIPayloadFormat1IsRefused(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ev, _ := json.Marshal(map[string]any{"version": "1.0", "httpMethod": "GET", "path": "/v1/archive/keys/idem:v1:a b/c%d:e",
		"requestContext": map[string]any{"httpMethod": "GET", "path": "/v1/archive/keys/idem:v1:a b/c%d:e"}})
	var resp events.APIGatewayProxyResponse
	require.NoError(t, json.Unmarshal(b.invoke(t, ev), &resp))
	require.Equal(t, 400, resp.StatusCode, resp.Body)
	require.Contains(t, resp.Body, "payload format 2.0")
	require.Equal(t, "application/problem+json", resp.Headers["Content-Type"])
}

// An Application Load Balancer hands the function its query values still
// percent-encoded, in a REST event's fields: read as a REST event, the
// query route would look up "idem%3Av1%3Aprobe", not the archived key, and
// answer a definite 404. Such events are refused with a 400 that says what
// to use instead, in the shape an ALB reads.
func TestApplicationLoadBalancerEventsAreRefused(t *testing.T) {
	t.Parallel()
	b := setup(t)
	elb := events.ALBTargetGroupRequestContext{ELB: events.ELBContext{TargetGroupArn: "arn:aws:elasticloadbalancing:eu-west-1:123456789012:targetgroup/lookup/abc"}}
	for name, ev := range map[string]events.ALBTargetGroupRequest{
		"query route": {HTTPMethod: "GET", Path: "/v1/archive/lookup", QueryStringParameters: map[string]string{"scoped_key": "idem%3Av1%3Aprobe"}, RequestContext: elb},
		"path route":  {HTTPMethod: "GET", Path: "/v1/archive/keys/idem%3Av1%3Aprobe", RequestContext: elb},
	} {
		payload, err := json.Marshal(ev)
		require.NoError(t, err)
		var resp events.ALBTargetGroupResponse
		require.NoError(t, json.Unmarshal(b.invoke(t, payload), &resp), name)
		require.Equal(t, 400, resp.StatusCode, "%s: %s", name, resp.Body)
		require.Equal(t, "400 Bad Request", resp.StatusDescription, name)
		require.Contains(t, resp.Body, "Application Load Balancer events are not supported", name)
		require.Equal(t, "application/problem+json", resp.Headers["Content-Type"], name)
	}

	// AND a REST event whose requestContext carries elb: null is still a REST event
	rest := map[string]any{"httpMethod": "GET", "path": "/v1/archive/keys/idem%3Av1%3Aprobe", "requestContext": map[string]any{"elb": nil}}
	payload, err := json.Marshal(rest)
	require.NoError(t, err)
	var resp events.APIGatewayProxyResponse
	require.NoError(t, json.Unmarshal(b.invoke(t, payload), &resp))
	require.Equal(t, 200, resp.StatusCode, resp.Body)
}

func TestKeysWithAwkwardCharacters(t *testing.T) {
	t.Parallel()
	b := setup(t)
	key := "idem:v1:a b/c%d:e"
	for name, payload := range map[string][]byte{
		// HTTP APIs hand the function a decoded rawPath, REST APIs an encoded path.
		"HTTP API path":   v2("GET", "/v1/archive/keys/"+key, nil),
		"REST path":       v1("GET", "/v1/archive/keys/"+url.PathEscape(key), nil),
		"REST with stage": v1("GET", "/prod/v1/archive/keys/"+url.PathEscape(key), nil),
		"query form":      v2("GET", "/v1/archive/lookup", map[string]string{"scoped_key": key}),
		// A function URL hands it rawPath as the client sent it.
		"function URL path": functionURLEvent("GET", "/v1/archive/keys/"+url.PathEscape(key)),
	} {
		t.Run(name, func(t *testing.T) {
			var resp events.APIGatewayV2HTTPResponse
			require.NoError(t, json.Unmarshal(b.invoke(t, payload), &resp))
			require.Equal(t, 200, resp.StatusCode, resp.Body)
			require.Contains(t, resp.Body, `"original_status":200`)
		})
	}
}

func TestBadInputIsA4xxProblem(t *testing.T) {
	t.Parallel()
	b := setup(t)
	long := strings.Repeat("k", archive.MaxScopedKeyBytes+1)
	nulCursor := base64.RawURLEncoding.EncodeToString([]byte(`{"k":"a\u0000b","e":"2026-01-01T00:00:00Z"}`))
	window := map[string]string{"scope_prefix": "idem:", "created_from": "2026-01-01T00:00:00Z", "created_to": "2026-02-01T00:00:00Z"}
	with := func(k, v string) map[string]string {
		m := map[string]string{}
		for a, b := range window {
			m[a] = b
		}
		m[k] = v
		return m
	}
	cases := []struct {
		name    string
		payload []byte
		status  int
		code    string
	}{
		{"unknown key", v2("GET", "/v1/archive/keys/idem:v1:never", nil), 404, "key_not_found"},
		{"unknown route", v2("GET", "/v2/other", nil), 404, "route_not_found"},
		{"unknown route under the prefix", v2("GET", "/v1/archive/nothing", nil), 404, "route_not_found"},
		{"wrong method", v2("POST", "/v1/archive/keys/idem:v1:probe", nil), 405, "method_not_allowed"},
		{"empty key", v2("GET", "/v1/archive/keys/", nil), 400, "invalid_key"},
		{"key too long", v2("GET", "/v1/archive/keys/"+long, nil), 400, "invalid_key"},
		{"bad fingerprint", v2("GET", "/v1/archive/keys/idem:v1:probe", map[string]string{"fingerprint": "xyz"}), 400, "bad_request"},
		{"bad percent-encoding", v1("GET", "/v1/archive/keys/%zz", nil), 400, "bad_request"},
		{"missing window", v2("GET", "/v1/archive/keys", map[string]string{"scope_prefix": "idem:"}), 400, "bad_request"},
		{"bad timestamp", v2("GET", "/v1/archive/keys", with("created_from", "yesterday")), 400, "bad_request"},
		{"reversed window", v2("GET", "/v1/archive/keys", with("created_to", "2025-01-01T00:00:00Z")), 400, "invalid_query"},
		{"bad limit", v2("GET", "/v1/archive/keys", with("limit", "-5")), 400, "bad_request"},
		{"limit too large", v2("GET", "/v1/archive/keys", with("limit", "100000")), 400, "invalid_query"},
		{"bad cursor", v2("GET", "/v1/archive/keys", with("cursor", "not-a-cursor")), 400, "invalid_cursor"},
		// Text PostgreSQL cannot hold (a NUL byte) is a 400 in every shape.
		{"NUL in an HTTP API key", v2("GET", "/v1/archive/keys/idem:v1:a\x00b", nil), 400, "invalid_key"},
		{"NUL in a REST key", v1("GET", "/v1/archive/keys/idem:v1:a%00b", nil), 400, "invalid_key"},
		{"NUL in a scope prefix", v2("GET", "/v1/archive/keys", with("scope_prefix", "idem:\x00")), 400, "invalid_query"},
		{"NUL in a cursor", v2("GET", "/v1/archive/keys", with("cursor", nulCursor)), 400, "invalid_cursor"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var resp events.APIGatewayV2HTTPResponse
			require.NoError(t, json.Unmarshal(b.invoke(t, tc.payload), &resp))
			require.Equal(t, tc.status, resp.StatusCode, resp.Body)
			require.Equal(t, "application/problem+json", resp.Headers["Content-Type"])
			var p problem
			require.NoError(t, json.Unmarshal([]byte(resp.Body), &p))
			require.Equal(t, tc.code, p.Code)
			require.Equal(t, tc.status, p.Status)
			require.Equal(t, "urn:idemarchive:problem:"+tc.code, p.Type)
			require.NotEmpty(t, p.Title)
			require.Equal(t, "req-"+t.Name(), p.RequestID)
		})
	}

	// Direct invocations answer problems in the direct shape.
	direct := []struct {
		name    string
		payload string
		status  int
		code    string
	}{
		{"malformed JSON", `{"scoped_key": `, 400, "bad_request"},
		{"not JSON at all", `hello`, 400, "bad_request"},
		{"unknown field", `{"scoped_key": "k", "fingerprnt": "00"}`, 400, "bad_request"},
		{"empty key", `{}`, 400, "invalid_key"},
		{"key too long", `{"scoped_key": "` + long + `"}`, 400, "invalid_key"},
		{"unknown action", `{"action": "delete"}`, 400, "bad_request"},
		{"not found", `{"scoped_key": "idem:v1:never"}`, 404, "key_not_found"},
		{"bad query time", `{"action": "query", "scope_prefix": "idem:", "created_from": "x", "created_to": "y"}`, 400, "bad_request"},
		{"NUL in a key", `{"scoped_key": "idem:v1:a\u0000b"}`, 400, "invalid_key"},
		{"NUL in a scope prefix", `{"action": "query", "scope_prefix": "idem:\u0000", "created_from": "2026-01-01T00:00:00Z", "created_to": "2026-02-01T00:00:00Z"}`, 400, "invalid_query"},
		{"NUL in a cursor", `{"action": "query", "scope_prefix": "idem:", "created_from": "2026-01-01T00:00:00Z", "created_to": "2026-02-01T00:00:00Z", "cursor": "` + nulCursor + `"}`, 400, "invalid_cursor"},
	}
	for _, tc := range direct {
		t.Run("direct "+tc.name, func(t *testing.T) {
			var resp struct {
				Status  int
				Problem problem
			}
			require.NoError(t, json.Unmarshal(b.invoke(t, []byte(tc.payload)), &resp))
			require.Equal(t, tc.status, resp.Status)
			require.Equal(t, tc.code, resp.Problem.Code)
		})
	}
}

// A database that cannot be reached is answered 503 "unavailable" (a retry
// may succeed), with a body that names nothing internal; the cause is
// logged with the request id, never the password.
func TestAnUnreachableDatabaseIs503Unavailable(t *testing.T) {
	t.Parallel()
	env, _, stderr := testenv.FunctionEnv(t, nil, map[string]string{"DATABASE_URL": "postgres://secretuser:hunter2@127.0.0.1:1/db?connect_timeout=2"})
	h := lambda.NewHandler(newHandler(env))
	resp := getProbe(t, h, "req-503")
	require.Equal(t, 503, resp.StatusCode)
	require.JSONEq(t, `{"type":"urn:idemarchive:problem:unavailable","title":"Service Unavailable","status":503,"code":"unavailable","request_id":"req-503"}`, resp.Body)
	require.NotContains(t, resp.Body, "127.0.0.1")
	logs := stderr.String()
	require.Contains(t, logs, `"request_id":"req-503"`)
	require.Contains(t, logs, "lookup answered unavailable")
	require.Contains(t, logs, "127.0.0.1", "the operator sees which database could not be reached")
	require.NotContains(t, logs, "hunter2", "the password never reaches the logs")

	// AND a direct invocation (the middleware's) gets the same problem
	out, err := h.Invoke(testenv.Invocation("req-503-direct"), []byte(`{"scoped_key":"idem:v1:probe"}`))
	require.NoError(t, err)
	var direct lookupapi.DirectResponse
	require.NoError(t, json.Unmarshal(out, &direct))
	require.Equal(t, 503, direct.Status)
	require.Equal(t, "unavailable", direct.Problem.Code)
}

// getProbe looks up idem:v1:probe through an HTTP API event.
func getProbe(t *testing.T, h lambda.Handler, requestID string) events.APIGatewayV2HTTPResponse {
	t.Helper()
	ctx, cancel := context.WithTimeout(testenv.Invocation(requestID), 10*time.Second)
	defer cancel()
	out, err := h.Invoke(ctx, v2("GET", "/v1/archive/keys/idem:v1:probe", nil))
	require.NoError(t, err)
	var resp events.APIGatewayV2HTTPResponse
	require.NoError(t, json.Unmarshal(out, &resp))
	return resp
}

// An error no retry can fix (here a database that does not exist on a
// running server) is a generic 500 that leaks nothing; the error is logged
// with the request id.
func TestInternalErrorsLeakNothing(t *testing.T) {
	t.Parallel()
	db := dbtest.New(t)
	u, err := url.Parse(db.URL)
	require.NoError(t, err)
	u.Path = "/no_such_database_here"
	u.User = url.UserPassword("postgres", "hunter2")
	env, _, stderr := testenv.FunctionEnv(t, nil, map[string]string{"DATABASE_URL": u.String()})
	h := lambda.NewHandler(newHandler(env))
	resp := getProbe(t, h, "req-500")
	require.Equal(t, 500, resp.StatusCode)
	require.JSONEq(t, `{"type":"urn:idemarchive:problem:internal_error","title":"Internal Server Error","status":500,"code":"internal_error","request_id":"req-500"}`, resp.Body)
	require.NotContains(t, resp.Body, "no_such_database_here")
	logs := stderr.String()
	require.Contains(t, logs, `"request_id":"req-500"`)
	require.Contains(t, logs, "lookup failed")
	require.Contains(t, logs, "no_such_database_here")
	require.NotContains(t, logs, "hunter2", "the password never reaches the logs")
}

// A query that cannot finish before the invocation's deadline (the archive
// is locked by a migration, say) is answered 503 timeout before Lambda's own
// timeout cuts the function off.
func TestAQueryThatRunsOutOfTimeIs503Timeout(t *testing.T) {
	t.Parallel()
	db := dbtest.New(t)
	db.Partition(t, 0)
	env, stdout, stderr := testenv.FunctionEnv(t, db, nil)
	h := lambda.NewHandler(newHandler(env))
	ctx := context.Background()
	// Warm the function: its pool and prepared statements exist.
	_, err := h.Invoke(testenv.Invocation("req-warm"), v2("GET", "/v1/archive/keys/idem:v1:probe", nil))
	require.NoError(t, err)

	tx, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, "LOCK TABLE idempotency_key_archive, idempotency_archive_plain_keys IN ACCESS EXCLUSIVE MODE")
	require.NoError(t, err)

	inv, cancel := context.WithTimeout(testenv.Invocation("req-slow"), time.Second)
	defer cancel()
	deadline, _ := inv.Deadline()
	out, err := h.Invoke(inv, v2("GET", "/v1/archive/keys/idem:v1:probe", nil))
	require.NoError(t, err)
	require.True(t, time.Now().Before(deadline), "answered before the invocation's deadline")
	var resp events.APIGatewayV2HTTPResponse
	require.NoError(t, json.Unmarshal(out, &resp))
	require.Equal(t, 503, resp.StatusCode, resp.Body)
	var p problem
	require.NoError(t, json.Unmarshal([]byte(resp.Body), &p))
	require.Equal(t, "timeout", p.Code)
	// AND the operator sees it in the log, with the request's id
	logs := stdout.String() + stderr.String()
	require.Contains(t, logs, "lookup answered timeout")
	require.Contains(t, logs, "req-slow")
}

// The function keeps answerReserve free before the invocation's deadline
// (a quarter of the time left when that is less), and leaves a context
// without a deadline as it is.
func TestTheLookupKeepsTimeToAnswerBeforeTheDeadline(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		left, kept time.Duration
	}{
		{10 * time.Second, answerReserve},
		{4 * answerReserve, answerReserve},
		{400 * time.Millisecond, 100 * time.Millisecond},
		{0, 0},
	} {
		deadline := time.Now().Add(tc.left)
		parent, cancel := context.WithDeadline(context.Background(), deadline)
		ctx, cancelReserve := reserveAnswer(parent)
		got, ok := ctx.Deadline()
		require.True(t, ok)
		// time.Until in reserveAnswer runs a moment after deadline was set,
		// so the quarter kept can be that moment shorter.
		require.InDelta(t, tc.kept, deadline.Sub(got), float64(10*time.Millisecond), "time left %s", tc.left)
		require.LessOrEqual(t, deadline.Sub(got), tc.kept)
		cancelReserve()
		cancel()
	}
	ctx, cancel := reserveAnswer(context.Background())
	defer cancel()
	_, ok := ctx.Deadline()
	require.False(t, ok, "a context without a deadline is given none")
}

// The function's log and answers never carry the database password. A
// DATABASE_URL whose password holds an unescaped '@' (which pgx would read
// partly as the host, then print in its connect error and send to DNS) fails
// the init without a word of it; the same password percent-encoded reaches
// neither the answer nor the log when the database cannot be reached.
func TestTheLookupLogNeverCarriesThePassword(t *testing.T) {
	t.Parallel()
	const tail = "9kLmNpQ"
	_, err := fnenv.Load(context.Background(), func(k string) string {
		return map[string]string{"DATABASE_URL": "postgres://archive_reader:Xy@" + tail + "@db.invalid:5432/archive?sslmode=verify-full&connect_timeout=2"}[k]
	}, io.Discard, io.Discard)
	require.ErrorContains(t, err, "percent-encode")
	require.NotContains(t, err.Error(), tail)

	env, stdout, stderr := testenv.FunctionEnv(t, nil, map[string]string{
		"DATABASE_URL": "postgres://archive_reader:Xy%40" + tail + "@db.invalid:5432/archive?sslmode=verify-full&connect_timeout=2",
	})
	out, err := lambda.NewHandler(newHandler(env)).Invoke(testenv.Invocation("req-unreachable"), []byte(`{"scoped_key":"idem:v1:probe"}`))
	require.NoError(t, err)
	require.NotContains(t, string(out), tail)
	require.NotContains(t, stdout.String(), tail)
	require.NotEmpty(t, stderr.String(), "the connect error is logged")
	require.NotContains(t, stderr.String(), tail)
}
