package main

import (
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"net/url"
	"testing"

	"github.com/aws/aws-lambda-go/events"

	"github.com/idemarchive/idemarchive/shared/archive"
	"github.com/idemarchive/idemarchive/shared/lookupapi"
	"github.com/idemarchive/idemarchive/shared/testenv"
)

// asked is an archive that holds nothing and records what it was asked
// for: the fuzz test is about decoding and routing, before any query.
type asked struct {
	keys []string
	fps  [][]byte
}

func (a *asked) Lookup(_ context.Context, key string, fp []byte) (archive.Record, error) {
	a.keys = append(a.keys, key)
	a.fps = append(a.fps, fp)
	return archive.Record{}, archive.ErrNotFound
}

func (*asked) Investigate(context.Context, archive.Query) (archive.Page, error) {
	return archive.Page{Records: []archive.Record{}}, nil
}

// answer is the status of any of the handler's answers.
type answer struct {
	StatusCode int `json:"statusCode"`
	Status     int `json:"status"`
}

// Any payload, in any of the three event shapes or none, is answered with
// JSON carrying a status from 200 to 599, never a panic or a runtime error.
// And any key (one JSON can carry) with any fingerprint reaches the archive
// as exactly that key and fingerprint through every route: an HTTP API
// (payload 2.0, path decoded) on /keys/{key} and on /lookup?scoped_key=, a
// REST API (path encoded), a function URL (path as the client sent it) and
// a direct invocation; each asks the archive once and answers its 404.
func FuzzEventShapes(f *testing.F) {
	for _, name := range []string{"lookup-http-api-v2.json", "lookup-rest-v1.json", "lookup-direct.json"} {
		f.Add(testenv.Event(f, name), "idem:v1:probe", []byte{0})
	}
	f.Add([]byte(`{"version":"2.0","rawPath":"/v1/archive/keys/idem:v1:a\u0000b","requestContext":{"http":{"method":"GET"}}}`), "idem:v1:a\x00b", []byte{})
	f.Add([]byte(`{"httpMethod":"GET","path":"/v1/archive/keys/%zz"}`), "idem:v1:50%25 off+a b/c?d#e&f=g", []byte("0123456789abcdef0123456789abcdef"))
	f.Add([]byte(`{"action":"query","scope_prefix":"idem:","created_from":"x"}`), "idem:v1:t=acme:01ARZ3NDEKTSV4RRFFQ69G5FAV", []byte{0xff, 0})
	f.Add([]byte(`[1,2]`), "idem:v1:é;,/..%2F", []byte{})
	env, _, _ := testenv.FunctionEnv(f, nil, map[string]string{"DATABASE_URL": "postgres://u@127.0.0.1:1/x"})
	f.Fuzz(func(t *testing.T, payload []byte, key string, fp []byte) {
		rec := new(asked)
		h := &handler{env: env, api: lookupapi.New(rec, env.Logger)}
		invoke := func(payload []byte) answer {
			t.Helper()
			out, err := h.Invoke(testenv.Invocation("req-fuzz"), payload)
			if err != nil {
				t.Fatalf("runtime error for %q: %v", payload, err)
			}
			var a answer
			if err := json.Unmarshal(out, &a); err != nil {
				t.Fatalf("answer is not JSON: %q", out)
			}
			if status := max(a.StatusCode, a.Status); status < 200 || status > 599 {
				t.Fatalf("answer without a status for %q: %s", payload, out)
			}
			return a
		}
		invoke(payload)

		// A key JSON cannot carry (invalid UTF-8) has no direct route,
		// and an empty one no path; a fingerprint is at most 64 bytes.
		if archive.ValidateKey(key) != nil {
			return // refused before the archive is asked (TestBadInputIsA4xxProblem)
		}
		fp = fp[:min(len(fp), 64)]
		fpHex := hex.EncodeToString(fp)
		query := map[string]string{}
		if fpHex != "" {
			query["fingerprint"] = fpHex
		}
		withKey := map[string]string{"scoped_key": key}
		if fpHex != "" {
			withKey["fingerprint"] = fpHex
		}
		fnURL := events.APIGatewayV2HTTPRequest{Version: "2.0", RawPath: "/v1/archive/keys/" + url.PathEscape(key), QueryStringParameters: query}
		fnURL.RequestContext.HTTP.Method = "GET"
		fnURL.RequestContext.DomainName = "abcdefghij0123456789klmnop.lambda-url.eu-west-1.on.aws"
		fnURLEvent, _ := json.Marshal(fnURL)
		direct, _ := json.Marshal(map[string]string{"scoped_key": key, "fingerprint": fpHex})
		routes := []struct {
			name  string
			event []byte
		}{
			{"HTTP API /keys/{key}", v2("GET", "/v1/archive/keys/"+key, query)},
			{"HTTP API /lookup", v2("GET", "/v1/archive/lookup", withKey)},
			{"REST API", v1("GET", "/v1/archive/keys/"+url.PathEscape(key), query)},
			{"function URL", fnURLEvent},
			{"direct invocation", direct},
		}
		for _, r := range routes {
			rec.keys, rec.fps = nil, nil
			a := invoke(r.event)
			if len(rec.keys) != 1 {
				t.Fatalf("%s: the archive was asked %d times for key %q: %v (answer %+v)", r.name, len(rec.keys), key, rec.keys, a)
			}
			if rec.keys[0] != key || !bytes.Equal(rec.fps[0], fp) {
				t.Fatalf("%s: the archive was asked for %q (fingerprint %x); the client asked for %q (fingerprint %x)", r.name, rec.keys[0], rec.fps[0], key, fp)
			}
			if status := max(a.StatusCode, a.Status); status != 404 {
				t.Fatalf("%s: key %q answered %d, want the archive's 404", r.name, key, status)
			}
		}
	})
}
