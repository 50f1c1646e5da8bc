package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemarchive/idemarchive/shared/dbtest"
	"github.com/idemarchive/idemarchive/shared/testenv"
)

// shellRuntime writes a bootstrap speaking the Lambda Runtime API with curl:
// body runs with $base set to the invocation endpoint.
func shellRuntime(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "bootstrap")
	require.NoError(t, os.WriteFile(p, []byte("#!/bin/sh\nbase=\"http://$AWS_LAMBDA_RUNTIME_API/2018-06-01/runtime/invocation\"\n"+body), 0o755))
	return p
}

func writeEvent(t *testing.T, b []byte) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "event.json")
	require.NoError(t, os.WriteFile(p, b, 0o600))
	return p
}

// A function that runs past its timeout is a failed invocation in Lambda.
// The emulator answers it with 200 and plain text, which the command must
// not take for the function's answer; nor any answer that is not JSON.
func TestInvokeFailsOnATimeoutOrAnAnswerThatIsNotJSON(t *testing.T) {
	t.Setenv(functionTimeoutVar, "")
	rie := testenv.RIEBinary(t)
	hang := shellRuntime(t, "curl -s -o /dev/null \"$base/next\"\nexec sleep 600\n")
	var out, logs bytes.Buffer
	start := time.Now()
	err := run(context.Background(), []string{"invoke", "-rie", rie, "-bootstrap", hang, "-event", writeEvent(t, []byte(`{}`)), "-timeout", "1s"}, &out, &logs)
	require.ErrorContains(t, err, "the function timed out: Task timed out after 1.00 seconds")
	require.Less(t, time.Since(start), 60*time.Second, "-timeout was not the function's timeout")

	// The shell's AWS_LAMBDA_FUNCTION_TIMEOUT is the timeout when no flag is given.
	t.Setenv(functionTimeoutVar, "1")
	err = run(context.Background(), []string{"invoke", "-rie", rie, "-bootstrap", hang, "-event", writeEvent(t, []byte(`{}`))}, &out, &logs)
	require.ErrorContains(t, err, "the function timed out")

	text := shellRuntime(t, `id=$(curl -s -D - -o /dev/null "$base/next" | tr -d '\r' | sed -n 's/^[Ll]ambda-[Rr]untime-[Aa]ws-[Rr]equest-[Ii]d: //p')
curl -s -o /dev/null -X POST -d "not json" "$base/$id/response"
curl -s -o /dev/null "$base/next"
`)
	out.Reset()
	err = run(context.Background(), []string{"invoke", "-rie", rie, "-bootstrap", text, "-event", writeEvent(t, []byte(`{}`))}, &out, &logs)
	require.ErrorContains(t, err, "no JSON")
	require.Contains(t, out.String(), "not json", "the answer is still printed")
}

// Lambda refuses a synchronous event over 6 MB, and the emulator cuts one
// short without a word: the command refuses it, and passes one of exactly
// 6 MB whole.
func TestInvokeRefusesAnEventOverLambdasLimit(t *testing.T) {
	t.Setenv(functionTimeoutVar, "")
	dir := t.TempDir()
	count := shellRuntime(t, `id=$(curl -s -D - -o "`+dir+`/body" "$base/next" | tr -d '\r' | sed -n 's/^[Ll]ambda-[Rr]untime-[Aa]ws-[Rr]equest-[Ii]d: //p')
n=$(wc -c < "`+dir+`/body")
curl -s -o /dev/null -X POST -d "{\"received\":$n}" "$base/$id/response"
curl -s -o /dev/null "$base/next"
`)
	event := func(size int) string {
		prefix, suffix := `{"scoped_key":"`, `"}`
		return writeEvent(t, []byte(prefix+strings.Repeat("a", size-len(prefix)-len(suffix))+suffix))
	}
	rie := testenv.RIEBinary(t)
	var out, logs bytes.Buffer
	err := run(context.Background(), []string{"invoke", "-rie", rie, "-bootstrap", count, "-event", event(maxSyncPayload + 1)}, &out, &logs)
	require.ErrorContains(t, err, fmt.Sprintf("is %d bytes: Lambda refuses a synchronous invocation's event over %d bytes", maxSyncPayload+1, maxSyncPayload))
	require.Empty(t, out.String(), "the event was sent")

	require.NoError(t, run(context.Background(), []string{"invoke", "-rie", rie, "-bootstrap", count, "-event", event(maxSyncPayload)}, &out, &logs), logs.String())
	var got struct{ Received int }
	require.NoError(t, json.Unmarshal(out.Bytes(), &got), out.String())
	require.Equal(t, maxSyncPayload, got.Received, "the function got part of the event")
}

// The function's timeout is the one the stack gives it for the shell's
// settings, unless -timeout or the shell's AWS_LAMBDA_FUNCTION_TIMEOUT say
// otherwise; settings Lambda cannot take are refused.
func TestInvokeTimeouts(t *testing.T) {
	for _, v := range []string{"SWEEP_STATEMENT_TIMEOUT", "SWEEP_LOCK_TIMEOUT", "SWEEP_DEADLINE_MARGIN", "PARTITION_STATEMENT_TIMEOUT", "PARTITION_LOCK_TIMEOUT"} {
		t.Setenv(v, "")
	}
	got := func(set bool, flag time.Duration, shell, fn string) string {
		t.Helper()
		s, err := invokeTimeout(set, flag, shell, fn)
		require.NoError(t, err)
		return s
	}
	require.Equal(t, "240", got(false, 0, "", "sweep"))
	require.Equal(t, "300", got(false, 0, "", "partitions"))
	require.Equal(t, "10", got(false, 0, "", "lookup"))
	require.Equal(t, "900", got(false, 0, "", "migrate"))
	require.Equal(t, "", got(false, 0, "", "sweep.d"), "an unknown function gets the emulator's own")
	require.Equal(t, "7", got(false, 0, "7", "sweep"), "the shell's value")
	require.Equal(t, "30", got(true, 30*time.Second, "7", "sweep"), "the flag over the shell's value")
	require.Equal(t, "900", got(true, 15*time.Minute, "", "x"))

	t.Setenv("SWEEP_DEADLINE_MARGIN", "5m")
	require.Equal(t, "310", got(false, 0, "", "sweep"), "a margin the stack makes room for")
	t.Setenv("SWEEP_DEADLINE_MARGIN", "14m55s")
	_, err := invokeTimeout(false, 0, "", "sweep")
	require.ErrorContains(t, err, "leaves no Lambda timeout")
	// Another function's setting, which no Lambda timeout holds, leaves
	// this one's alone: the invoked function's is all that is read.
	require.Equal(t, "10", got(false, 0, "", "lookup"))
	require.Equal(t, "300", got(false, 0, "", "partitions"))
	t.Setenv("SWEEP_DEADLINE_MARGIN", "")
	t.Setenv("PARTITION_STATEMENT_TIMEOUT", "14m")
	require.Equal(t, "240", got(false, 0, "", "sweep"))
	require.Equal(t, "10", got(false, 0, "", "lookup"))
	_, err = invokeTimeout(false, 0, "", "partitions")
	require.ErrorContains(t, err, "leaves no Lambda timeout 2m0s beyond it")
	t.Setenv("PARTITION_STATEMENT_TIMEOUT", "")
	t.Setenv("SWEEP_DEADLINE_MARGIN", "soon")
	_, err = invokeTimeout(false, 0, "", "sweep")
	require.ErrorContains(t, err, "SWEEP_DEADLINE_MARGIN")

	for _, d := range []time.Duration{0, -time.Second, 500 * time.Millisecond, 1500 * time.Millisecond, 15*time.Minute + time.Second} {
		_, err := invokeTimeout(true, d, "", "sweep")
		require.ErrorContains(t, err, "-timeout", "%s", d)
	}
	for _, v := range []string{"0", "-1", "901", "1.5", "10s", " 10"} {
		_, err := invokeTimeout(false, 0, v, "sweep")
		require.ErrorContains(t, err, "AWS_LAMBDA_FUNCTION_TIMEOUT", "%q", v)
	}
}

// SWEEP_DEADLINE_MARGIN=2m is a setting the stack runs with (its sweep has
// 4 minutes). Under the emulator's own 120 s the sweep would start no batch,
// and its advice, to raise the function's timeout, had no way to be followed.
func TestInvokeGivesTheSweepTheTimeoutTheStackGivesIt(t *testing.T) {
	t.Setenv(functionTimeoutVar, "")
	db := dbtest.New(t)
	db.Partition(t, 0)
	dbtest.InsertLive(t, db.Pool, dbtest.LiveRow{Key: "idem:v1:margin", Status: 201,
		Response: map[string]any{"id": "ch_margin"}, ExpiresAt: time.Now().Add(-time.Hour)})
	t.Setenv("DATABASE_URL", db.URL)
	t.Setenv("SWEEP_DEADLINE_MARGIN", "2m")
	var out, logs bytes.Buffer
	err := run(context.Background(), []string{"invoke",
		"-rie", testenv.RIEBinary(t),
		"-bootstrap", testenv.Bootstraps(t, "sweep")["sweep"], "-function", "sweep",
		"-event", filepath.Join(testenv.RepoRoot(t), "events", "sweep-schedule.json")}, &out, &logs)
	require.NoError(t, err, "stdout: %s", out.String())
	require.EqualValues(t, 1, dbtest.Count(t, db.Pool, `SELECT count(*) FROM idempotency_key_archive WHERE scoped_key = 'idem:v1:margin'`))
}
