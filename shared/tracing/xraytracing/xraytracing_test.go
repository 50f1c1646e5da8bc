//go:build !notrace

package xraytracing

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/secretsmanager"
	"github.com/aws/aws-xray-sdk-go/v2/xray"
	"github.com/stretchr/testify/require"

	"github.com/idemarchive/idemarchive/shared/tracing"
)

const (
	traceRoot   = "1-5759e988-bd862e3fe1be46a994272793"
	traceParent = "53995c3f42cd8ad8"
	traceHeader = "Root=" + traceRoot + ";Parent=" + traceParent + ";Sampled=1"
)

// secretsServer answers GetSecretValue and records the X-Ray header of every
// request it receives.
func secretsServer(t *testing.T) (url string, traceHeaders func() []string) {
	t.Helper()
	var mu sync.Mutex
	var seen []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen = append(seen, r.Header.Get("X-Amzn-Trace-Id"))
		mu.Unlock()
		w.Header().Set("Content-Type", "application/x-amz-json-1.1")
		_, _ = w.Write([]byte(`{"SecretString":"s"}`))
	}))
	t.Cleanup(srv.Close)
	return srv.URL, func() []string {
		mu.Lock()
		defer mu.Unlock()
		return append([]string(nil), seen...)
	}
}

func getSecret(ctx context.Context, cfg aws.Config, url string) error {
	client := secretsmanager.NewFromConfig(cfg, func(o *secretsmanager.Options) { o.BaseEndpoint = aws.String(url) })
	_, err := client.GetSecretValue(ctx, &secretsmanager.GetSecretValueInput{SecretId: aws.String("arn")})
	return err
}

func testConfig() aws.Config {
	return aws.Config{
		Region:      "eu-west-1",
		Credentials: credentials.NewStaticCredentialsProvider("AKID", "SECRET", ""),
	}
}

func TestOutsideLambdaSpanOnlyRunsTheFunction(t *testing.T) {
	t.Setenv(xray.LambdaTaskRootKey, "")
	want := errors.New("boom")
	called := false
	// Even with a trace header in the context, nothing is traced outside Lambda.
	ctx := context.WithValue(context.Background(), xray.LambdaTraceHeaderKey, traceHeader)
	err := tracing.Span(ctx, "x", func(ctx context.Context) error {
		called = true
		require.Nil(t, xray.GetSegment(ctx), "a segment was started outside Lambda")
		return want
	})
	require.True(t, called)
	require.ErrorIs(t, err, want)

	cfg := testConfig()
	tracing.InstrumentAWS(&cfg)
	require.Empty(t, cfg.APIOptions, "AWS SDK instrumented outside Lambda")
	url, headers := secretsServer(t)
	require.NoError(t, getSecret(ctx, cfg, url))
	require.Equal(t, []string{""}, headers(), "an X-Ray header was sent outside Lambda")
}

// daemon listens where the SDK sends its UDP documents and returns the
// decoded documents it receives.
func daemon(t *testing.T) (addr string, next func() map[string]any) {
	t.Helper()
	conn, err := net.ListenPacket("udp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close() })
	return conn.LocalAddr().String(), func() map[string]any {
		t.Helper()
		buf := make([]byte, 64<<10)
		require.NoError(t, conn.SetReadDeadline(time.Now().Add(5*time.Second)))
		n, _, err := conn.ReadFrom(buf)
		require.NoError(t, err, "no document reached the daemon")
		// Each packet is a header line, then one segment document.
		_, body, ok := bytes.Cut(buf[:n], []byte("\n"))
		require.True(t, ok, "packet without a header line: %q", buf[:n])
		var doc map[string]any
		require.NoError(t, json.Unmarshal(body, &doc))
		return doc
	}
}

// One test for everything in Lambda: the SDK is configured once per process,
// and the daemon address must be in the environment by then.
func TestInsideLambda(t *testing.T) {
	addr, next := daemon(t)
	t.Setenv(xray.LambdaTaskRootKey, "/var/task")
	t.Setenv("AWS_XRAY_DAEMON_ADDRESS", addr)
	ctx := context.WithValue(context.Background(), xray.LambdaTraceHeaderKey, traceHeader)

	t.Run("SpanEmitsASubsegmentWithItsError", func(t *testing.T) {
		want := errors.New("boom")
		var seg *xray.Segment
		err := tracing.Span(ctx, "sweep.batch", func(ctx context.Context) error {
			seg = xray.GetSegment(ctx)
			return want
		})
		require.ErrorIs(t, err, want)
		require.NotNil(t, seg)
		require.Equal(t, "sweep.batch", seg.Name)

		doc := next()
		require.Equal(t, "sweep.batch", doc["name"])
		require.Equal(t, "subsegment", doc["type"])
		require.Equal(t, traceRoot, doc["trace_id"])
		require.Equal(t, traceParent, doc["parent_id"])
		require.Equal(t, true, doc["fault"], "the error was not recorded")
	})

	t.Run("SDKDisabledAPanicKeepsItsValue", func(t *testing.T) {
		t.Setenv("AWS_XRAY_SDK_DISABLED", "TRUE")
		var p any
		func() {
			defer func() { p = recover() }()
			_ = tracing.Span(ctx, "sweep.batch", func(ctx context.Context) error {
				require.Nil(t, xray.GetSegment(ctx), "a segment while the SDK is disabled")
				panic("the handler's own panic")
			})
		}()
		require.Equal(t, "the handler's own panic", p)
	})

	t.Run("NoTraceHeaderNoSegment", func(t *testing.T) {
		err := tracing.Span(context.Background(), "x", func(ctx context.Context) error {
			require.Nil(t, xray.GetSegment(ctx), "segment without a trace header")
			return nil
		})
		require.NoError(t, err)
	})

	t.Run("AWSCallsGetASubsegmentAndPropagateTheTrace", func(t *testing.T) {
		cfg := testConfig()
		tracing.InstrumentAWS(&cfg)
		url, headers := secretsServer(t)
		require.NoError(t, tracing.Span(ctx, "archive.lookup", func(ctx context.Context) error {
			return getSecret(ctx, cfg, url)
		}))

		got := headers()
		require.Len(t, got, 1)
		require.True(t, strings.HasPrefix(got[0], "Root="+traceRoot+";"), "X-Amzn-Trace-Id = %q", got[0])

		// The span's document carries the SDK call's subsegment.
		span := next()
		require.Equal(t, "archive.lookup", span["name"])
		require.Equal(t, traceRoot, span["trace_id"])
		subs, _ := span["subsegments"].([]any)
		require.Len(t, subs, 1, "span document: %v", span)
		call := subs[0].(map[string]any)
		require.Equal(t, "Secrets Manager", call["name"])
		require.Equal(t, "aws", call["namespace"])
		require.Equal(t, "GetSecretValue", call["aws"].(map[string]any)["operation"])
	})
}

// The tests go through tracing.Span and tracing.InstrumentAWS, as the
// library packages do, with X-Ray installed as fnenv installs it.
func TestMain(m *testing.M) {
	Install()
	os.Exit(m.Run())
}
