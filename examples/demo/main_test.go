package main

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// The demo reports a failure and returns false (exit 1) when a step cannot
// hold; the passing run is exercised by `make demo`, which make test runs.
func TestDemoReportsFailure(t *testing.T) {
	t.Parallel()
	var out bytes.Buffer
	d := &demo{paths: paths{bin: t.TempDir(), rie: "/nonexistent", events: "../../events"}, ttl: time.Second, out: &out,
		dbURL: "postgres://nobody@127.0.0.1:1/none?connect_timeout=1"}
	require.False(t, d.run(context.Background()))
	require.Contains(t, out.String(), "FAIL  migrate the schema")
	require.Contains(t, out.String(), "1 of 1 checks failed.")
}
