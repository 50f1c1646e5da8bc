package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/lambda"
	"github.com/stretchr/testify/require"

	"github.com/idemarchive/idemarchive/shared/dbtest"
	"github.com/idemarchive/idemarchive/shared/partition"
	"github.com/idemarchive/idemarchive/shared/testenv"
)

// handAttached attaches a month by hand (as a restore would), eight months
// ahead, with a row, so that the next run adopts it.
func handAttached(t *testing.T, db *dbtest.DB) string {
	t.Helper()
	ctx := context.Background()
	mo := partition.MonthStart(time.Now()).AddDate(0, 8, 0)
	name := "hand_" + partition.Name(mo)
	_, err := db.Pool.Exec(ctx, `CREATE TABLE `+name+` (LIKE idempotency_key_archive INCLUDING DEFAULTS INCLUDING CONSTRAINTS)`)
	if err != nil {
		t.Fatal(err)
	}
	_, err = db.Pool.Exec(ctx, `INSERT INTO `+name+` (scoped_key, fingerprint, status_code, resource_id, created_at, expired_at)
		VALUES ('idem:v1:restored', '\x00', 201, 'ch_1', $1, $2)`, mo.Add(time.Hour), mo.Add(2*time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	_, err = db.Pool.Exec(ctx, `ALTER TABLE idempotency_key_archive ATTACH PARTITION `+name+` FOR VALUES FROM ('`+
		mo.Format(time.RFC3339)+`') TO ('`+mo.AddDate(0, 1, 0).Format(time.RFC3339)+`')`)
	if err != nil {
		t.Fatal(err)
	}
	return name
}

func logLine(t *testing.T, stderr string, msg string) map[string]any {
	t.Helper()
	for _, l := range strings.Split(stderr, "\n") {
		var m map[string]any
		if json.Unmarshal([]byte(l), &m) == nil && m["msg"] == msg {
			return m
		}
	}
	t.Fatalf("no %q line in:\n%s", msg, stderr)
	return nil
}

// A scheduled run's answer goes nowhere (EventBridge discards it): its log
// line is the record of what it did, the adoption of a table attached by
// hand and the plain keys it recorded included.
func TestTheRunsLogLineSaysAllItDid(t *testing.T) {
	t.Parallel()
	db := dbtest.New(t)
	env, _, stderr := testenv.FunctionEnv(t, db, map[string]string{"PARTITION_COMPACT_PER_RUN": "0"})
	h := lambda.NewHandler(newHandler(env))
	db.Partition(t, 0)
	name := handAttached(t, db)
	out, err := h.Invoke(testenv.Invocation("req-adopt"), testenv.Event(t, "partitions-schedule.json"))
	require.NoError(t, err)
	var res partition.Result
	require.NoError(t, json.Unmarshal(out, &res))
	require.Equal(t, []string{name}, res.Adopted)
	line := logLine(t, stderr.String(), "partition run finished")
	require.Equal(t, []any{name}, line["adopted"])
	pk, ok := line["plain_keys"].(map[string]any)
	require.True(t, ok, "plain_keys: %v", line["plain_keys"])
	require.EqualValues(t, 1, pk["recorded"])
}

// A run held up until its invocation's deadline stops before it, with time
// to answer its own error and log what it did: cut by the platform, it
// answers "Task timed out" alone.
func TestARunStopsBeforeTheInvocationsDeadline(t *testing.T) {
	t.Parallel()
	db := dbtest.New(t)
	env, _, stderr := testenv.FunctionEnv(t, db, map[string]string{"PARTITION_COMPACT_PER_RUN": "0", "PARTITION_LOCK_TIMEOUT": "60s"})
	h := lambda.NewHandler(newHandler(env))
	ctx := context.Background()
	// GIVEN the archive held by another session: creating a month waits
	tx, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, "LOCK TABLE idempotency_key_archive IN ACCESS EXCLUSIVE MODE")
	require.NoError(t, err)
	inv, cancel := context.WithTimeout(testenv.Invocation("req-deadline"), 4*time.Second)
	defer cancel()

	_, err = h.Invoke(inv, testenv.Event(t, "partitions-schedule.json"))

	require.Error(t, err)
	require.NoError(t, inv.Err(), "the run was still going at the invocation's deadline")
	require.Contains(t, logLine(t, stderr.String(), "partition run failed")["error"], "interrupted")
}
