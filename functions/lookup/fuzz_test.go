package main

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/idemarchive/idemarchive/shared/archive"
	"github.com/idemarchive/idemarchive/shared/lookupapi"
	"github.com/idemarchive/idemarchive/shared/testenv"
)

// notFound is an archive that holds nothing: the fuzz test is about decoding
// and routing, before any query.
type notFound struct{}

func (notFound) Lookup(context.Context, string, []byte) (archive.Record, error) {
	return archive.Record{}, archive.ErrNotFound
}

func (notFound) Investigate(context.Context, archive.Query) (archive.Page, error) {
	return archive.Page{Records: []archive.Record{}}, nil
}

// Any payload, in any of the three event shapes or none, is answered with
// JSON carrying a status from 200 to 599, never a panic or a runtime error.
func FuzzEventShapes(f *testing.F) {
	for _, name := range []string{"lookup-http-api-v2.json", "lookup-rest-v1.json", "lookup-direct.json"} {
		f.Add(testenv.Event(f, name))
	}
	f.Add([]byte(`{"version":"2.0","rawPath":"/v1/archive/keys/idem:v1:a\u0000b","requestContext":{"http":{"method":"GET"}}}`))
	f.Add([]byte(`{"httpMethod":"GET","path":"/v1/archive/keys/%zz"}`))
	f.Add([]byte(`{"action":"query","scope_prefix":"idem:","created_from":"x"}`))
	f.Add([]byte(`[1,2]`))
	env, _, _ := testenv.FunctionEnv(f, nil, map[string]string{"DATABASE_URL": "postgres://u@127.0.0.1:1/x"})
	h := &handler{env: env, api: lookupapi.New(notFound{}, env.Logger)}
	f.Fuzz(func(t *testing.T, payload []byte) {
		out, err := h.Invoke(testenv.Invocation("req-fuzz"), payload)
		if err != nil {
			t.Fatalf("runtime error for %q: %v", payload, err)
		}
		var shape struct {
			StatusCode int `json:"statusCode"`
			Status     int `json:"status"`
		}
		if err := json.Unmarshal(out, &shape); err != nil {
			t.Fatalf("answer is not JSON: %q", out)
		}
		status := max(shape.StatusCode, shape.Status)
		if status < 200 || status > 599 {
			t.Fatalf("answer without a status for %q: %s", payload, out)
		}
	})
}
