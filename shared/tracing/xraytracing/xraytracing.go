//go:build !notrace

// Package xraytracing is the AWS X-Ray tracer of the Lambda functions, and
// the only package that imports the X-Ray SDK: that SDK reaches end of
// support on 2027-02-25, and swapping it for OpenTelemetry must touch this
// package alone. fnenv installs it; nothing else should link it (package
// tracing says why).
//
// Tracing is active only inside Lambda (LAMBDA_TASK_ROOT is set) for an
// invocation that carries a trace header. Everywhere else Span just calls
// the function: no X-Ray call, no log line, no UDP packet.
//
// Built with the notrace tag (make build TRACING=off), the package links no
// X-Ray code at all and Install installs nothing (notrace.go): the X-Ray
// SDK's xray package brings grpc and protobuf along, about a third of the
// lookup function's binary (BENCHMARKS.md).
package xraytracing

import (
	"context"
	"os"
	"strings"
	"sync"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-xray-sdk-go/v2/instrumentation/awsv2"
	"github.com/aws/aws-xray-sdk-go/v2/strategy/ctxmissing"
	"github.com/aws/aws-xray-sdk-go/v2/xray"
	"github.com/aws/aws-xray-sdk-go/v2/xraylog"

	"github.com/idemarchive/idemarchive/shared/tracing"
)

// Install makes X-Ray the process's tracer.
func Install() { tracing.Install(Tracer{}) }

// Tracer records X-Ray subsegments inside Lambda.
type Tracer struct{}

var configureOnce sync.Once

// inLambda reports whether the process runs as a Lambda function.
func inLambda() bool { return os.Getenv(xray.LambdaTaskRootKey) != "" }

func configure() {
	configureOnce.Do(func() {
		// A missing segment must never fail or log on a request path. The
		// logger comes first: Configure itself logs at info level.
		xray.SetLogger(xraylog.NewDefaultLogger(os.Stderr, xraylog.LogLevelError))
		_ = xray.Configure(xray.Config{ContextMissingStrategy: ctxmissing.NewDefaultIgnoreErrorStrategy()})
	})
}

// active reports whether ctx belongs to a traced Lambda invocation. With
// AWS_XRAY_SDK_DISABLED=true nothing is: the SDK then hands out empty
// segments, and a panic inside xray.Capture became a nil dereference in
// its own recovery, losing the panic's value.
func active(ctx context.Context) bool {
	if !inLambda() || xray.SdkDisabled() {
		return false
	}
	h, _ := ctx.Value(xray.LambdaTraceHeaderKey).(string)
	return strings.Contains(h, "Root=")
}

// Span runs fn inside a subsegment called name, recording its error.
func (Tracer) Span(ctx context.Context, name string, fn func(context.Context) error) error {
	if !active(ctx) {
		return fn(ctx)
	}
	configure()
	return xray.Capture(ctx, name, fn)
}

// InstrumentAWS adds X-Ray subsegments around every AWS SDK call made with
// cfg. Outside Lambda it leaves cfg untouched.
func (Tracer) InstrumentAWS(cfg *aws.Config) {
	if !inLambda() {
		return
	}
	configure()
	awsv2.AWSV2Instrumentor(&cfg.APIOptions)
}
