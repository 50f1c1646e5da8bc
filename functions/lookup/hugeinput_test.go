package main

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// A problem's detail that echoes the client's input (an unknown field's
// name) is bounded: a 1 MB name of '<', which JSON writes in six bytes
// each, made a 6 MB answer, past what Lambda returns from a synchronous
// invocation, so the caller got a function error instead of a 400.
func TestAHugeUnknownFieldIsABoundedBadRequest(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for _, payload := range []string{
		`{"` + strings.Repeat("<", 1<<20) + `":1}`,
		`{"scoped_key":"idem:v1:probe","` + strings.Repeat("é", 1<<19) + `":1}`,
	} {
		out := b.invoke(t, []byte(payload))
		require.Less(t, len(out), 8<<10, "a %d-byte payload was answered with %d bytes", len(payload), len(out))
		var resp struct {
			Status  int
			Problem problem
		}
		require.NoError(t, json.Unmarshal(out, &resp))
		require.Equal(t, 400, resp.Status)
		require.Equal(t, "bad_request", resp.Problem.Code)
		require.Contains(t, resp.Problem.Detail, "unknown field")
	}
}
