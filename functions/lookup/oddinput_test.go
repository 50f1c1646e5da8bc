package main

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/aws/aws-lambda-go/events"
	"github.com/aws/aws-lambda-go/lambda"
	awslambda "github.com/aws/aws-sdk-go-v2/service/lambda"
	"github.com/stretchr/testify/require"

	"github.com/idemarchive/idemarchive/shared/archiveclient"
	"github.com/idemarchive/idemarchive/shared/testenv"
)

// invoker hands archiveclient's invocations to the handler, answering a
// handler error as the Lambda service does: a function error.
type invoker struct{ h lambda.Handler }

func (i invoker) Invoke(ctx context.Context, in *awslambda.InvokeInput, _ ...func(*awslambda.Options)) (*awslambda.InvokeOutput, error) {
	out, err := i.h.Invoke(testenv.Invocation("req-client"), in.Payload)
	if err != nil {
		fe := "Unhandled"
		b, _ := json.Marshal(map[string]string{"errorMessage": err.Error(), "errorType": "error"})
		return &awslambda.InvokeOutput{StatusCode: 200, FunctionError: &fe, Payload: b}, nil
	}
	return &awslambda.InvokeOutput{StatusCode: 200, Payload: out}, nil
}

// An archived key whose created_at JSON cannot write (BC, a row written by
// hand) or that has no instant ('-infinity') is answered on every path, its
// creation time null: a 500 or a function error here would reach a
// middleware as "archive unavailable", and one failing open would run the
// request again.
func TestArchivedKeysWithOddCreationTimesAreAnsweredOnEveryPath(t *testing.T) {
	t.Parallel()
	b := setup(t)
	_, err := b.db.Pool.Exec(context.Background(), `INSERT INTO idempotency_key_archive
		(scoped_key, fingerprint, status_code, resource_id, created_at, expired_at)
		VALUES ('idem:v1:bc', '\x00', 201, 'ch_bc', '0100-01-01 00:00:00+00 BC', now() - interval '6 hours'),
		       ('idem:v1:inf', '\x00', 201, 'ch_inf', '-infinity', now() - interval '6 hours')`)
	require.NoError(t, err)
	h := lambda.NewHandler(newHandler(b.env))

	for key, resource := range map[string]string{"idem:v1:bc": "ch_bc", "idem:v1:inf": "ch_inf"} {
		var resp events.APIGatewayV2HTTPResponse
		require.NoError(t, json.Unmarshal(b.invoke(t, v2("GET", "/v1/archive/keys/"+key, nil)), &resp))
		require.Equal(t, 200, resp.StatusCode, resp.Body)
		var rec map[string]any
		require.NoError(t, json.Unmarshal([]byte(resp.Body), &rec))
		require.Nil(t, rec["created_at"], resp.Body)
		require.NotNil(t, rec["expired_at"], resp.Body)
		require.Equal(t, resource, rec["resource_id"])

		var direct struct {
			Status int
			Record map[string]any
		}
		require.NoError(t, json.Unmarshal(b.invoke(t, []byte(`{"scoped_key":"`+key+`"}`)), &direct))
		require.Equal(t, 200, direct.Status)
		require.Equal(t, resource, direct.Record["resource_id"])

		c := archiveclient.Lambda{Client: invoker{h}, FunctionName: "lookup"}
		got, err := c.Lookup(context.Background(), key, nil)
		require.NoError(t, err, "an archived key is found, never unavailable")
		require.Equal(t, 201, got.Status)
		require.True(t, got.CreatedAt.IsZero())
	}
}

// A query parameter given twice is refused: API Gateway would join the
// values with a comma (HTTP APIs, function URLs) or keep the last (REST
// APIs), and the answer would be a definite 404 for a key nobody asked for.
func TestARepeatedQueryParameterIsRefused(t *testing.T) {
	t.Parallel()
	b := setup(t)

	ev := events.APIGatewayV2HTTPRequest{Version: "2.0", RawPath: "/v1/archive/lookup",
		RawQueryString:        "scoped_key=idem%3Av1%3Aprobe&scoped_key=idem%3Av1%3Aother",
		QueryStringParameters: map[string]string{"scoped_key": "idem:v1:probe,idem:v1:other"}}
	ev.RequestContext.HTTP.Method = "GET"
	payload, _ := json.Marshal(ev)
	var resp events.APIGatewayV2HTTPResponse
	require.NoError(t, json.Unmarshal(b.invoke(t, payload), &resp))
	require.Equal(t, 400, resp.StatusCode, resp.Body)
	require.Contains(t, resp.Body, `scoped_key`)

	rest := events.APIGatewayProxyRequest{HTTPMethod: "GET", Path: "/v1/archive/lookup",
		QueryStringParameters:           map[string]string{"scoped_key": "idem:v1:probe"},
		MultiValueQueryStringParameters: map[string][]string{"scoped_key": {"idem:v1:other", "idem:v1:probe"}}}
	payload, _ = json.Marshal(rest)
	var restResp events.APIGatewayProxyResponse
	require.NoError(t, json.Unmarshal(b.invoke(t, payload), &restResp))
	require.Equal(t, 400, restResp.StatusCode, restResp.Body)

	// Pairs that do not parse as a query (a ';', a bad escape) still count.
	for raw, joined := range map[string]string{
		"scoped_key=idem%3Av1%3Aprobe&scoped_key=idem%3Av1%3Aother;x": "idem:v1:probe,idem:v1:other;x",
		"scoped_key=idem%3Av1%3Aprobe&scoped_key=idem%3Av1%3A%zz":     "idem:v1:probe,idem:v1:%zz",
		"scoped_key=idem%3Av1%3Aprobe&scoped%5Fkey=idem%3Av1%3Aother": "idem:v1:probe,idem:v1:other",
	} {
		ev.RawQueryString, ev.QueryStringParameters = raw, map[string]string{"scoped_key": joined}
		payload, _ = json.Marshal(ev)
		require.NoError(t, json.Unmarshal(b.invoke(t, payload), &resp))
		require.Equal(t, 400, resp.StatusCode, "%s: %s", raw, resp.Body)
	}

	// Once each, the same parameters answer.
	ev.RawQueryString = "scoped_key=idem%3Av1%3Aprobe"
	ev.QueryStringParameters = map[string]string{"scoped_key": "idem:v1:probe"}
	payload, _ = json.Marshal(ev)
	require.NoError(t, json.Unmarshal(b.invoke(t, payload), &resp))
	require.Equal(t, 200, resp.StatusCode, resp.Body)
	rest.MultiValueQueryStringParameters = map[string][]string{"scoped_key": {"idem:v1:probe"}}
	payload, _ = json.Marshal(rest)
	require.NoError(t, json.Unmarshal(b.invoke(t, payload), &restResp))
	require.Equal(t, 200, restResp.StatusCode, restResp.Body)
}

// An event whose two renderings of its query disagree is refused: API
// Gateway fills both from one query, and the answer, built from
// queryStringParameters, would not see a "Fingerprint" given in the other
// one only, or would answer for one of two keys. An event that leaves the
// other rendering out (a hand-made one) is taken as it is.
func TestAnEventWhoseQueryRenderingsDisagreeIsRefused(t *testing.T) {
	t.Parallel()
	b := setup(t)
	restStatus := func(single map[string]string, multi map[string][]string) (int, string) {
		t.Helper()
		payload, _ := json.Marshal(events.APIGatewayProxyRequest{HTTPMethod: "GET", Path: "/v1/archive/lookup",
			QueryStringParameters: single, MultiValueQueryStringParameters: multi})
		var resp events.APIGatewayProxyResponse
		require.NoError(t, json.Unmarshal(b.invoke(t, payload), &resp))
		return resp.StatusCode, resp.Body
	}
	v2Status := func(raw string, single map[string]string) (int, string) {
		t.Helper()
		ev := events.APIGatewayV2HTTPRequest{Version: "2.0", RawPath: "/v1/archive/lookup", RawQueryString: raw, QueryStringParameters: single}
		ev.RequestContext.HTTP.Method = "GET"
		payload, _ := json.Marshal(ev)
		var resp events.APIGatewayV2HTTPResponse
		require.NoError(t, json.Unmarshal(b.invoke(t, payload), &resp))
		return resp.StatusCode, resp.Body
	}
	probe := map[string]string{"scoped_key": "idem:v1:probe"}
	status, body := restStatus(probe, map[string][]string{"scoped_key": {"idem:v1:probe"}, "Fingerprint": {"00"}})
	require.Equal(t, 400, status, body)
	require.Contains(t, body, "Fingerprint")
	status, body = restStatus(probe, map[string][]string{"scoped_key": {"idem:v1:other"}})
	require.Equal(t, 400, status, body)
	require.Contains(t, body, "multiValueQueryStringParameters")
	status, body = v2Status("scoped_key=idem%3Av1%3Aprobe&Fingerprint=00", probe)
	require.Equal(t, 400, status, body)
	require.Contains(t, body, "rawQueryString")
	status, body = v2Status("scoped_key=idem%3Av1%3Aprobe", map[string]string{"scoped_key": "idem:v1:probe", "fingerprint": "00"})
	require.Equal(t, 400, status, body)

	// Agreeing, or with the other rendering left out, they answer.
	for _, s := range []func() (int, string){
		func() (int, string) { return restStatus(probe, map[string][]string{"scoped_key": {"idem:v1:probe"}}) },
		func() (int, string) { return restStatus(probe, nil) },
		func() (int, string) { return v2Status("scoped_key=idem%3Av1%3Aprobe", probe) },
		func() (int, string) { return v2Status("scoped_key=idem:v1:probe", probe) },
		func() (int, string) { return v2Status("", probe) },
	} {
		status, body := s()
		require.Equal(t, 200, status, body)
		require.Contains(t, body, `"resource_id":"ch_probe"`)
	}
}

// A direct query's limit of 0 is refused, as limit=0 over HTTP is: zero
// never means the default.
func TestADirectQueryOfLimitZeroIsRefused(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var resp struct {
		Status  int
		Problem problem
	}
	require.NoError(t, json.Unmarshal(b.invoke(t, []byte(`{"action":"query","scope_prefix":"idem:","created_from":"2026-01-01T00:00:00Z","created_to":"2027-01-01T00:00:00Z","limit":0}`)), &resp))
	require.Equal(t, 400, resp.Status)
	require.Equal(t, "bad_request", resp.Problem.Code)
	require.NoError(t, json.Unmarshal(b.invoke(t, []byte(`{"action":"query","scope_prefix":"idem:","created_from":"2026-01-01T00:00:00Z","created_to":"2027-01-01T00:00:00Z"}`)), &resp))
	require.Equal(t, 200, resp.Status)
}

// A JSON value of the wrong type is refused in JSON's terms: the answer
// names the field and the value expected, never the Go struct or type the
// function decodes into.
func TestAWrongJSONTypeIsSaidWithoutGoNames(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for _, tc := range []struct{ payload, detail string }{
		{`{"scoped_key": 12}`, "scoped_key: expected a string, got number"},
		{`{"action": "query", "scope_prefix": "idem:", "created_from": "2026-01-01T00:00:00Z", "created_to": "2027-01-01T00:00:00Z", "limit": "ten"}`, "limit: expected a whole number in range, in digits, got string"},
		{`{"action": "query", "scope_prefix": "idem:", "created_from": "2026-01-01T00:00:00Z", "created_to": "2027-01-01T00:00:00Z", "limit": 2.5}`, "limit: expected a whole number in range, in digits, got number 2.5"},
		{`{"action": "query", "scope_prefix": "idem:", "created_from": "2026-01-01T00:00:00Z", "created_to": "2027-01-01T00:00:00Z", "limit": 1e99}`, "limit: expected a whole number in range, in digits, got number 1e99"},
		{`["idem:v1:probe"]`, "the payload: expected an object, got array"},
	} {
		var resp struct {
			Status  int
			Problem problem
		}
		require.NoError(t, json.Unmarshal(b.invoke(t, []byte(tc.payload)), &resp))
		require.Equal(t, 400, resp.Status, tc.payload)
		require.Equal(t, "bad_request", resp.Problem.Code, tc.payload)
		require.Contains(t, resp.Problem.Detail, tc.detail)
		for _, internal := range []string{"Go ", "DirectRequest", "lookupapi", "int64", "events."} {
			require.NotContains(t, resp.Problem.Detail, internal, tc.payload)
		}
	}
	// API Gateway events with a field of the wrong type are answered in
	// their own shape (an answer without a statusCode would reach the
	// client as a 200).
	for event, detail := range map[string]string{
		`{"version":"2.0","rawPath":"/v1/archive/keys/idem:v1:probe","requestContext":{"http":{"method":"GET"}},"queryStringParameters":{"fingerprint":7}}`: "queryStringParameters: expected a string, got number",
		`{"httpMethod":"GET","path":"/v1/archive/keys/idem:v1:probe","queryStringParameters":{"fingerprint":7}}`:                                            "queryStringParameters: expected a string, got number",
		// Fields the first look at the event reads.
		`{"version":"2.0","rawPath":"/v1/archive/keys/idem:v1:probe","requestContext":{"domainName":7,"http":{"method":"GET"}}}`: "requestContext.domainName: expected a string, got number",
		`{"version":"2.0","rawPath":"/v1/archive/keys/idem:v1:probe","requestContext":"x"}`:                                      "requestContext: expected an object, got string",
		`{"httpMethod":7,"path":"/v1/archive/keys/idem:v1:probe"}`:                                                               "httpMethod: expected a string, got number",
	} {
		var resp struct {
			StatusCode int
			Body       string
		}
		require.NoError(t, json.Unmarshal(b.invoke(t, []byte(event)), &resp))
		require.Equal(t, 400, resp.StatusCode, event)
		var p problem
		require.NoError(t, json.Unmarshal([]byte(resp.Body), &p), "%q", resp.Body)
		require.Equal(t, "bad_request", p.Code)
		require.Contains(t, p.Detail, detail)
		require.NotContains(t, p.Detail, "Go ")
		require.NotContains(t, p.Detail, "events.")
	}
}
