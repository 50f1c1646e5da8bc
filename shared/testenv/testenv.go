// Package testenv helps tests run the Lambda functions the way AWS does: in
// process with the sample events of events/, and as real bootstrap binaries
// under the AWS Lambda Runtime Interface Emulator (no docker needed).
//
// with-services.sh, beside this file, is the harness `make test` runs the
// tests under: it starts a throwaway PostgreSQL (and Redis) when DATABASE_URL
// (REDIS_URL) is unset.
package testenv

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/lambdacontext"
	"github.com/redis/go-redis/v9"

	"github.com/idemarchive/idemarchive/shared/dbtest"
	"github.com/idemarchive/idemarchive/shared/emulator"
	"github.com/idemarchive/idemarchive/shared/fnenv"
)

// RepoRoot returns the module's root directory.
func RepoRoot(t testing.TB) string {
	t.Helper()
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		t.Fatal("cannot locate testenv source")
	}
	return filepath.Clean(filepath.Join(filepath.Dir(file), "..", ".."))
}

// Event returns the sample event events/<name>.
func Event(t testing.TB, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(RepoRoot(t), "events", name))
	if err != nil {
		t.Fatalf("read sample event: %v", err)
	}
	return b
}

// SyncBuffer is a bytes.Buffer safe for concurrent writers.
type SyncBuffer = emulator.Buffer

// FunctionEnv loads a function environment on db's schema, with extra
// environment variables. stdout (metrics) and stderr (logs) are captured.
func FunctionEnv(t testing.TB, db *dbtest.DB, extra map[string]string) (env *fnenv.Env, stdout, stderr *SyncBuffer) {
	t.Helper()
	vars := map[string]string{}
	if db != nil {
		vars["DATABASE_URL"] = db.URL
	}
	for k, v := range extra {
		vars[k] = v
	}
	stdout, stderr = &SyncBuffer{}, &SyncBuffer{}
	env, err := fnenv.Load(context.Background(), func(k string) string { return vars[k] }, stdout, stderr)
	if err != nil {
		t.Fatalf("load function environment: %v", err)
	}
	t.Cleanup(env.Close)
	return env, stdout, stderr
}

// Invocation returns a context carrying a Lambda request id, as the runtime's.
func Invocation(requestID string) context.Context {
	return lambdacontext.NewContext(context.Background(), &lambdacontext.LambdaContext{AwsRequestID: requestID})
}

var toolsMu sync.Mutex

// RIEBinary returns the emulator's path: $AWS_LAMBDA_RIE, then bin/tools of
// the repository (installing it there with go install when missing).
func RIEBinary(t testing.TB) string {
	t.Helper()
	if p := os.Getenv("AWS_LAMBDA_RIE"); p != "" {
		return p
	}
	toolsMu.Lock()
	defer toolsMu.Unlock()
	dir := filepath.Join(RepoRoot(t), "bin", "tools")
	bin := filepath.Join(dir, "aws-lambda-rie")
	if _, err := os.Stat(bin); err == nil {
		return bin
	}
	cmd := exec.Command("go", "install", emulator.Module)
	cmd.Env = append(os.Environ(), "GOBIN="+dir, "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("install the Lambda Runtime Interface Emulator (%s): %v\n%s", emulator.Module, err, out)
	}
	return bin
}

// Bootstraps builds functions/<fn> for this machine, with the flags of the
// Makefile's build-local, into the test's temporary directory (one go build,
// which compiles them in parallel) and returns each bootstrap's path by name.
func Bootstraps(t testing.TB, fns ...string) map[string]string {
	t.Helper()
	dir := t.TempDir()
	args := []string{"build", "-tags", "lambda.norpc", "-trimpath", "-ldflags", "-s -w", "-o", dir + "/"}
	for _, f := range fns {
		args = append(args, "./functions/"+f)
	}
	cmd := exec.Command("go", args...)
	cmd.Dir = RepoRoot(t)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build bootstraps: %v\n%s", err, b)
	}
	paths := map[string]string{}
	for _, f := range fns {
		// Lambda runs a file named bootstrap: give each its own directory.
		p := filepath.Join(dir, f+".d", "bootstrap")
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(filepath.Join(dir, f), p); err != nil {
			t.Fatal(err)
		}
		paths[f] = p
	}
	return paths
}

// Emulator is a function under the Runtime Interface Emulator.
type Emulator struct {
	*emulator.Emulator
}

// StartEmulator runs bootstrap under the emulator with env until the test ends.
func StartEmulator(t testing.TB, bootstrap string, env map[string]string) *Emulator {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	e, err := emulator.Start(ctx, RIEBinary(t), bootstrap, env, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Close)
	return &Emulator{e}
}

// Invoke invokes the function and returns its response, failing the test on
// a transport error.
func (e *Emulator) Invoke(t testing.TB, payload []byte) []byte {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	out, err := e.Emulator.Invoke(ctx, payload)
	if err != nil {
		t.Fatalf("%v\n%s", err, e.Output.String())
	}
	return out
}

// Lines returns the lines of s that contain sub.
func Lines(s, sub string) []string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return out
}

// Redis returns a client for REDIS_URL (make test starts a throwaway
// redis-server) and a key prefix of the test's own, or fails the test with a
// message that says how to get one.
func Redis(t testing.TB) (*redis.Client, string) {
	t.Helper()
	u := os.Getenv("REDIS_URL")
	if u == "" {
		t.Fatal("REDIS_URL is not set: run the tests with `make test`, which starts a throwaway redis-server, or point REDIS_URL at one")
	}
	opts, err := redis.ParseURL(u)
	if err != nil {
		t.Fatalf("parse REDIS_URL: %v", err)
	}
	client := redis.NewClient(opts)
	t.Cleanup(func() { _ = client.Close() })
	if err := client.Ping(context.Background()).Err(); err != nil {
		t.Fatalf("ping redis at REDIS_URL: %v", err)
	}
	var b [6]byte
	_, _ = rand.Read(b[:])
	return client, "test:" + hex.EncodeToString(b[:]) + ":"
}
