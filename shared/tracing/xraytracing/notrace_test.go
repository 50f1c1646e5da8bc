//go:build notrace

package xraytracing

import (
	"context"
	"errors"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/stretchr/testify/require"

	"github.com/idemarchive/idemarchive/shared/tracing"
)

// Inside Lambda, with a sampled trace header, a notrace build only runs the
// function and returns its error, and leaves the AWS SDK uninstrumented.
func TestANotraceBuildOnlyRunsTheFunction(t *testing.T) {
	Install()
	t.Cleanup(func() { tracing.Install(nil) })
	t.Setenv("LAMBDA_TASK_ROOT", "/var/task")
	ctx := context.WithValue(context.Background(), "x-amzn-trace-id", "Root=1-5759e988-bd862e3fe1be46a994272793;Parent=53995c3f42cd8ad8;Sampled=1")
	want := errors.New("boom")
	calls := 0
	err := tracing.Span(ctx, "archive.lookup", func(got context.Context) error {
		calls++
		require.Equal(t, ctx, got, "the function gets the caller's context")
		return want
	})
	require.ErrorIs(t, err, want)
	require.Equal(t, 1, calls)

	cfg := aws.Config{}
	tracing.InstrumentAWS(&cfg)
	require.Empty(t, cfg.APIOptions)
}
