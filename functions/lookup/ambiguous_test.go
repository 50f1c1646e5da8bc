package main

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
)

// A key JSON cannot carry as written (a byte that is not UTF-8, an unpaired
// surrogate escape) is refused in every event shape. encoding/json reads
// either as U+FFFD, and the answer would be a definite 200 or 404 about
// another key: here the archive holds the key that U+FFFD makes, so a
// lossy read would answer 200 with its resource.
func TestKeysJSONCannotCarryAreRefusedNotAnsweredForAnother(t *testing.T) {
	t.Parallel()
	b := setup(t)
	_, err := b.db.Pool.Exec(context.Background(), `INSERT INTO idempotency_key_archive
		(scoped_key, fingerprint, status_code, resource_id, created_at, expired_at)
		VALUES ('idem:v1:`+"\uFFFD"+`', '\x00', 201, 'ch_fffd', now() - interval '30 hours', now() - interval '6 hours'),
		       ('idem:v1:`+"\U0001F600"+`', '\x00', 201, 'ch_pair', now() - interval '30 hours', now() - interval '6 hours')`)
	require.NoError(t, err)

	v2Query := func(key string) string {
		return `{"version":"2.0","rawPath":"/v1/archive/lookup","rawQueryString":"scoped_key=x","queryStringParameters":{"scoped_key":"` + key + `"},"requestContext":{"http":{"method":"GET"}}}`
	}
	rest := func(key string) string {
		return `{"httpMethod":"GET","path":"/v1/archive/lookup","queryStringParameters":{"scoped_key":"` + key + `"}}`
	}
	for name, payload := range map[string]string{
		"direct, lone high surrogate":     `{"scoped_key":"idem:v1:\ud800"}`,
		"direct, lone low surrogate":      `{"scoped_key":"idem:v1:\udfff"}`,
		"direct, high before a non-low":   `{"scoped_key":"idem:v1:\ud83d\u0041"}`,
		"direct, high at the end":         `{"scoped_key":"idem:v1:\ud83d"}`,
		"direct, byte 0xff":               "{\"scoped_key\":\"idem:v1:\xff\"}",
		"direct, truncated UTF-8":         "{\"scoped_key\":\"idem:v1:\xe2\x82\"}",
		"HTTP API 2.0, lone surrogate":    v2Query(`idem:v1:\udfff`),
		"HTTP API 2.0, byte 0xff in path": "{\"version\":\"2.0\",\"rawPath\":\"/v1/archive/keys/idem:v1:\xff\",\"requestContext\":{\"http\":{\"method\":\"GET\"}}}",
		"REST, lone surrogate":            rest(`idem:v1:\ud800`),
	} {
		out := b.invoke(t, []byte(payload))
		var d struct {
			Status, StatusCode int
			Body               string
			Problem            *struct{ Code, Detail string }
		}
		require.NoError(t, json.Unmarshal(out, &d), name)
		if d.Problem == nil {
			require.Equal(t, 400, d.StatusCode, "%s: %s", name, out)
			require.Contains(t, d.Body, `"code":"bad_request"`, name)
			require.Contains(t, d.Body, "UTF-8", name)
		} else {
			require.Equal(t, 400, d.Status, "%s: %s", name, out)
			require.Equal(t, "bad_request", d.Problem.Code, name)
			require.Contains(t, d.Problem.Detail, "surrogate", name)
		}
	}

	// A surrogate pair is one character, and U+FFFD written as itself or
	// escaped is a key like any other: both are still found.
	for _, payload := range []string{`{"scoped_key":"idem:v1:\ud83d\ude00"}`, `{"scoped_key":"idem:v1:\uFFFD"}`, `{"scoped_key":"idem:v1:` + "\uFFFD" + `"}`, `{"scoped_key":"idem:v1:\\ud800"}`} {
		var d struct {
			Status int
			Record *struct {
				ResourceID string `json:"resource_id"`
			}
		}
		require.NoError(t, json.Unmarshal(b.invoke(t, []byte(payload)), &d), payload)
		if payload == `{"scoped_key":"idem:v1:\\ud800"}` {
			// An escaped backslash: the key is the six characters "\ud800".
			require.Equal(t, 404, d.Status, payload)
			continue
		}
		require.Equal(t, 200, d.Status, payload)
		require.NotNil(t, d.Record, payload)
	}
	var d struct{ StatusCode int }
	require.NoError(t, json.Unmarshal(b.invoke(t, []byte(v2Query(`idem:v1:\ud83d\ude00`))), &d))
	require.Equal(t, 200, d.StatusCode)
}

// A direct payload that names a member twice, or in another letter case,
// is refused: encoding/json keeps the last one, and would answer a
// definite 404 about a key (or run an action) the caller did not mean.
func TestDirectMembersGivenTwiceOrInAnotherCaseAreRefused(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for payload, want := range map[string]string{
		`{"scoped_key":"idem:v1:probe","scoped_key":"idem:v1:never-used"}`: `"scoped_key" and "scoped_key" name the same member`,
		`{"scoped_key":"idem:v1:probe","SCOPED_KEY":"idem:v1:never-used"}`: `"scoped_key" and "SCOPED_KEY" name the same member`,
		`{"Scoped_Key":"idem:v1:probe"}`:                                   `member "Scoped_Key" is spelt "scoped_key"`,
		`{"action":"query","action":"lookup","scoped_key":"idem:v1:k"}`:    `"action" and "action" name the same member`,
		`{"scoped_key":"idem:v1:k"} {"scoped_key":"idem:v1:j"}`:            `malformed request`,
	} {
		var d struct {
			Status  int
			Problem *struct{ Code, Detail string }
		}
		out := b.invoke(t, []byte(payload))
		require.NoError(t, json.Unmarshal(out, &d), payload)
		require.Equal(t, 400, d.Status, "%s: %s", payload, out)
		require.Equal(t, "bad_request", d.Problem.Code)
		require.Contains(t, d.Problem.Detail, want, payload)
	}
}

// An event of payload version 2.0, or with a rawPath and no httpMethod, is
// answered as an HTTP API event (with a statusCode) even when its rawPath is
// empty (a 404 route_not_found then): answered in the direct shape, API Gateway would pass the problem on
// as a 200.
func TestVersion2EventsAreAnsweredWithAStatusCode(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for _, payload := range []string{
		`{"version":"2.0","rawPath":"","requestContext":{"http":{"method":"GET","path":"/v1/archive/keys/idem:v1:probe"}}}`,
		`{"version":"2.0","requestContext":{"http":{"method":"GET"}}}`,
		`{"rawPath":"/v1/archive/keys/idem:v1:probe","requestContext":{"http":{"method":"GET"}}}`,
	} {
		var d struct {
			StatusCode int
			Body       string
		}
		out := b.invoke(t, []byte(payload))
		require.NoError(t, json.Unmarshal(out, &d), payload)
		require.NotZero(t, d.StatusCode, "%s: %s", payload, out)
		require.NotEmpty(t, d.Body, payload)
	}
}

// Only the members that carry the key are held to it: a header or cookie
// with a byte that is not UTF-8 (a client may send Latin-1, and an event may
// carry it) does not fail the lookup of an archived key.
func TestOddBytesOutsideTheKeyDoNotFailALookup(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for name, payload := range map[string]string{
		"HTTP API 2.0": "{\"version\":\"2.0\",\"rawPath\":\"/v1/archive/keys/idem:v1:probe\",\"headers\":{\"user-agent\":\"caf\xe9\"},\"cookies\":[\"a=\\ud800\"],\"requestContext\":{\"http\":{\"method\":\"GET\"}}}",
		"REST":         "{\"httpMethod\":\"GET\",\"path\":\"/v1/archive/keys/idem:v1:probe\",\"headers\":{\"User-Agent\":\"caf\xe9\"},\"body\":\"\\udfff\"}",
	} {
		var d struct{ StatusCode int }
		out := b.invoke(t, []byte(payload))
		require.NoError(t, json.Unmarshal(out, &d), name)
		require.Equal(t, 200, d.StatusCode, "%s: %s", name, out)
	}
}

// An event that gives a member twice, in the same spelling or in two that
// encoding/json reads as one, is refused: it would answer for the last.
// API Gateway never sends one; a hand-made lambda:Invoke may.
func TestEventMembersGivenTwiceAreRefused(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for name, payload := range map[string]string{
		"REST, a query parameter twice":  `{"httpMethod":"GET","path":"/v1/archive/lookup","queryStringParameters":{"scoped_key":"idem:v1:probe","scoped_key":"idem:v1:other"}}`,
		"HTTP API 2.0, query twice":      `{"version":"2.0","rawPath":"/v1/archive/lookup","rawQueryString":"scoped_key=x","queryStringParameters":{"scoped_key":"idem:v1:probe","scoped_key":"idem:v1:other"},"requestContext":{"http":{"method":"GET"}}}`,
		"HTTP API 2.0, rawPath in cases": `{"version":"2.0","rawPath":"/v1/archive/keys/idem:v1:probe","RAWPATH":"/v1/archive/keys/idem:v1:other","requestContext":{"http":{"method":"GET"}}}`,
		"REST, path twice":               `{"httpMethod":"GET","path":"/v1/archive/keys/idem:v1:probe","path":"/v1/archive/keys/idem:v1:other"}`,
	} {
		var d struct {
			StatusCode int
			Body       string
		}
		out := b.invoke(t, []byte(payload))
		require.NoError(t, json.Unmarshal(out, &d), name)
		require.Equal(t, 400, d.StatusCode, "%s: %s", name, out)
		require.Contains(t, d.Body, "name the same member", name)
	}
}

// requestContext's domainName decides whether rawPath is percent-decoded
// once more (a function URL) or read as it is (an HTTP API), and its elb
// whether the event is refused (an ALB's query is still encoded): given
// twice, or in another letter case, the last would decide, and one event
// would be answered about one of two keys. Both orders are refused alike.
func TestRequestContextMembersGivenTwiceAreRefused(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const furl = "abcdefghij0123456789klmnop.lambda-url.eu-west-1.on.aws"
	const api = "abc123.execute-api.eu-west-1.amazonaws.com"
	v2 := func(firstName, first, secondName, second string) string {
		return fmt.Sprintf(`{"version":"2.0","rawPath":"/v1/archive/keys/idem%%3Av1%%3Aprobe","rawQueryString":"",`+
			`"requestContext":{%q:%q,%q:%q,"http":{"method":"GET"}}}`, firstName, first, secondName, second)
	}
	for name, payload := range map[string]string{
		"function URL, then HTTP API":            v2("domainName", furl, "domainName", api),
		"HTTP API, then function URL":            v2("domainName", api, "domainName", furl),
		"function URL, then DOMAINNAME HTTP API": v2("domainName", furl, "DOMAINNAME", api),
		"HTTP API, then DomainName function URL": v2("domainName", api, "DomainName", furl),
		"ALB, then elb null": `{"httpMethod":"GET","path":"/v1/archive/lookup","queryStringParameters":{"scoped_key":"idem%3Av1%3Aprobe"},` +
			`"requestContext":{"elb":{"targetGroupArn":"arn:aws:elasticloadbalancing:eu-west-1:123456789012:targetgroup/lookup/abc"},"elb":null}}`,
		"http method twice": `{"version":"2.0","rawPath":"/v1/archive/keys/idem:v1:probe","requestContext":{"http":{"method":"GET","METHOD":"DELETE"}}}`,
	} {
		var d struct {
			StatusCode int
			Body       string
		}
		out := b.invoke(t, []byte(payload))
		require.NoError(t, json.Unmarshal(out, &d), name)
		require.Equal(t, 400, d.StatusCode, "%s: %s", name, out)
		require.Contains(t, d.Body, "name the same member", name)
	}
}

// A path parameter that names another key than the path is refused: the
// answer would be about the path's key, and which one the caller meant is
// unknown. One that names the path's key, decoded or as the path carries
// it, is answered.
func TestAPathParameterThatNamesAnotherKeyIsRefused(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for name, c := range map[string]struct {
		payload string
		status  int
	}{
		"REST, another key":        {`{"httpMethod":"GET","path":"/v1/archive/keys/idem%3Av1%3Aprobe","pathParameters":{"key":"idem:v1:someone-else"}}`, 400},
		"HTTP API, another key":    {`{"version":"2.0","rawPath":"/v1/archive/keys/idem:v1:probe","pathParameters":{"key":"idem:v1:someone-else"},"requestContext":{"http":{"method":"GET"}}}`, 400},
		"REST, decoded":            {`{"httpMethod":"GET","path":"/v1/archive/keys/idem%3Av1%3Aprobe","pathParameters":{"key":"idem:v1:probe"}}`, 200},
		"REST, as the path has it": {`{"httpMethod":"GET","path":"/v1/archive/keys/idem%3Av1%3Aprobe","pathParameters":{"key":"idem%3Av1%3Aprobe"}}`, 200},
		"REST, stage in the path":  {`{"httpMethod":"GET","path":"/prod/v1/archive/keys/idem%3Av1%3Aprobe","pathParameters":{"key":"idem:v1:probe"}}`, 200},
		"HTTP API, the same key":   {`{"version":"2.0","rawPath":"/v1/archive/keys/idem:v1:probe","pathParameters":{"key":"idem:v1:probe"},"requestContext":{"http":{"method":"GET"}}}`, 200},
		// The answer is about the decoded path's key, idem:v1:probe/v1/archive/keys/idem:v1:b:
		// a parameter that names the raw path's later key does not agree.
		"REST, the route encoded":       {`{"httpMethod":"GET","path":"/v1%2Farchive%2Fkeys%2Fidem:v1:probe/v1/archive/keys/idem:v1:b","pathParameters":{"key":"idem:v1:b"}}`, 400},
		"function URL, another key":     {`{"version":"2.0","rawPath":"/v1/archive/keys/idem%3Av1%3Aprobe","pathParameters":{"key":"idem:v1:other"},"requestContext":{"domainName":"abcdefghij0123456789klmnop.lambda-url.eu-west-1.on.aws","http":{"method":"GET"}}}`, 400},
		"function URL, the same key":    {`{"version":"2.0","rawPath":"/v1/archive/keys/idem%3Av1%3Aprobe","pathParameters":{"key":"idem:v1:probe"},"requestContext":{"domainName":"abcdefghij0123456789klmnop.lambda-url.eu-west-1.on.aws","http":{"method":"GET"}}}`, 200},
		"REST, key on the lookup route": {`{"httpMethod":"GET","path":"/v1/archive/lookup","queryStringParameters":{"scoped_key":"idem:v1:probe"},"pathParameters":{"key":"idem:v1:other"}}`, 400},
	} {
		var d struct {
			StatusCode int
			Body       string
		}
		out := b.invoke(t, []byte(c.payload))
		require.NoError(t, json.Unmarshal(out, &d), name)
		require.Equal(t, c.status, d.StatusCode, "%s: %s", name, out)
		if c.status == 400 {
			require.Contains(t, d.Body, "does not name the key in the path", name)
		} else {
			require.Contains(t, d.Body, "ch_probe", name)
		}
	}
}
