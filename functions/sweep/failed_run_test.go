package main

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/lambda"
	"github.com/stretchr/testify/require"

	"github.com/idemarchive/idemarchive/shared/dbtest"
	"github.com/idemarchive/idemarchive/shared/partition"
	"github.com/idemarchive/idemarchive/shared/testenv"
)

// A run that fails after moving rows and creating a month: Lambda's answer
// to a failed invocation is the error alone, so its "sweep failed" log line
// carries the whole summary: the month created, stopped=error.
func TestAFailedRunLogsItsWholeSummary(t *testing.T) {
	t.Parallel()
	db := dbtest.New(t)
	db.Partition(t, 0)
	ctx := context.Background()
	start := partition.MonthStart(time.Now())
	older, blocked := start.AddDate(0, -9, 0), start.AddDate(0, -7, 0)
	// A hand-made partition overlaps the blocked month from its 15th on:
	// EnsureMonth(blocked) fails with an overlap error.
	_, err := db.Pool.Exec(ctx, fmt.Sprintf(`CREATE TABLE redteam_handmade PARTITION OF idempotency_key_archive FOR VALUES FROM ('%s') TO ('%s')`,
		blocked.AddDate(0, 0, 14).Format(time.RFC3339), blocked.AddDate(0, 1, 14).Format(time.RFC3339)))
	require.NoError(t, err)
	dbtest.InsertLive(t, db.Pool,
		dbtest.LiveRow{Key: "idem:v1:older", Status: 201, ExpiresAt: older.Add(3 * 24 * time.Hour)},
		dbtest.LiveRow{Key: "idem:v1:blocked", Status: 201, ExpiresAt: blocked.Add(3 * 24 * time.Hour)},
	)
	env, stdout, logs := testenv.FunctionEnv(t, db, map[string]string{"SWEEP_PAUSE": "1ms", "SWEEP_BATCH_SIZE": "1"})
	h := lambda.NewHandler(newHandler(env))
	out, err := h.Invoke(testenv.Invocation("req-rt"), testenv.Event(t, "sweep-schedule.json"))
	require.Error(t, err, "answer %q", out)
	_ = stdout
	// What happened: the older month was created, its row moved and archived.
	require.EqualValues(t, 1, dbtest.Count(t, db.Pool, "SELECT count(*) FROM idempotency_key_archive WHERE scoped_key = 'idem:v1:older'"))
	require.EqualValues(t, 1, dbtest.Count(t, db.Pool, "SELECT count(*) FROM pg_class WHERE relname = $1", partition.Name(older)))
	// What the operator is told.
	line := lineWith(t, logs.String(), `"msg":"sweep failed"`)
	require.Contains(t, line, `"partitions_created":["`+partition.Name(older)+`"]`)
	require.Contains(t, line, `"stopped":"error"`)
	require.Contains(t, line, `"archived":1`)
}

// lineWith is the one line of logs holding s.
func lineWith(t *testing.T, logs, s string) string {
	t.Helper()
	var found []string
	for _, l := range strings.Split(logs, "\n") {
		if strings.Contains(l, s) {
			found = append(found, l)
		}
	}
	require.Len(t, found, 1, "lines with %s in %s", s, logs)
	return found[0]
}

// In PostgreSQL an index swap ("invalid arbiter index list") only fails an
// INSERT ... ON CONFLICT, and a fresh function inserts with ON CONFLICT only
// after its batch met an archive row that existed already. So the realistic
// sequence is: conflict, retry with ON CONFLICT, which meets a compaction's
// swap, waits, and the deadline comes while it waits. The trigger below
// lets the first insert pass (it then meets the unique violation) and fails
// the next ones as a swap does.
//
// The error says the retry ran and met the swap, without advice on the
// function's timeout, and the log line counts the swap's retries.
func TestASwapMetAfterAConflictIsNamedNotTheTimeout(t *testing.T) {
	t.Parallel()
	db := dbtest.New(t)
	db.Partition(t, 0)
	ctx := context.Background()
	past := time.Now().UTC().Add(-time.Hour).Truncate(time.Microsecond)
	dbtest.InsertLive(t, db.Pool, dbtest.LiveRow{Key: "idem:v1:restored", Status: 201, ExpiresAt: past})
	dbtest.InsertArchive(t, db.Pool, dbtest.ArchiveRow{Key: "idem:v1:restored", Status: 201, ExpiredAt: past})
	_, err := db.Pool.Exec(ctx, `
		CREATE SEQUENCE rt_swap_faults;
		CREATE FUNCTION rt_swap_fault() RETURNS trigger LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
		BEGIN
			IF nextval('rt_swap_faults') > 1 THEN
				RAISE EXCEPTION 'invalid arbiter index list' USING ERRCODE = 'internal_error';
			END IF;
			RETURN NEW;
		END $$;
		CREATE TRIGGER rt_swap_fault BEFORE INSERT ON idempotency_key_archive FOR EACH ROW EXECUTE FUNCTION rt_swap_fault();`)
	require.NoError(t, err)
	env, _, logs := testenv.FunctionEnv(t, db, map[string]string{"SWEEP_PAUSE": "1ms", "SWEEP_STATEMENT_TIMEOUT": "2s", "SWEEP_DEADLINE_MARGIN": "2200ms"})
	h := lambda.NewHandler(newHandler(env))
	ictx, cancel := context.WithTimeout(testenv.Invocation("req-swap"), 3*time.Second)
	defer cancel()
	_, err = h.Invoke(ictx, testenv.Event(t, "sweep-schedule.json"))
	require.Error(t, err)
	require.Contains(t, err.Error(), "its first batch met an archive row that existed already, and, run again with ON CONFLICT, ")
	require.Contains(t, err.Error(), "met a compaction's index swap")
	require.NotContains(t, err.Error(), "raise the function's timeout", "the invocation was not short; a compaction held the batch")
	line := lineWith(t, logs.String(), `"msg":"sweep failed"`)
	require.Contains(t, line, `"conflict_retries":1`)
	require.NotContains(t, line, `"index_swap_retries":0`)
}
