package main

import (
	"encoding/json"
	"testing"

	"github.com/aws/aws-lambda-go/lambda"
	"github.com/stretchr/testify/require"

	"github.com/idemarchive/idemarchive/shared/dbtest"
	"github.com/idemarchive/idemarchive/shared/partition"
	"github.com/idemarchive/idemarchive/shared/testenv"
)

func setup(t *testing.T) (*dbtest.DB, lambda.Handler, *testenv.SyncBuffer) {
	t.Helper()
	db := dbtest.New(t)
	env, stdout, _ := testenv.FunctionEnv(t, db, nil)
	return db, lambda.NewHandler((&handler{env: env}).Handle), stdout
}

func TestScheduledRunCreatesPartitions(t *testing.T) {
	t.Parallel()
	db, h, stdout := setup(t)
	out, err := h.Invoke(testenv.Invocation("req-1"), testenv.Event(t, "partitions-schedule.json"))
	require.NoError(t, err)
	var res partition.Result
	require.NoError(t, json.Unmarshal(out, &res))
	require.Len(t, res.Created, 5)
	require.NotEmpty(t, res.Statements)
	require.Greater(t, res.NewestPartitionDays, 60.0)
	require.EqualValues(t, 5, dbtest.Count(t, db.Pool, "SELECT count(*) FROM pg_inherits WHERE inhparent = 'idempotency_key_archive'::regclass"))
	require.Len(t, testenv.Lines(stdout.String(), `"idempotency_archive_newest_partition_days"`), 1)

	// A second run has nothing to do.
	out, err = h.Invoke(testenv.Invocation("req-2"), testenv.Event(t, "partitions-schedule.json"))
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(out, &res))
	require.Empty(t, res.Created)
}

func TestDryRunEventRunsNothing(t *testing.T) {
	t.Parallel()
	db, h, _ := setup(t)
	out, err := h.Invoke(testenv.Invocation("req-3"), testenv.Event(t, "partitions-dry-run.json"))
	require.NoError(t, err)
	var res partition.Result
	require.NoError(t, json.Unmarshal(out, &res))
	require.True(t, res.DryRun)
	require.Len(t, res.Created, 6, "lead_months 4 plans six months, from the previous one")
	require.EqualValues(t, 0, dbtest.Count(t, db.Pool, "SELECT count(*) FROM pg_inherits WHERE inhparent = 'idempotency_key_archive'::regclass"))
}

func TestBadOptionsAreClearErrors(t *testing.T) {
	t.Parallel()
	_, h, _ := setup(t)
	for payload, want := range map[string]string{
		`{"lead_months": 1}`:       "lead_months must be at least 2, got 1",
		`{"lead_months": 0}`:       "lead_months must be at least 2, got 0",
		`{"retention_months": -1}`: "must not be negative",
		`{"dry-run": true}`:        `unknown field "dry-run"`,
	} {
		_, err := h.Invoke(testenv.Invocation("req-bad"), []byte(payload))
		require.ErrorContains(t, err, want, payload)
	}
}
