package tracing

import (
	"context"
	"errors"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-xray-sdk-go/xray"
)

func TestOutsideLambdaSpanOnlyRunsTheFunction(t *testing.T) {
	t.Setenv(xray.LambdaTaskRootKey, "")
	want := errors.New("boom")
	called := false
	err := Span(context.Background(), "x", func(ctx context.Context) error {
		called = true
		if xray.GetSegment(ctx) != nil {
			t.Error("a segment was started outside Lambda")
		}
		return want
	})
	if !called || !errors.Is(err, want) {
		t.Fatalf("called=%v err=%v", called, err)
	}
	var cfg aws.Config
	InstrumentAWS(&cfg)
	if len(cfg.APIOptions) != 0 {
		t.Fatal("AWS SDK instrumented outside Lambda")
	}
}

func TestInsideLambdaSpanRecordsASubsegment(t *testing.T) {
	t.Setenv(xray.LambdaTaskRootKey, "/var/task")
	t.Setenv("AWS_XRAY_DAEMON_ADDRESS", "127.0.0.1:2000") // UDP: nothing needs to listen
	ctx := context.WithValue(context.Background(), xray.LambdaTraceHeaderKey, "Root=1-5759e988-bd862e3fe1be46a994272793;Parent=53995c3f42cd8ad8;Sampled=1")
	want := errors.New("boom")
	var seg *xray.Segment
	err := Span(ctx, "sweep.batch", func(ctx context.Context) error {
		seg = xray.GetSegment(ctx)
		return want
	})
	if !errors.Is(err, want) {
		t.Fatalf("err = %v", err)
	}
	if seg == nil || seg.Name != "sweep.batch" {
		t.Fatalf("no subsegment named sweep.batch: %+v", seg)
	}
	// A Lambda invocation without a trace header is left alone.
	if err := Span(context.Background(), "x", func(ctx context.Context) error {
		if xray.GetSegment(ctx) != nil {
			t.Error("segment without a trace header")
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	var cfg aws.Config
	InstrumentAWS(&cfg)
	if len(cfg.APIOptions) == 0 {
		t.Fatal("AWS SDK not instrumented in Lambda")
	}
}
