package main

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/lambda"
	"github.com/stretchr/testify/require"

	"github.com/idemarchive/idemarchive/shared/dbtest"
	"github.com/idemarchive/idemarchive/shared/testenv"
)

func setup(t *testing.T, rows int) (*dbtest.DB, lambda.Handler, *testenv.SyncBuffer) {
	t.Helper()
	db := dbtest.New(t)
	db.Partition(t, 0)
	for i := range rows {
		dbtest.InsertLive(t, db.Pool, dbtest.LiveRow{Key: fmt.Sprintf("idem:v1:%03d", i), Status: 201,
			Response: map[string]any{"id": fmt.Sprintf("ch_%d", i)}, ExpiresAt: time.Now().Add(-time.Hour)})
	}
	env, stdout, _ := testenv.FunctionEnv(t, db, map[string]string{"SWEEP_PAUSE": "1ms"})
	return db, lambda.NewHandler(newHandler(env)), stdout
}

type summary struct {
	Moved, Archived, Backlog int64
	Batches                  int
	ConflictRetries          int `json:"conflict_retries"`
	BatchTimeouts            int `json:"batch_timeouts"`
	BatchSize                int `json:"batch_size"`
	Drained                  bool
	Stopped                  string
	BatchMaxMS               *int64 `json:"batch_max_ms"`
	DurationMS               *int64 `json:"duration_ms"`
}

func TestScheduledSweepDrains(t *testing.T) {
	t.Parallel()
	db, h, stdout := setup(t, 12)
	out, err := h.Invoke(testenv.Invocation("req-1"), testenv.Event(t, "sweep-schedule.json"))
	require.NoError(t, err)
	var s summary
	require.NoError(t, json.Unmarshal(out, &s))
	require.Equal(t, int64(12), s.Moved)
	require.True(t, s.Drained)
	require.Zero(t, s.Backlog)
	require.NotNil(t, s.DurationMS)
	require.NotNil(t, s.BatchMaxMS)
	require.LessOrEqual(t, *s.BatchMaxMS, *s.DurationMS, "no batch outlasts its run")
	require.EqualValues(t, 12, dbtest.Count(t, db.Pool, "SELECT count(*) FROM idempotency_key_archive"))
	require.Len(t, testenv.Lines(stdout.String(), `"idempotency_archived_total":12`), 1)
}

func TestDirectOverrides(t *testing.T) {
	t.Parallel()
	_, h, _ := setup(t, 7)
	out, err := h.Invoke(testenv.Invocation("req-2"), []byte(`{"batch_size": 2, "pause": "1ms", "pause_ratio": 0}`))
	require.NoError(t, err)
	var s summary
	require.NoError(t, json.Unmarshal(out, &s))
	require.Equal(t, 4, s.Batches, "batch_size 2 moves 7 rows in 4 batches")

	// The sample direct event is accepted as it is.
	_, err = h.Invoke(testenv.Invocation("req-3"), testenv.Event(t, "sweep-direct.json"))
	require.NoError(t, err)
	// So is an empty payload.
	_, err = h.Invoke(testenv.Invocation("req-4"), []byte(`{}`))
	require.NoError(t, err)
}

func TestStopsBeforeTheInvocationDeadline(t *testing.T) {
	t.Parallel()
	_, h, _ := setup(t, 3)
	// Less time left than the deadline margin (35s by default): no batch starts.
	ctx, cancel := context.WithTimeout(testenv.Invocation("req-5"), 20*time.Second)
	defer cancel()
	// With 3 expired rows waiting, that is an error Lambda counts, and it
	// names the setting to change.
	_, err := h.Invoke(ctx, testenv.Event(t, "sweep-schedule.json"))
	require.ErrorContains(t, err, "sweep started no batch")
	require.ErrorContains(t, err, "3 expired rows wait")
	require.ErrorContains(t, err, "SWEEP_DEADLINE_MARGIN")

	// With nothing expired the same stop is a success.
	_, h, _ = setup(t, 0)
	ctx, cancel = context.WithTimeout(testenv.Invocation("req-6"), 20*time.Second)
	defer cancel()
	out, err := h.Invoke(ctx, testenv.Event(t, "sweep-schedule.json"))
	require.NoError(t, err)
	var s summary
	require.NoError(t, json.Unmarshal(out, &s))
	require.Equal(t, "deadline", s.Stopped)
	require.Zero(t, s.Batches)
	require.Zero(t, s.Backlog)
}

func TestBadOptionsAreClearErrors(t *testing.T) {
	t.Parallel()
	_, h, _ := setup(t, 0)
	for payload, want := range map[string]string{
		`{"batch_size": 0}`:     "batch_size must be between 1 and 50000, got 0",
		`{"batch_size": 50001}`: "batch_size must be between 1 and 50000",
		`{"pause": "soon"}`:     "invalid options: pause: not a duration such as 200ms",
		// Empty is not the configured value's spelling, nor is null.
		`{"pause": ""}`:        "invalid options: pause is empty",
		`{"max_duration": ""}`: "invalid options: max_duration is empty",
		// sweep.Config reads 0 as no limit: given, it would run until drained.
		`{"max_duration": "0s"}`: `invalid options: max_duration must be more than 0, got "0s"`,
		`{"detail-type": "Scheduled Event", "detail": {"max_duration": "-0"}}`: `max_duration must be more than 0, got "-0"`,
		`{"detail-type": "Scheduled Event", "detail": {"max_duration": ""}}`:   "invalid options: max_duration is empty",
		`{"batch_size": null}`: `invalid options: "batch_size" is null`,
		`{"batchsize": 10}`:    `unknown field "batchsize"`,
		`{"detail-type": "Scheduled Event", "detail": {"max_duration": 5}}`: "invalid options",
		`[1, 2]`:  "payload must be a JSON object of options, or an EventBridge event, got an array",
		`"sweep"`: "payload must be a JSON object of options, or an EventBridge event, got a string",
		// A second value is refused, never dropped (aws-lambda-go's typed
		// handlers read the first alone).
		`{"batch_size": 1} {"batch_size": 5}`:                        "payload is not JSON: invalid character '{' after top-level value",
		`{"batch_size": 1.5}`:                                        "invalid options: batch_size must be a whole number in range, in digits, got number 1.5",
		`{"batch_size": 1e2}`:                                        "batch_size must be a whole number in range, in digits, got number 1e2",
		`{"batch_size": 99999999999999999999}`:                       "in range, in digits, got number 99999999999999999999",
		`{"detail-type": "Scheduled Event", "detail": "x"}`:          "invalid EventBridge event: detail must be a JSON object of options, got a string",
		`{"detail-type": "Scheduled Event", "detail": [1]}`:          "detail must be a JSON object of options, got an array",
		`{"detail-type": 5, "detail": {}}`:                           "invalid EventBridge event: detail-type must be a string, got a number",
		`{"detail-type": "Scheduled Event", "detail": {"pause": 5}}`: "invalid options: pause must be a string, got number",
		`{"pause": "-1s"}`:                                           "invalid options: pause: sweep pause must be 0 (no fixed pause) or between 1ms",
		`{"pause": "2562047h"}`:                                      "invalid options: pause: sweep pause must be 0 (no fixed pause) or between 1ms",
		`{"max_duration": "-5s"}`:                                    "invalid options: max_duration: sweep max duration must not be negative",
		// Set, never silently zero: 0.5ns would read as 0, no limit.
		`{"max_duration": "0.5ns"}`:    "invalid options: max_duration: is not 0 but shorter than a nanosecond",
		`{"pause": "0.9ns"}`:           "invalid options: pause: is not 0 but shorter than a nanosecond",
		`{"max_duration": "9999999h"}`: "invalid options: max_duration: out of range",
		`{"pause_ratio": -1}`:          "invalid options: pause_ratio: sweep pause ratio must be between 0 (none) and 99, got -1",
		`{"pause_ratio": 1e3}`:         "invalid options: pause_ratio: sweep pause ratio must be between 0 (none) and 99, got 1000",
		`{"pause_ratio": "3"}`:         "invalid options: pause_ratio must be a number, not a string",
		`{"pause_ratio": 1e999}`:       "invalid options: pause_ratio out of range",
		`{"pause_ratio": 1e-400}`:      "invalid options: pause_ratio is not 0 but too small to hold",
		`{"pause_ratio": [3]}`:         "invalid options: pause_ratio not a decimal number",
		`{"pause_ratio": true}`:        "invalid options: pause_ratio not a decimal number",
	} {
		_, err := h.Invoke(testenv.Invocation("req-bad"), []byte(payload))
		require.ErrorContains(t, err, want, payload)
		for _, internal := range []string{"Go ", "struct", "main.", "options."} {
			require.NotContains(t, err.Error(), internal, "the error names Go's types: %s", payload)
		}
	}
}

// A warm function remembers a conflict across invocations: the batch that met
// an archive row that existed already runs again with ON CONFLICT, and so do
// the next invocations' first batches (no second failed batch, no second
// error line in PostgreSQL's log).
func TestAWarmFunctionRemembersAConflict(t *testing.T) {
	t.Parallel()
	db := dbtest.New(t)
	db.Partition(t, 0)
	env, _, logs := testenv.FunctionEnv(t, db, map[string]string{"SWEEP_PAUSE": "1ms"})
	h := lambda.NewHandler(newHandler(env))
	past := time.Now().UTC().Add(-time.Hour).Truncate(time.Microsecond)
	for invocation := range 3 {
		key := fmt.Sprintf("idem:v1:restored-%d", invocation)
		dbtest.InsertLive(t, db.Pool, dbtest.LiveRow{Key: key, Status: 201, ExpiresAt: past})
		dbtest.InsertArchive(t, db.Pool, dbtest.ArchiveRow{Key: key, Status: 201, ExpiredAt: past})
		out, err := h.Invoke(testenv.Invocation(fmt.Sprintf("req-c%d", invocation)), testenv.Event(t, "sweep-schedule.json"))
		require.NoError(t, err)
		var s summary
		require.NoError(t, json.Unmarshal(out, &s))
		require.Equal(t, int64(1), s.Moved)
		require.Equal(t, map[bool]int{true: 1, false: 0}[invocation == 0], s.ConflictRetries, "invocation %d", invocation)
	}
	require.Len(t, testenv.Lines(logs.String(), `"conflict_retries":1`), 1, "the log line of the sweep that met the conflict says so")
}

// A warm function remembers a batch size a statement timeout brought down:
// the next invocation starts there, with no second timed-out batch.
func TestAWarmFunctionRemembersASmallerBatch(t *testing.T) {
	t.Parallel()
	db := dbtest.New(t)
	db.Partition(t, 0)
	_, err := db.Pool.Exec(context.Background(), `
		CREATE FUNCTION slow_delete() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN PERFORM pg_sleep(0.03); RETURN OLD; END $$;
		CREATE TRIGGER slow_delete BEFORE DELETE ON idempotency_keys FOR EACH ROW EXECUTE FUNCTION slow_delete()`)
	require.NoError(t, err)
	env, _, logs := testenv.FunctionEnv(t, db, map[string]string{"SWEEP_PAUSE": "1ms", "SWEEP_BATCH_SIZE": "64", "SWEEP_STATEMENT_TIMEOUT": "300ms"})
	h := lambda.NewHandler(newHandler(env))
	for invocation, want := range []int{2, 0} {
		for i := range 20 {
			dbtest.InsertLive(t, db.Pool, dbtest.LiveRow{Key: fmt.Sprintf("idem:v1:slow-%d-%02d", invocation, i), Status: 201,
				ExpiresAt: time.Now().Add(-time.Hour)})
		}
		out, err := h.Invoke(testenv.Invocation(fmt.Sprintf("req-t%d", invocation)), testenv.Event(t, "sweep-schedule.json"))
		require.NoError(t, err)
		var s summary
		require.NoError(t, json.Unmarshal(out, &s))
		require.EqualValues(t, 20, s.Moved)
		require.Equal(t, want, s.BatchTimeouts, "invocation %d", invocation)
		require.Equal(t, 4, s.BatchSize, "invocation %d", invocation)
	}
	require.Len(t, testenv.Lines(logs.String(), `"batch_timeouts":2`), 1, "the log line of the sweep that timed out says so")
}
