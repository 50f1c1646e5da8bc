// Package sweep moves expired rows from the live table idempotency_keys into
// the archive idempotency_key_archive, in bounded batches.
//
// Each batch is one statement in its own transaction, with its own
// lock_timeout and statement_timeout, so a lock is never held for long and a
// timeout or crash never leaves a half-moved batch. Rows are claimed with FOR
// UPDATE SKIP LOCKED: any number of sweepers can run at once without blocking
// each other or moving a row twice. The batch deletes the rows it claimed by
// ctid and archives exactly what the DELETE returned. That is safe because a
// row version locked by the batch's own transaction keeps its ctid until the
// transaction ends; a row updated after the batch's snapshot was taken is
// missed by the ctid and stays live, unarchived, for the next batch (see
// batch.sql). So a batch may move fewer rows than it claimed, never a row
// without its archive row. Between batches the sweeper pauses (with
// jitter) to yield to request traffic, for a fixed time plus a multiple of
// the time it worked since the last pause (Config.PauseRatio), so that it
// yields more as load slows it; and it stops when a batch comes back
// short (drained), when MaxDuration has passed, or when the context deadline
// is closer than DeadlineMargin, reporting how far it got.
//
// A batch that runs past StatementTimeout moves nothing (its transaction
// rolls back) and is tried again at a quarter of its size, down to one row:
// rows that take long to move (responses of many megabytes, whose resource
// id is read from detoasted JSON) would otherwise fail every batch of every
// run, and nothing behind them would ever be archived. The smaller size
// holds for the Sweeper's next hour of runs (see BatchMemory).
//
// Failures are loud. A run whose deadline leaves no room for a single batch
// while expired rows wait (a Lambda timeout at or under DeadlineMargin) is a
// *DeadlineError, not a quiet success that lets the backlog grow. Settings
// that cannot work are refused by Validate before any run: a timeout that
// PostgreSQL would read as "no timeout" or round, and a statement timeout,
// lock timeout or deadline margin that does not fit in a Lambda invocation.
//
// What an archive row records: the status code of a completed key, or 0 for a
// key that expired while still in flight (its request never completed); and the
// resource id read from the stored response at ResourceIDPath, NULL when it is
// missing, not a string, or over MaxResourceIDBytes.
//
//	s, err := sweep.New(pool, sweep.Config{}, partitions, emitter)
//	res, err := s.Run(ctx)
package sweep

import (
	"cmp"
	"context"
	_ "embed"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemarchive/idemarchive/shared/database"
	"github.com/idemarchive/idemarchive/shared/metrics"
	"github.com/idemarchive/idemarchive/shared/partition"
	"github.com/idemarchive/idemarchive/shared/resourceid"
	"github.com/idemarchive/idemarchive/shared/tracing"
)

//go:embed batch.sql
var batchSQL string

// conflictClause is what makes batchSQL leave an archive row that already
// exists in place and still delete its live row.
const conflictClause = "ON CONFLICT (scoped_key, expired_at) DO NOTHING"

// fastBatchSQL is batchSQL without conflictClause: a plain insert, 35-45 ms
// cheaper a batch of 10,000. Why skipping the clause is safe (the invariant):
// the batch is one statement in one transaction, so when an archive row
// already exists the unique violation fails the whole statement, which then
// has deleted and archived nothing; the sweeper runs the same batch again
// with batchSQL, and uses batchSQL for the next safeFor. No row can leave
// the live table without its archive row, and none is stuck behind a
// conflict.
var fastBatchSQL = withoutConflictClause(batchSQL)

func withoutConflictClause(sql string) string {
	if strings.Count(sql, conflictClause) != 1 {
		panic("sweep: batch.sql must hold the conflict clause exactly once")
	}
	return strings.Replace(sql, conflictClause, "", 1)
}

// errArchiveConflict: a fastBatchSQL batch met an archive row that already
// exists and moved nothing.
var errArchiveConflict = errors.New("an archive row of the batch exists already")

// backlogSQL counts expired live rows through the expires_at index, up to a cap
// so that a huge backlog costs a bounded scan. A key still in flight within
// its grace ($2 ms, Config.InFlightGrace) is not backlog: it stays live by
// design.
const backlogSQL = `
SELECT count(*) FROM (
    SELECT 1 FROM idempotency_keys
     WHERE expires_at < now() AND (state = 'completed' OR expires_at < now() - $2 * interval '1 millisecond')
     LIMIT $1) s`

// unarchivableSQL counts the expired live rows a batch never claims (see
// batch.sql), up to a cap: those that expire before year 1 (one range of
// the expiry index) and, when $2, those with keys over 2,000 bytes, which
// it finds by reading every expired row: only after a run that drained, when
// the rows left expired are the few no batch could claim. Like backlogSQL,
// of which it is a part, it leaves out a key in flight within its grace ($3
// ms): no batch would claim it yet, whatever its length.
const unarchivableSQL = `
SELECT count(*) FROM (
    SELECT 1 FROM idempotency_keys
     WHERE expires_at < '0001-01-01 00:00:00+00'
        OR ($2 AND expires_at < now() AND octet_length(scoped_key) > 2000
            AND (state = 'completed' OR expires_at < now() - $3 * interval '1 millisecond'))
     LIMIT $1) s`

// MaxResourceIDBytes bounds the resource id an archive row keeps, in bytes:
// a longer one is archived as NULL, like a missing one. It is the
// middleware's bound (idempotency.MaxResourceIDBytes, which this package does
// not import), so a row of another writer (an id at ResourceIDPath in its
// jsonb response, or in its resource_id column) is held to the rule the
// middleware's own rows are: the archive keeps an id forever, and every
// answer that carries it, a lookup through the lookup function's 6 MB
// response included, must still fit.
const MaxResourceIDBytes = 255

// DefaultInFlightGrace is SWEEP_IN_FLIGHT_GRACE's default: as long as the
// Redis store keeps an in-flight hash past its window.
const DefaultInFlightGrace = 15 * time.Minute

// MaxInFlightGrace bounds Config.InFlightGrace.
const MaxInFlightGrace = 24 * time.Hour

// DefaultPause is the pause between batches when none is configured.
const DefaultPause = 200 * time.Millisecond

// DefaultPauseRatio is what SWEEP_PAUSE_RATIO and the --pause-ratio flag
// default to: after working for t since its last pause the sweeper waits
// Pause + 3t, so it works at most about a quarter of the time on average,
// however slow the database has made its batches.
const DefaultPauseRatio = 3.0

// MaxPauseRatio bounds Config.PauseRatio: a sweeper busy 1% of the time.
const MaxPauseRatio = 99.0

// MinStatementTimeout is the shortest StatementTimeout Validate accepts:
// the lock timeout, at least 1ms, must be shorter.
const MinStatementTimeout = 2 * time.Millisecond

// Limits on BatchSize.
const (
	MinBatchSize = 1
	MaxBatchSize = 50_000
)

// MaxInvocation is the longest a Lambda invocation can run (15 minutes): the
// bound on every timeout and on the deadline margin, so that no setting the
// sweeper accepts is one a Lambda function can never honour.
const MaxInvocation = database.MaxTimeout

// Config configures a Sweeper.
type Config struct {
	// BatchSize is the most rows one batch moves. Default 10,000; 1 to 50,000.
	BatchSize int
	// Pause is the fixed wait between batches, jittered by ±25%, 0 or 1ms
	// to MaxInvocation (a nonzero pause under a millisecond is refused, not
	// read as none). Zero means no fixed pause: zero is never replaced by
	// a default, so a sweep asked to run flat out (PauseRatio 0 too) does.
	// DefaultPause (200ms) is what the SWEEP_PAUSE variable and the --pause
	// flag default to. A pause never runs past the deadline margin or
	// MaxDuration.
	Pause time.Duration
	// PauseRatio lengthens each pause by that multiple of the time worked
	// since the last one (the batch's attempts and retries, any attempt
	// before them that ran past StatementTimeout, a missing partition's
	// creation, and before the first batch the pool's first connection):
	// the wait is Pause + PauseRatio × that time, jittered by ±25% as a
	// whole. A fixed pause yields least when traffic needs it most, as a
	// loaded database makes every batch slower; with a ratio the sweeper
	// works at most about 1/(1+PauseRatio) of the run on average (a
	// quarter at DefaultPauseRatio; the jitter evens out over batches),
	// whatever the load. 0 to MaxPauseRatio; zero means none: the pause is
	// Pause alone, and with Pause 0 the sweep runs flat out.
	// DefaultPauseRatio is what SWEEP_PAUSE_RATIO and --pause-ratio default
	// to. Like Pause, it never sleeps past the deadline margin or
	// MaxDuration.
	PauseRatio float64
	// LockTimeout bounds each wait for a lock inside a batch (lock_timeout).
	// It must be shorter than StatementTimeout. Default 2s, or half the
	// statement timeout when that is less (at least 1ms); a whole number
	// of milliseconds from 1ms to MaxInvocation.
	LockTimeout time.Duration
	// StatementTimeout bounds each batch statement (statement_timeout).
	// Default 30s; a whole number of milliseconds from MinStatementTimeout
	// to MaxInvocation.
	StatementTimeout time.Duration
	// DeadlineMargin: no batch starts when the context deadline is closer than
	// this. Default StatementTimeout + 5s (at most MaxInvocation - 1s), so a
	// batch always has time to finish; less than MaxInvocation. A margin
	// shorter than StatementTimeout lets a batch start that the invocation's
	// end may cut off: its transaction rolls back (nothing is lost), but the
	// run's summary and backlog metric are. shared/settings refuses such a
	// SWEEP_DEADLINE_MARGIN; tests use short ones. A run that starts no
	// batch for it while a backlog waits fails with a *DeadlineError.
	DeadlineMargin time.Duration
	// InFlightGrace is how long past its expiry a key still in flight stays
	// live before it is archived as expired in flight (status 0), so that a
	// request that outlives its TTL by less records what it did. 0 to
	// MaxInFlightGrace, whole milliseconds; zero means none: archived at
	// expiry. DefaultInFlightGrace is what SWEEP_IN_FLIGHT_GRACE defaults to.
	InFlightGrace time.Duration
	// MaxDuration: no batch after the first starts once this much time has
	// passed. 0 (default) means no limit.
	MaxDuration time.Duration
	// ResourceIDPath is the dotted JSON path of the resource id inside the
	// stored response. Default "id" (the top-level "id").
	ResourceIDPath string
	// FailOnMissingPartition makes a batch whose rows fall in a month without a
	// partition stop with a *MissingPartitionError instead of creating the
	// partition. The rows stay in the live table either way until archived.
	FailOnMissingPartition bool
	// BacklogCap caps the backlog count. Default 10,000,000.
	BacklogCap int64
	// OnBatch, when set, is called after every batch with the running totals.
	OnBatch func(Progress)
	// Conflicts, when set, is shared by the Sweepers built with it (a
	// Lambda function builds one an invocation), so that a batch that met
	// an archive row that existed already makes the next hour's runs of
	// every one of them insert with ON CONFLICT from their first batch.
	// Nil: each Sweeper remembers for itself.
	Conflicts *ConflictMemory
	// Batches remembers the batch size a batch that ran past
	// StatementTimeout brought runs down to; shared as Conflicts is. Nil:
	// each Sweeper remembers for itself.
	Batches *BatchMemory
}

// BatchMemory remembers, for shrunkFor after the last batch that ran past
// its statement timeout, how many times batches were cut (by shrink): runs
// start at Config.BatchSize cut as many times. Cuts, not a size: a run
// with a smaller batch size of its own (an invocation's batch_size) that
// timed out leaves later runs a quarter of theirs, not of its. The zero
// value is ready to use, and it is safe for concurrent use.
type BatchMemory struct {
	mu    sync.Mutex
	cuts  int
	until time.Time
}

// cutsNow returns the cuts a run starts with: the remembered ones while
// they last (on the monotonic clock), else none.
func (m *BatchMemory) cutsNow() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	if time.Now().Before(m.until) {
		return m.cuts
	}
	return 0
}

func (m *BatchMemory) remember(cuts int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if !time.Now().Before(m.until) || cuts > m.cuts {
		m.cuts = cuts
	}
	m.until = time.Now().Add(shrunkFor)
}

// cut returns size cut n times by shrink, at least 1.
func cut(size, n int) int {
	for ; n > 0 && size > 1; n-- {
		size /= shrink
	}
	return max(1, size)
}

// shrunkFor is how long runs keep a batch size a timeout brought down.
const shrunkFor = time.Hour

// shrink is the factor a batch that ran past its statement timeout is cut
// by: from 10,000 rows, one row is seven timeouts away.
const shrink = 4

// ConflictMemory remembers when a batch last met an archive row that
// existed already. The zero value is ready to use, and it is safe for
// concurrent use.
type ConflictMemory struct {
	until atomic.Pointer[time.Time]
}

// safe reports whether batches should insert with the conflict clause.
// Compared on the monotonic clock: a step of the wall clock neither
// stretches nor ends it.
func (m *ConflictMemory) safe() bool {
	until := m.until.Load()
	return until != nil && time.Now().Before(*until)
}

func (m *ConflictMemory) remember() {
	until := time.Now().Add(safeFor)
	m.until.Store(&until)
}

// WithDefaults returns c with zero fields set to their defaults.
func (c Config) WithDefaults() Config {
	c.BatchSize = cmp.Or(c.BatchSize, 10_000)
	c.StatementTimeout = cmp.Or(c.StatementTimeout, 30*time.Second)
	// Under the statement timeout (see Validate), in whole milliseconds.
	c.LockTimeout = cmp.Or(c.LockTimeout, max(time.Millisecond, min(2*time.Second, (c.StatementTimeout/2).Truncate(time.Millisecond))))
	// Capped so that a statement timeout at its limit does not make a
	// default margin that Validate refuses.
	c.DeadlineMargin = cmp.Or(c.DeadlineMargin, min(c.StatementTimeout+5*time.Second, MaxInvocation-time.Second))
	c.ResourceIDPath = cmp.Or(c.ResourceIDPath, "id")
	c.BacklogCap = cmp.Or(c.BacklogCap, 10_000_000)
	return c
}

// ConfigError is a Config.Validate error about one field, so that a caller can
// name the field its own way (an environment variable, a flag, a payload key).
type ConfigError struct {
	// Field is the Config field: Pause, PauseRatio, BatchSize, LockTimeout, StatementTimeout,
	// DeadlineMargin, MaxDuration, BacklogCap or ResourceIDPath.
	Field string
	Msg   string
}

func (e *ConfigError) Error() string { return e.Msg }

// Validate reports a configuration the sweeper cannot run with. Its errors
// are *ConfigError.
func (c Config) Validate() error {
	bad := func(field, format string, args ...any) error {
		return &ConfigError{Field: field, Msg: fmt.Sprintf(format, args...)}
	}
	if c.Pause < 0 || c.Pause > MaxInvocation || (c.Pause > 0 && c.Pause < time.Millisecond) {
		return bad("Pause", "sweep pause must be 0 (no fixed pause) or between 1ms and %s, got %s", MaxInvocation, c.Pause)
	}
	// Written so that NaN, which fails every comparison, is refused too.
	if !(c.PauseRatio >= 0 && c.PauseRatio <= MaxPauseRatio) {
		return bad("PauseRatio", "sweep pause ratio must be between 0 (none) and %g, got %g", MaxPauseRatio, c.PauseRatio)
	}
	if c.InFlightGrace < 0 || c.InFlightGrace > MaxInFlightGrace || c.InFlightGrace%time.Millisecond != 0 {
		return bad("InFlightGrace", "sweep in-flight grace must be whole milliseconds between 0 (none) and %s, got %s", MaxInFlightGrace, c.InFlightGrace)
	}
	if c.BatchSize < MinBatchSize || c.BatchSize > MaxBatchSize {
		return bad("BatchSize", "sweep batch size must be between %d and %d, got %d", MinBatchSize, MaxBatchSize, c.BatchSize)
	}
	for _, t := range []struct {
		field, name string
		d           time.Duration
	}{
		{"StatementTimeout", "statement timeout", c.StatementTimeout},
		{"LockTimeout", "lock timeout", c.LockTimeout},
	} {
		// PostgreSQL reads lock_timeout and statement_timeout in whole
		// milliseconds, and 0 as "no timeout": 900µs would disable the bound
		// and 1500µs would shorten it. Both are refused rather than rounded,
		// so the timeout in force is exactly the one configured.
		if err := database.CheckTimeout(t.d); err != nil {
			return bad(t.field, "sweep %s %s", t.name, err)
		}
	}
	if c.StatementTimeout < MinStatementTimeout {
		return bad("StatementTimeout", "sweep statement timeout must be at least %s, so that the lock timeout (at least 1ms) can be shorter; got %s", MinStatementTimeout, c.StatementTimeout)
	}
	if c.LockTimeout >= c.StatementTimeout {
		// A batch waiting on a lock would end at the statement timeout, as
		// a slow one does, and be cut to a quarter of its size for nothing.
		return bad("LockTimeout", "sweep lock timeout must be shorter than the statement timeout (%s), got %s (the default is half the statement timeout, at most 2s)",
			c.StatementTimeout, c.LockTimeout)
	}
	switch {
	case c.DeadlineMargin < 0:
		return bad("DeadlineMargin", "sweep deadline margin must not be negative, got %s", c.DeadlineMargin)
	case c.DeadlineMargin >= MaxInvocation:
		// No invocation ever has MaxInvocation left, so no batch could start.
		return bad("DeadlineMargin", "sweep deadline margin must be less than %s, the longest a Lambda invocation runs, or no batch could ever start; got %s (the default is the statement timeout + 5s)",
			MaxInvocation, c.DeadlineMargin)
	case c.MaxDuration < 0:
		return bad("MaxDuration", "sweep max duration must not be negative, got %s", c.MaxDuration)
	case c.BacklogCap < 1:
		return bad("BacklogCap", "sweep backlog cap must be positive, got %d", c.BacklogCap)
	}
	if _, err := resourceid.SplitPath(c.ResourceIDPath); err != nil {
		return bad("ResourceIDPath", "%s", err)
	}
	return nil
}

// Progress is reported after each batch: the run's totals so far, and the
// batch's own time.
type Progress struct {
	Batches  int
	Moved    int64
	Archived int64
	// Elapsed is the run's time so far, pauses included.
	Elapsed time.Duration
	// Took is this batch's time, from its first attempt to its commit,
	// without the pause before it: a batch retried after an archive
	// conflict or a missing partition counts every attempt (and the
	// partitions' creation).
	Took time.Duration
}

// Stop reasons reported in Result.Stopped.
const (
	StoppedDrained     = "drained"
	StoppedDeadline    = "deadline"
	StoppedMaxDuration = "max_duration"
	StoppedCanceled    = "canceled"
	// StoppedError is a run that failed: Run's error says why.
	StoppedError = "error"
)

// Result reports a sweep run.
type Result struct {
	// Moved is the number of expired rows removed from the live table.
	Moved int64 `json:"moved"`
	// Archived is the number of archive rows written. Moved - Archived rows
	// already had their archive row (written at completion by a Redis live
	// store, or by an earlier run).
	Archived int64 `json:"archived"`
	Batches  int   `json:"batches"`
	// ConflictRetries counts the batches that met an archive row that
	// existed already while inserting without ON CONFLICT, moved nothing and
	// ran again with it (not counted in Batches).
	ConflictRetries int `json:"conflict_retries"`
	// IndexSwapRetries counts the attempts of a batch that inserted with
	// ON CONFLICT into a month whose primary key a compaction was swapping
	// for its rebuilt copy, moved nothing and ran again, after a wait (up
	// to 5 in a row; not counted in Batches; see
	// database.ArbiterIndexSwapped).
	IndexSwapRetries int  `json:"index_swap_retries"`
	Drained          bool `json:"drained"`
	// Stopped says why the run ended: drained, deadline, max_duration,
	// canceled, or error (Run returned an error, which says why). A run
	// whose wait to create a missing month ended at the deadline margin
	// returns its MissingPartitionError with deadline.
	Stopped string `json:"stopped"`
	// Backlog is the number of expired rows still live after the run, capped at
	// Config.BacklogCap; -1 when it could not be counted.
	Backlog int64 `json:"backlog"`
	// Unarchivable is the part of Backlog that no batch moves: rows that
	// expire before year 1 (a BC date), for which no archive partition can
	// exist, and, counted after a run that drained, rows whose key is over
	// 2,000 bytes, which the archive's primary key may not hold. They stay
	// live; fix or delete them.
	Unarchivable      int64    `json:"unarchivable"`
	PartitionsCreated []string `json:"partitions_created"`
	// BatchSize is the batch size in force when the run ended:
	// Config.BatchSize, or less after a batch ran past its statement timeout
	// (BatchTimeouts): then the size the next batch takes, which a run that
	// ended right after the timeout did not try.
	BatchSize int `json:"batch_size"`
	// BatchTimeouts counts the batches that ran past StatementTimeout,
	// moved nothing and were tried again at a quarter of their size (not
	// counted in Batches).
	BatchTimeouts int `json:"batch_timeouts"`
	// BatchMaxMS is the longest batch of the run, in milliseconds (see
	// Progress.Took: the attempts of a retried batch and the creation of
	// missing partitions included, so a bound on how long a batch held its
	// rows locked, not that time itself).
	BatchMaxMS int64 `json:"batch_max_ms"`
	DurationMS int64 `json:"duration_ms"`
}

// MissingPartitionError reports expired rows whose month has no archive
// partition. The rows are still in the live table.
type MissingPartitionError struct {
	Months []time.Time
	Err    error // why the partition could not be created, if creation was tried
}

func (e *MissingPartitionError) Error() string {
	names := make([]string, len(e.Months))
	for i, m := range e.Months {
		names[i] = m.Format("2006-01")
	}
	months := strings.Join(names, ", ")
	if months == "" {
		months = "the batch's rows (every month they need has a partition when looked up again)"
	}
	msg := fmt.Sprintf("archive has no partition for %s; the expired rows stay in the live table: run `archivectl partitions` as the archive owner",
		months)
	if e.Err != nil {
		msg += ": creating it failed: " + e.Err.Error()
	}
	return msg
}

func (e *MissingPartitionError) Unwrap() error { return e.Err }

// DeadlineError reports a run that started no batch because its deadline was
// already closer than Config.DeadlineMargin, while expired rows waited (or
// could not be counted). Every such run leaves the backlog to grow, so it is
// an error, not a success that moved nothing: the deadline is too short for
// the margin (a Lambda timeout at or under it) or the margin too long. A run
// that finds no backlog, or that did at least one batch, is no DeadlineError.
type DeadlineError struct {
	// Remaining is the time that was left before the deadline when the run
	// stopped.
	Remaining time.Duration
	// Margin is the deadline margin in force (Config.DeadlineMargin after
	// defaults).
	Margin time.Duration
	// Backlog is the number of expired live rows after the run, capped at
	// Config.BacklogCap; -1 when it could not be counted.
	Backlog int64
	// AfterConflict: the run did start a batch, which met an archive row
	// that existed already and moved nothing, and the deadline came before
	// the batch could run again with ON CONFLICT.
	AfterConflict bool
	// AfterTimeouts counts the batches the run did start, each of which ran
	// past the statement timeout and moved nothing, before the deadline
	// came (or MaxDuration, when set here, ended the run); BatchSize is the
	// size the last one was cut to.
	AfterTimeouts int
	BatchSize     int
	MaxDuration   time.Duration
	// AfterIndexSwaps counts the batches the run did start, each of which
	// met a compaction's index swap and moved nothing, before the deadline
	// came while it waited for the swap to end.
	AfterIndexSwaps int
}

func (e *DeadlineError) Error() string {
	waiting := fmt.Sprintf("%d expired rows wait", e.Backlog)
	if e.Backlog < 0 {
		waiting = "the expired backlog could not be counted"
	}
	what := "sweep started no batch"
	if e.AfterConflict {
		what = "sweep moved nothing: its first batch met an archive row that existed already, and no time was left to run it again with ON CONFLICT"
	}
	if e.AfterTimeouts > 0 && e.MaxDuration > 0 {
		return fmt.Sprintf("sweep moved nothing: %d batches ran past the statement timeout (the last cut to %d rows) before the run's max duration of %s ended it, and %s "+
			"(the rows are slow to move: raise the max duration or SWEEP_STATEMENT_TIMEOUT)",
			e.AfterTimeouts, e.BatchSize, e.MaxDuration, waiting)
	}
	if e.AfterIndexSwaps > 0 && e.AfterTimeouts == 0 {
		// A swap fails only an INSERT ... ON CONFLICT, which a run uses
		// after a conflict: the retry ran, and met the swap.
		first := ""
		if e.AfterConflict {
			first = "its first batch met an archive row that existed already, and, run again with ON CONFLICT, "
		}
		return fmt.Sprintf("sweep moved nothing: %s%d batches met a compaction's index swap (REINDEX CONCURRENTLY of an archive month), and %s was left before the deadline, under the deadline margin of %s, while it waited for the swap to end; %s "+
			"(the next run goes on once the swap is done)",
			first, e.AfterIndexSwaps, e.Remaining.Round(time.Millisecond), e.Margin, waiting)
	}
	if e.AfterTimeouts > 0 {
		return fmt.Sprintf("sweep moved nothing: %d batches ran past the statement timeout (the last cut to %d rows) before %s was left before the deadline, under the deadline margin of %s, and %s "+
			"(the rows are slow to move: the next runs of this warm function start smaller; or raise SWEEP_STATEMENT_TIMEOUT)",
			e.AfterTimeouts, e.BatchSize, e.Remaining.Round(time.Millisecond), e.Margin, waiting)
	}
	return fmt.Sprintf("%s: %s was left before the deadline, under the deadline margin of %s, and %s "+
		"(every such run lets the backlog grow: give the run more time than the margin, or lower the margin)",
		what, e.Remaining.Round(time.Millisecond), e.Margin, waiting)
}

// errPartitionRaced means the partitions a failed batch needed exist by the
// time the sweeper looked: another sweeper or a partition run created them.
// The batch is retried, at most maxPartitionRaces times in a row, so a
// partition that keeps vanishing cannot loop the sweeper. Each race means a
// month was made by someone else meanwhile, and a backlog spanning months
// that several sweepers and partition runs create at once can race once per
// month: the bound is a few years of months, not a handful.
var errPartitionRaced = errors.New("the missing partition was created concurrently")

const maxPartitionRaces = 36

// PartitionEnsurer creates the partition for a month; *partition.Manager is one.
type PartitionEnsurer interface {
	EnsureMonth(ctx context.Context, t time.Time) ([]string, error)
}

var _ PartitionEnsurer = (*partition.Manager)(nil)

// Sweeper moves expired rows into the archive.
type Sweeper struct {
	pool       *pgxpool.Pool
	cfg        Config
	path       []string
	partitions PartitionEnsurer
	metrics    *metrics.Emitter
	sleep      func(context.Context, time.Duration) error
	// conflicts says when runs go back to fastBatchSQL after a conflict: a
	// source of conflicts (rows restored into the live table, a Redis store
	// archiving the same keys) tends to last. Config.Conflicts, or the
	// Sweeper's own.
	conflicts *ConflictMemory
	batches   *BatchMemory
}

// safeFor is how long batches insert with the conflict clause after one
// met a conflict.
const safeFor = time.Hour

// New validates cfg (after defaults) and returns a Sweeper. partitions may be
// nil, in which case a missing partition is always an error; emitter may be nil.
func New(pool *pgxpool.Pool, cfg Config, partitions PartitionEnsurer, emitter *metrics.Emitter) (*Sweeper, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	conflicts := cfg.Conflicts
	if conflicts == nil {
		conflicts = new(ConflictMemory)
	}
	batches := cfg.Batches
	if batches == nil {
		batches = new(BatchMemory)
	}
	return &Sweeper{
		batches:    batches,
		pool:       pool,
		cfg:        cfg,
		path:       strings.Split(cfg.ResourceIDPath, "."),
		partitions: partitions,
		metrics:    emitter,
		sleep:      sleepCtx,
		conflicts:  conflicts,
	}, nil
}

// Run sweeps until drained or stopped, then counts the remaining backlog and
// emits idempotency_archived_total and idempotency_expired_backlog. On error
// the Result still says how far the run got. A run that the deadline margin
// kept from starting a single batch while a backlog waits fails with a
// *DeadlineError.
func (s *Sweeper) Run(ctx context.Context) (res Result, err error) {
	start := time.Now()
	res.PartitionsCreated = []string{}
	res.Backlog = -1
	var noBatch *DeadlineError // set when the deadline (or MaxDuration, after timeouts only) stopped the run before any batch moved rows
	defer func() {
		res.DurationMS = time.Since(start).Milliseconds()
		if err != nil && res.Stopped == "" {
			res.Stopped = StoppedError
		}
		// Count the backlog even when the run was cut short: it is the figure
		// an operator needs most then.
		bctx, cancel := backlogContext(ctx)
		defer cancel()
		if n, berr := s.Backlog(bctx); berr == nil {
			res.Backlog = n
		}
		if res.Backlog != 0 {
			_ = s.pool.QueryRow(bctx, unarchivableSQL, s.cfg.BacklogCap, res.Drained, s.cfg.InFlightGrace.Milliseconds()).Scan(&res.Unarchivable)
		}
		if noBatch != nil && err == nil && res.Backlog != 0 {
			noBatch.Backlog = res.Backlog
			err = noBatch
		}
		values := []metrics.Value{metrics.Count(metrics.ArchivedTotal, res.Moved)}
		if res.Backlog >= 0 {
			values = append(values, metrics.Count(metrics.ExpiredBacklog, res.Backlog))
		}
		s.metrics.Emit(values...)
	}()

	var batchStart time.Time // when the batch being tried began, its retries included
	// worked is when the sweeper last started working after a pause (or
	// the run's start): the pause ratio's base, which, unlike a batch's
	// own time, keeps the attempts that ran past the statement timeout,
	// the database's busiest moments.
	worked := time.Now()
	raced := 0                 // consecutive batches whose missing partition appeared meanwhile
	swapped := 0               // consecutive attempts that met a compaction's index swap
	safe := s.conflicts.safe() // whether batches insert with the conflict clause
	cuts := s.batches.cutsNow()
	res.BatchSize = cut(s.cfg.BatchSize, cuts)
	for {
		if stop := s.shouldStop(ctx, start, res.Batches+res.BatchTimeouts); stop != "" {
			res.Stopped = stop
			if stop == StoppedCanceled {
				return res, canceled(ctx, res)
			}
			if stop == StoppedDeadline && res.Batches == 0 {
				deadline, _ := ctx.Deadline()
				noBatch = &DeadlineError{Remaining: time.Until(deadline), Margin: s.cfg.DeadlineMargin, AfterConflict: res.ConflictRetries > 0,
					AfterTimeouts: res.BatchTimeouts, BatchSize: res.BatchSize, AfterIndexSwaps: res.IndexSwapRetries}
			}
			if stop == StoppedMaxDuration && res.Batches == 0 && res.BatchTimeouts > 0 {
				// Failures are loud: a run that only timed out moved
				// nothing, however it ended.
				noBatch = &DeadlineError{Margin: s.cfg.DeadlineMargin, AfterTimeouts: res.BatchTimeouts, BatchSize: res.BatchSize, MaxDuration: s.cfg.MaxDuration}
			}
			return res, nil
		}
		if batchStart.IsZero() {
			batchStart = time.Now()
		}
		tried := time.Now()
		b, err := s.batch(ctx, safe, res.BatchSize)
		if s.timedOut(ctx, err, time.Since(tried)) {
			if res.BatchSize == 1 {
				return res, fmt.Errorf("sweep batch %d: a batch of one row ran past the statement timeout (%s) and moved nothing; the oldest expired row waits: raise SWEEP_STATEMENT_TIMEOUT, or look at that row (a response of many megabytes?): %w",
					res.Batches+1, s.cfg.StatementTimeout, err)
			}
			// Nothing moved: the same rows again, fewer at a time.
			cuts++
			res.BatchSize = cut(s.cfg.BatchSize, cuts)
			s.batches.remember(cuts)
			res.BatchTimeouts++
			batchStart = time.Time{} // a timed-out attempt is no part of the batch that moves the rows
			continue
		}
		if errors.Is(err, errArchiveConflict) {
			// Nothing moved: the same batch again, and the batches of the
			// next safeFor, skip the rows whose archive rows exist.
			safe = true
			s.conflicts.remember()
			res.ConflictRetries++
			continue
		}
		if database.ArbiterIndexSwapped(err) && swapped < maxIndexSwaps {
			// Nothing moved: the same batch again once the swap is done.
			swapped++
			res.IndexSwapRetries++
			// The wait ends at the deadline margin (the loop then stops),
			// not at MaxDuration, which stops a run only once a batch has
			// moved rows: cut short there, the attempts left would run back
			// to back into the same swap. Waiting is no work: the pause
			// ratio's base leaves it out.
			waited := time.Now()
			if err := sleepCtx(ctx, s.beforeMargin(ctx, time.Duration(swapped)*indexSwapWait)); err != nil {
				res.Stopped = StoppedCanceled
				return res, canceled(ctx, res)
			}
			worked = worked.Add(time.Since(waited))
			continue
		}
		var missing *MissingPartitionError
		if errors.As(err, &missing) {
			created, cerr := s.createPartitions(ctx, missing)
			res.PartitionsCreated = append(res.PartitionsCreated, created...)
			if errors.Is(cerr, errPartitionRaced) {
				if raced < maxPartitionRaces {
					// Another sweeper or a partition run created the month
					// between our failed batch and our look: the batch can
					// now succeed, so run it again.
					raced++
					continue
				}
				missing.Err = errors.New("the partitions exist but the batch keeps finding none")
				cerr = missing
			}
			if cerr != nil && ctx.Err() != nil {
				// Interrupted while it waited to create the month: a
				// cancel, as anywhere else in the run.
				res.Stopped = StoppedCanceled
				return res, canceled(ctx, res)
			}
			if cerr != nil {
				if errors.Is(cerr, context.DeadlineExceeded) {
					// The wait for the partitions' lock ended at the
					// deadline margin: the month is still missing, which
					// the error says, and the run stopped at its deadline.
					res.Stopped = StoppedDeadline
				}
				return res, fmt.Errorf("sweep batch %d: %w", res.Batches+1, cerr)
			}
			continue
		}
		raced, swapped = 0, 0
		if err != nil {
			if ctx.Err() != nil {
				res.Stopped = StoppedCanceled
				return res, canceled(ctx, res)
			}
			return res, fmt.Errorf("sweep batch %d: %w", res.Batches+1, err)
		}
		res.Batches++
		res.Moved += b.removed
		res.Archived += b.archived
		took := time.Since(batchStart)
		res.BatchMaxMS = max(res.BatchMaxMS, took.Milliseconds())
		if s.cfg.OnBatch != nil {
			s.cfg.OnBatch(Progress{Batches: res.Batches, Moved: res.Moved, Archived: res.Archived, Elapsed: time.Since(start), Took: took})
		}
		batchStart = time.Time{}
		if b.selected < int64(res.BatchSize) {
			res.Drained = true
			res.Stopped = StoppedDrained
			return res, nil
		}
		if s.cfg.Pause > 0 || s.cfg.PauseRatio > 0 {
			if err := s.sleep(ctx, s.pauseFor(ctx, start, time.Since(worked))); err != nil {
				res.Stopped = StoppedCanceled
				return res, canceled(ctx, res)
			}
			worked = time.Now()
		}
	}
}

// ErrCanceled reports a run whose context was canceled (SIGTERM, Ctrl-C, a
// caller giving up), whether during a batch or a pause: an interrupted run
// is an error wherever it was interrupted. Batches already done stay done.
var ErrCanceled = errors.New("sweep canceled")

func canceled(ctx context.Context, res Result) error {
	return fmt.Errorf("%w after %d batches (%d rows moved): %w", ErrCanceled, res.Batches, res.Moved, context.Cause(ctx))
}

// pauseFor is the jittered pause after working for worked, cut short
// so that it ends when the deadline margin or MaxDuration would stop the
// run: a long pause never sleeps into the deadline. The loop's shouldStop
// then says why it stopped.
func (s *Sweeper) pauseFor(ctx context.Context, start time.Time, worked time.Duration) time.Duration {
	d := s.beforeMargin(ctx, jitter(pauseAfter(s.cfg.Pause, s.cfg.PauseRatio, worked)))
	if s.cfg.MaxDuration > 0 {
		d = min(d, max(0, s.cfg.MaxDuration-time.Since(start)))
	}
	return d
}

// beforeMargin cuts a wait of d short so that it ends when the deadline
// margin would stop the run.
func (s *Sweeper) beforeMargin(ctx context.Context, d time.Duration) time.Duration {
	if deadline, ok := ctx.Deadline(); ok {
		d = min(d, max(0, time.Until(deadline)-s.cfg.DeadlineMargin))
	}
	return d
}

func (s *Sweeper) shouldStop(ctx context.Context, start time.Time, batches int) string {
	if ctx.Err() != nil {
		return StoppedCanceled
	}
	if deadline, ok := ctx.Deadline(); ok && time.Until(deadline) < s.cfg.DeadlineMargin {
		return StoppedDeadline
	}
	if s.cfg.MaxDuration > 0 && batches > 0 && time.Since(start) >= s.cfg.MaxDuration {
		return StoppedMaxDuration
	}
	return ""
}

type batchResult struct {
	selected, archived, removed int64
}

// batch runs one batch: with batchSQL when safe, else with fastBatchSQL,
// which fails with errArchiveConflict (and moves nothing) when an archive row
// of the batch exists already.
func (s *Sweeper) batch(ctx context.Context, safe bool, size int) (batchResult, error) {
	sql := fastBatchSQL
	if safe {
		sql = batchSQL
	}
	var b batchResult
	ctx, cancel := context.WithTimeout(ctx, s.cfg.StatementTimeout+5*time.Second)
	defer cancel()
	settings := map[string]string{
		"lock_timeout":      pgMillis(s.cfg.LockTimeout),
		"statement_timeout": pgMillis(s.cfg.StatementTimeout),
		// Plan with the real batch size every time: a generic plan guesses
		// the LIMIT and may pick a sequential scan of the live table.
		"plan_cache_mode": "force_custom_plan",
		// The plain-key trigger tries a plain insert first in a
		// transaction that archives in bulk (migration 007).
		"idemarchive.bulk_archive": "on",
	}
	err := tracing.Span(ctx, "sweep.batch", func(ctx context.Context) error {
		return database.InTx(ctx, s.pool, settings, func(tx pgx.Tx) error {
			return tx.QueryRow(ctx, sql, size, s.path, s.cfg.InFlightGrace.Milliseconds(), MaxResourceIDBytes).Scan(&b.selected, &b.archived, &b.removed)
		})
	})
	if !safe && database.SQLState(err) == database.CodeUniqueViolation {
		return batchResult{}, fmt.Errorf("%w: %w", errArchiveConflict, err)
	}
	if isNoPartition(err) {
		months, merr := s.uncoveredMonths(ctx)
		if merr != nil {
			return b, fmt.Errorf("%w (and finding the months failed: %v)", err, merr)
		}
		return b, &MissingPartitionError{Months: months}
	}
	return b, err
}

// timedOut reports a batch the server canceled at its statement timeout,
// while the run itself goes on: a run whose context ended is stopping, not
// slow. The server says the same (57014) for an operator's
// pg_cancel_backend, which fails the run as any error does: a batch that
// took less than the statement timeout was not canceled by it. A batch
// that never reached the server (the database unreachable) is no timeout
// either: a smaller one would fare no better. A lock wait is (Validate
// keeps the lock timeout under the statement timeout).
func (s *Sweeper) timedOut(ctx context.Context, err error, took time.Duration) bool {
	return err != nil && ctx.Err() == nil && database.SQLState(err) == database.CodeQueryCanceled && took >= s.cfg.StatementTimeout
}

// isNoPartition recognizes "no partition of relation ... found for row":
// a check violation that names the archive and no constraint (a CHECK
// constraint's names its constraint), whatever language the server's
// lc_messages writes the message in.
func isNoPartition(err error) bool {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != database.CodeCheckViolation || pgErr.ConstraintName != "" {
		return false
	}
	return pgErr.TableName == partition.ArchiveTable || strings.Contains(pgErr.Message, "no partition of relation")
}

// uncoveredMonths returns the UTC months of the expired backlog that no
// archive partition covers.
func (s *Sweeper) uncoveredMonths(ctx context.Context) ([]time.Time, error) {
	months, err := partition.ExpiredLiveMonths(ctx, s.pool)
	if err != nil {
		return nil, err
	}
	parts, err := partition.List(ctx, s.pool)
	if err != nil {
		return nil, err
	}
	var missing []time.Time
	for _, m := range months {
		m = time.Date(m.Year(), m.Month(), 1, 0, 0, 0, 0, time.UTC)
		if !partition.Covers(parts, m) {
			missing = append(missing, m)
		}
	}
	slices.SortFunc(missing, time.Time.Compare)
	return missing, nil
}

// createPartitions creates the missing months, or returns the error that
// explains why the sweeper cannot. It tries every month, so that one it
// cannot create (a hand-made partition overlaps it) holds back none of the
// others, and succeeds when it created at least one: the batch then runs
// again, and fails again only if a month it still needs failed, which the
// next call reports alone. It fails when it made no progress, so a batch can
// never loop on a partition it cannot create, and when the run's time ended
// while months were left (with the months it created).
func (s *Sweeper) createPartitions(ctx context.Context, missing *MissingPartitionError) ([]string, error) {
	if len(missing.Months) == 0 {
		// Every month the batch needs is covered now: someone created it
		// after the insert failed.
		return nil, errPartitionRaced
	}
	if s.cfg.FailOnMissingPartition || s.partitions == nil {
		return nil, missing
	}
	// Creating a month waits for the partition manager's advisory lock,
	// which a partition run can hold for minutes (a DETACH or REINDEX
	// CONCURRENTLY waiting for old snapshots): it ends where batches stop
	// starting, DeadlineMargin before the invocation's deadline, so that the
	// run still reports what stopped it rather than be killed.
	if deadline, ok := ctx.Deadline(); ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, deadline.Add(-s.cfg.DeadlineMargin))
		defer cancel()
	}
	var created []string
	var failed []time.Time
	var why error
	for i, m := range missing.Months {
		if err := ctx.Err(); err != nil {
			failed, why = append(failed, missing.Months[i:]...), joinReasons(why, err)
			break
		}
		stmts, err := s.partitions.EnsureMonth(ctx, m)
		if err != nil {
			failed, why = append(failed, m), joinReasons(why, fmt.Errorf("%s: %w", m.Format("2006-01"), err))
			continue
		}
		if len(stmts) > 0 {
			created = append(created, partition.Name(m))
		}
	}
	switch {
	case len(failed) > 0 && ctx.Err() != nil:
		// The wait ended where the run does (its deadline margin, or a
		// cancel): the months created are kept, and the run ends saying
		// which are still missing, not that it had no time to start.
		missing.Months, missing.Err = failed, why
		return created, missing
	case len(created) > 0:
		return created, nil
	case len(failed) > 0:
		missing.Months, missing.Err = failed, why
		return nil, missing
	default:
		// EnsureMonth found them all in place: created concurrently.
		return nil, errPartitionRaced
	}
}

// joinReasons appends err to the reasons so far on one line (errors.Join
// would break an error line in two), keeping both matchable.
func joinReasons(so error, err error) error {
	if so == nil {
		return err
	}
	return fmt.Errorf("%w; %w", so, err)
}

// backlogContext bounds the backlog count that ends every run: backlogGrace,
// even after ctx is canceled (an operator's Ctrl-C still gets the figure),
// but never past ctx's deadline less metricsReserve. Lambda stops a function
// at its deadline, and a count that waited past it (a lock, a database
// that stopped answering) would take the run's metrics and its error line
// with it.
func backlogContext(ctx context.Context) (context.Context, context.CancelFunc) {
	until := time.Now().Add(backlogGrace)
	if deadline, ok := ctx.Deadline(); ok && deadline.Add(-metricsReserve).Before(until) {
		until = deadline.Add(-metricsReserve)
	}
	return context.WithDeadline(context.WithoutCancel(ctx), until)
}

const (
	backlogGrace   = 5 * time.Second
	metricsReserve = 500 * time.Millisecond
)

// Backlog counts expired live rows, up to Config.BacklogCap.
func (s *Sweeper) Backlog(ctx context.Context) (int64, error) {
	var n int64
	if err := s.pool.QueryRow(ctx, backlogSQL, s.cfg.BacklogCap, s.cfg.InFlightGrace.Milliseconds()).Scan(&n); err != nil {
		return 0, fmt.Errorf("count expired backlog: %w", err)
	}
	return n, nil
}

// pgMillis renders a timeout for set_config in PostgreSQL's whole
// milliseconds, rounding a fraction UP: a positive timeout never becomes "0ms"
// (which PostgreSQL reads as no timeout) and is never shortened. Validate
// already refuses values that would need rounding; rounding up here keeps the
// guarantee even for a value that never went through it.
func pgMillis(d time.Duration) string {
	ms := d.Milliseconds()
	if d%time.Millisecond > 0 {
		ms++
	}
	return strconv.FormatInt(ms, 10) + "ms"
}

// pauseAfter is the pause before jitter: pause + ratio × worked, at most
// MaxInvocation (the product of a long batch and a large ratio must not
// overflow; pauseFor cuts the jittered pause at the deadline margin and
// MaxDuration).
func pauseAfter(pause time.Duration, ratio float64, worked time.Duration) time.Duration {
	extra := ratio * float64(max(worked, 0))
	if extra >= float64(MaxInvocation) {
		return MaxInvocation
	}
	return min(pause+time.Duration(extra), MaxInvocation)
}

func jitter(d time.Duration) time.Duration {
	return d*3/4 + time.Duration(rand.Int64N(int64(d)/2+1))
}

// maxIndexSwaps bounds the consecutive attempts of a batch that meet a
// compaction's index swap, each after a wait of indexSwapWait times its
// number (1.5 s in all): the swap takes milliseconds, and a compaction
// rebuilds a month's index once.
const (
	maxIndexSwaps = 5
	indexSwapWait = 100 * time.Millisecond
)

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
