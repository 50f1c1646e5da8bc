// Package tracing wraps units of work in spans of whichever tracer the
// process installed. The library packages (archive, sweep, partition) call
// Span; they link no tracer of their own.
//
// The Lambda functions install X-Ray (package xraytracing) when they start.
// Every other process links no X-Ray code and Span only calls the function:
// a payment API behind the idempotency middleware, the CLI, tests. That
// matters beyond size: the X-Ray SDK reads AWS_XRAY_DAEMON_ADDRESS when its
// package initializes and panics, before main, on an address it cannot
// parse or resolve (a sidecar's name not yet in DNS, an IPv6 address). A
// service that never traces must not be stopped by it.
//
//	err := tracing.Span(ctx, "sweep.batch", func(ctx context.Context) error { ... })
package tracing

import (
	"context"
	"sync/atomic"

	"github.com/aws/aws-sdk-go-v2/aws"
)

// A Tracer records spans and instruments AWS SDK clients. Its methods must
// return fn's error unchanged and let fn's panic through with its value.
type Tracer interface {
	// Span runs fn inside a span called name, recording its error.
	Span(ctx context.Context, name string, fn func(context.Context) error) error
	// InstrumentAWS adds spans around every AWS SDK call made with cfg.
	InstrumentAWS(cfg *aws.Config)
}

// installed holds a *Tracer; nil until Install.
var installed atomic.Pointer[Tracer]

// Install makes t the process's tracer; a nil t removes it. Call it once at
// start, before any span: a span already running keeps the tracer it began
// with.
func Install(t Tracer) {
	if t == nil {
		installed.Store(nil)
		return
	}
	installed.Store(&t)
}

// Span runs fn inside a span called name of the installed tracer, or just
// runs fn when none is installed.
func Span(ctx context.Context, name string, fn func(context.Context) error) error {
	if t := installed.Load(); t != nil {
		return (*t).Span(ctx, name, fn)
	}
	return fn(ctx)
}

// InstrumentAWS has the installed tracer instrument cfg; with none it leaves
// cfg untouched.
func InstrumentAWS(cfg *aws.Config) {
	if t := installed.Load(); t != nil {
		(*t).InstrumentAWS(cfg)
	}
}
