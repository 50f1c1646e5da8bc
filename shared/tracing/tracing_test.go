package tracing

import (
	"context"
	"errors"
	"os/exec"
	"slices"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/stretchr/testify/require"
)

// recorder is a Tracer that records what it was asked to do.
type recorder struct{ spans, instrumented *[]string }

func (r recorder) Span(ctx context.Context, name string, fn func(context.Context) error) error {
	*r.spans = append(*r.spans, name)
	return fn(ctx)
}

func (r recorder) InstrumentAWS(cfg *aws.Config) {
	*r.instrumented = append(*r.instrumented, cfg.Region)
}

// runSpan calls Span with a function that checks its context and fails.
func runSpan(t *testing.T, name string) (calls int, err error) {
	t.Helper()
	type key struct{}
	ctx := context.WithValue(context.Background(), key{}, "caller's")
	want := errors.New("boom")
	err = Span(ctx, name, func(got context.Context) error {
		calls++
		require.Equal(t, "caller's", got.Value(key{}), "the function gets the caller's context")
		return want
	})
	require.ErrorIs(t, err, want, "the function's error comes back unchanged")
	return calls, err
}

func TestWithNoTracerSpanOnlyRunsTheFunction(t *testing.T) {
	Install(nil)
	calls, _ := runSpan(t, "sweep.batch")
	require.Equal(t, 1, calls)
	cfg := aws.Config{Region: "eu-west-1"}
	InstrumentAWS(&cfg)
	require.Empty(t, cfg.APIOptions, "an AWS configuration was instrumented with no tracer")

	var p any
	func() {
		defer func() { p = recover() }()
		_ = Span(context.Background(), "x", func(context.Context) error { panic("the function's own") })
	}()
	require.Equal(t, "the function's own", p, "a panic keeps its value")
}

func TestAnInstalledTracerGetsEverySpanUntilRemoved(t *testing.T) {
	var spans, instrumented []string
	Install(recorder{&spans, &instrumented})
	t.Cleanup(func() { Install(nil) })

	calls, _ := runSpan(t, "archive.lookup")
	require.Equal(t, 1, calls)
	cfg := aws.Config{Region: "eu-west-1"}
	InstrumentAWS(&cfg)
	require.Equal(t, []string{"archive.lookup"}, spans)
	require.Equal(t, []string{"eu-west-1"}, instrumented)

	Install(nil)
	calls, _ = runSpan(t, "sweep.batch")
	require.Equal(t, 1, calls)
	InstrumentAWS(&cfg)
	require.Equal(t, []string{"archive.lookup"}, spans, "a removed tracer still got a span")
	require.Equal(t, []string{"eu-west-1"}, instrumented, "a removed tracer still instrumented")
}

// The X-Ray SDK panics before main, with a stack trace, when
// AWS_XRAY_DAEMON_ADDRESS cannot be parsed or resolved at start (an ECS
// sidecar's name, an IPv6 address). A payment API behind the idempotency
// middleware never traces, so nothing it links may import the SDK; only
// the Lambda functions do (through fnenv, which the last case shows is
// still true, so that this test cannot pass by listing nothing).
func TestOnlyTheFunctionsLinkXRay(t *testing.T) {
	goTool, err := exec.LookPath("go")
	require.NoError(t, err, "this test lists packages with the go command, which is not on PATH")
	linksXRay := func(pkg string) bool {
		out, err := exec.Command(goTool, "list", "-deps", "-tags", "lambda.norpc", pkg).CombinedOutput()
		require.NoError(t, err, "go list %s: %s", pkg, out)
		// The xray package is the one whose initialization reads the
		// address (daemoncfg, which lambdalocal uses to check it, is not).
		return slices.Contains(strings.Fields(string(out)), "github.com/aws/aws-xray-sdk-go/v2/xray")
	}
	const mod = "github.com/idemarchive/idemarchive/"
	for _, pkg := range []string{
		"shared/idempotency", "shared/archive", "shared/archiveclient", "shared/livestore",
		"shared/sweep", "shared/partition", "shared/lookupapi",
		"examples/charges", "cmd/archivectl", "cmd/lambdalocal",
	} {
		require.False(t, linksXRay(mod+pkg), "%s links the X-Ray SDK: a bad AWS_XRAY_DAEMON_ADDRESS would stop it before main", pkg)
	}
	require.True(t, linksXRay(mod+"functions/lookup"), "the lookup function no longer links X-Ray")
}
