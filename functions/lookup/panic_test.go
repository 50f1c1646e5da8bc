package main

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemarchive/idemarchive/shared/archive"
	"github.com/idemarchive/idemarchive/shared/lookupapi"
	"github.com/idemarchive/idemarchive/shared/testenv"
)

// panicking is an archive that panics.
type panicking struct{}

func (panicking) Lookup(context.Context, string, []byte) (archive.Record, error) {
	panic("secret internals: SELECT * FROM idempotency_key_archive")
}

func (panicking) Investigate(context.Context, archive.Query) (archive.Page, error) {
	panic("secret internals")
}

// A panic inside the lookup is answered as any internal error, a 500 in
// the event's shape that names nothing internal; the stack goes to the log
// alone (left to aws-lambda-go, the invoker got the stack trace, and the
// process ended).
func TestAPanicIsAnsweredAsA500NamingNothing(t *testing.T) {
	t.Parallel()
	env, _, logs := testenv.FunctionEnv(t, nil, map[string]string{"DATABASE_URL": "postgres://u@127.0.0.1:1/x"})
	h := &handler{env: env, api: lookupapi.New(panicking{}, env.Logger)}
	for _, name := range []string{"lookup-http-api-v2.json", "lookup-rest-v1.json", "lookup-direct.json"} {
		out, err := h.Invoke(testenv.Invocation("req-panic"), testenv.Event(t, name))
		require.NoError(t, err, name)
		var a answer
		require.NoError(t, json.Unmarshal(out, &a), name)
		require.Equal(t, 500, max(a.StatusCode, a.Status), "%s: %s", name, out)
		require.NotContains(t, string(out), "secret", name)
		require.NotContains(t, string(out), "goroutine", name)
	}
	require.Contains(t, logs.String(), "the function panicked")
	require.Contains(t, logs.String(), "goroutine")
}
