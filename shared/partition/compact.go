package partition

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemarchive/idemarchive/shared/database"
)

// Compaction
//
// The sweeper archives keys in expiry order, which is random key order, so
// every insert lands on a random leaf of the partition's primary key
// (scoped_key, expired_at) and the page splits leave its leaves about half
// full: about 120 of the 273 bytes a row costs after a sweep of 40-byte keys.
// The heap is append-only and already dense. Once a month is closed its rows
// no longer change, and a run with Config.CompactPerRun > 0 rebuilds the
// primary key of the closed partitions, one by one:
//
//	ALTER INDEX pk SET (fillfactor = 100)  -- leaves packed full: nothing splits them again
//	REINDEX INDEX CONCURRENTLY pk          -- SHARE UPDATE EXCLUSIVE: reads and inserts go on
//	COMMENT ON INDEX pk IS compactedMark   -- only once the rebuild is done
//
// Invariants, and what enforces them:
//
//   - Only months closed for a whole month are compacted (their upper bound
//     at or before the start of the previous month, by the earlier of the two
//     clocks): rows expiring in a month arrive while the sweeper catches up,
//     in the first hours of the next month, or days later after an outage.
//     The current, the previous and future months are never touched. A row
//     that still arrives is not a problem, only a page split: a rebuild is
//     only a rebuild, and every row stays in the heap and in the index.
//   - A partition is compacted once. The mark is the comment on its valid
//     primary-key index, set after REINDEX returned, and REINDEX ...
//     CONCURRENTLY carries it over to the index it builds (so does pg_dump).
//     The fillfactor alone could not be the mark: it is set before the
//     rebuild (which builds with it) and survives a rebuild that never ran.
//   - An interrupted rebuild leaves an INVALID index named <pk>_ccnew (before
//     the swap) or <pk>_ccold (after). Lookups never use an invalid index.
//     The step that failed drops it when it can, and every run drops those
//     it finds (DROP INDEX CONCURRENTLY) before it compacts anything; an
//     index being built right now (pg_stat_progress_create_index) is left
//     alone.
//   - A rebuild is bounded by PARTITION_STATEMENT_TIMEOUT, shortened to end
//     compactMargin before the run's deadline, so that the cleanup fits
//     before the Lambda is stopped. A rebuild that timed out is marked with
//     the time it had, and later runs skip it, rather than spend every run's
//     budget on it, until a run has more time (a longer
//     PARTITION_STATEMENT_TIMEOUT, or `archivectl partitions
//     --compact-per-run`), or it is rebuilt by hand (see the README). It
//     stays in Result.CompactPending.
//   - A month owned by a role whose privileges the run's user lacks (made or
//     restored by hand as another user) is left pending, and neither counts
//     against CompactPerRun nor fails the run: every rebuild of it would
//     fail, and, newest first, it would take the run's turn every day while
//     the older months waited.
//   - Runs hold the advisory lock, so two rebuilds never race, and a rebuild
//     never meets the manager's own DETACH ... CONCURRENTLY (which conflicts
//     with it).

// MaxCompactPerRun is the most closed partitions Config accepts to compact in
// one run.
const MaxCompactPerRun = 24

// compactedMark is the comment on the primary-key index of a compacted
// partition.
const compactedMark = "idemarchive: compacted by the partition manager (REINDEX INDEX CONCURRENTLY, fillfactor 100)"

// timedOutPrefix starts the comment on the primary-key index of a partition
// whose rebuild ran out of time; the time it had follows.
const timedOutPrefix = "idemarchive: compaction timed out after "

// compactMargin is the time a rebuild leaves before the run's deadline: to
// drop what a rebuild cut short leaves behind, and to finish the run.
const compactMargin = 30 * time.Second

// minCompactBudget is the least time a rebuild is started with when the
// deadline shortened its statement timeout.
const minCompactBudget = 5 * time.Second

// Pending is a closed partition a run left uncompacted, and why.
type Pending struct {
	Partition string `json:"partition"`
	Reason    string `json:"reason"`
}

// pkIndex is the valid primary-key index of an attached partition.
type pkIndex struct {
	partition string
	index     string
	comment   string
	hasRows   bool
	building  bool // an index build runs on the partition now
	// owner is the partition's owner; owned says whether this session's
	// user has its privileges (is it, inherits from it, or is a
	// superuser), which ALTER INDEX, REINDEX and COMMENT ON INDEX need.
	owner string
	owned bool
}

// pkSQL lists the valid primary-key index of every attached partition in the
// archive's schema (the statements name indexes in that schema; a partition
// attached from another schema is left alone), and whether another session
// builds an index on it now: pg_stat_progress_create_index shows other
// roles' builds only to pg_read_all_stats, so a SHARE UPDATE EXCLUSIVE lock
// held by another session (a REINDEX or CREATE INDEX CONCURRENTLY, or a
// VACUUM) counts too.
const pkSQL = `
SELECT c.relname, pk.relname, coalesce(obj_description(pk.oid, 'pg_class'), ''),
       pg_relation_size(c.oid) > 0,
       EXISTS (SELECT FROM pg_stat_progress_create_index p WHERE p.relid = c.oid)
       OR EXISTS (SELECT FROM pg_locks l
                   WHERE l.locktype = 'relation' AND l.relation = c.oid AND l.granted
                     AND l.mode = 'ShareUpdateExclusiveLock' AND l.pid <> pg_backend_pid()),
       c.relowner::regrole::text, pg_has_role(c.relowner, 'USAGE')
  FROM pg_inherits i
  JOIN pg_class c ON c.oid = i.inhrelid
  JOIN pg_index x ON x.indrelid = c.oid AND x.indisprimary AND x.indisvalid
  JOIN pg_class pk ON pk.oid = x.indexrelid
 WHERE i.inhparent = $1::oid AND NOT i.inhdetachpending
   AND c.relnamespace = (SELECT relnamespace FROM pg_class WHERE oid = $1::oid)`

// leftoverSQL lists the invalid indexes an interrupted REINDEX ...
// CONCURRENTLY leaves on the archive's partitions, at any depth (a leaf of a
// month partitioned itself, rebuilt by hand), except on a partition
// where an index is being built now (it may be that REINDEX, still running).
// $2 limits the list to one partition when it is not empty.
const leftoverSQL = `
SELECT c.relname, ix.relname, c.relowner::regrole::text, pg_has_role(c.relowner, 'USAGE')
  FROM pg_partition_tree($1::oid::regclass) t
  JOIN pg_class c ON c.oid = t.relid
  JOIN pg_index x ON x.indrelid = c.oid AND NOT x.indisvalid
  JOIN pg_class ix ON ix.oid = x.indexrelid
 WHERE t.relid <> $1::oid AND ($2 = '' OR c.relname = $2)
   AND ix.relname ~ '_cc(new|old)[0-9]*$'
   AND c.relnamespace = (SELECT relnamespace FROM pg_class WHERE oid = $1::oid)
   AND NOT EXISTS (SELECT FROM pg_stat_progress_create_index p WHERE p.relid = c.oid)
   AND NOT EXISTS (SELECT FROM pg_locks l
                    WHERE l.locktype = 'relation' AND l.relation = c.oid AND l.granted
                      AND l.mode = 'ShareUpdateExclusiveLock' AND l.pid <> pg_backend_pid())
 ORDER BY 1, 2`

// leftover is an invalid index an interrupted rebuild left; owned says
// whether this session's user has the privileges of owner, the partition's
// owner, which DROP INDEX needs.
type leftover struct {
	partition, index, owner string
	owned                   bool
}

func listLeftovers(ctx context.Context, conn *pgx.Conn, tbl table, partition string) ([]leftover, error) {
	rows, err := conn.Query(ctx, leftoverSQL, tbl.oid, partition)
	if err != nil {
		return nil, fmt.Errorf("list indexes left by interrupted rebuilds: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (leftover, error) {
		var l leftover
		return l, r.Scan(&l.partition, &l.index, &l.owner, &l.owned)
	})
	if err != nil {
		return nil, fmt.Errorf("list indexes left by interrupted rebuilds: %w", err)
	}
	return out, nil
}

func listPKs(ctx context.Context, conn *pgx.Conn, tbl table) (map[string]pkIndex, error) {
	rows, err := conn.Query(ctx, pkSQL, tbl.oid)
	if err != nil {
		return nil, fmt.Errorf("list primary keys: %w", err)
	}
	pks, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (pkIndex, error) {
		var p pkIndex
		return p, r.Scan(&p.partition, &p.index, &p.comment, &p.hasRows, &p.building, &p.owner, &p.owned)
	})
	if err != nil {
		return nil, fmt.Errorf("list primary keys: %w", err)
	}
	out := make(map[string]pkIndex, len(pks))
	for _, p := range pks {
		out[p.partition] = p
	}
	return out, nil
}

// closedMonths returns the partitions that may be compacted, newest first:
// whole UTC months, attached, in the archive's schema, not retired by this
// run, ending at or before the start of the month before now's.
func closedMonths(parts []Partition, retiring map[string]bool, now time.Time) []Partition {
	limit := MonthStart(now).AddDate(0, -1, 0)
	var out []Partition
	for _, p := range parts {
		if p.readable() && !p.DetachPending && p.elsewhere == "" && isMonth(p.From, p.To) && !p.To.After(limit) && !retiring[p.Name] {
			out = append(out, p)
		}
	}
	slices.SortFunc(out, func(a, b Partition) int { return b.From.Compare(a.From) })
	return out
}

// mayCompact is the last check before a rebuild: p must end at or before the
// start of the month before now's, whatever chose it.
func mayCompact(p Partition, now time.Time) error {
	if !p.readable() || p.To.IsZero() || p.To.After(MonthStart(now).AddDate(0, -1, 0)) {
		return fmt.Errorf("refused to compact %s: it is not a month closed before the previous one", p.Name)
	}
	return nil
}

// budget is the time a rebuild starting now may take: the statement
// timeout, shortened to end compactMargin before ctx's deadline.
func (m *Manager) budget(ctx context.Context) time.Duration {
	b := m.cfg.StatementTimeout
	if dl, ok := ctx.Deadline(); ok {
		b = min(b, time.Until(dl)-compactMargin)
	}
	return b.Truncate(time.Millisecond)
}

// timedOutAfter returns the budget recorded by a rebuild that timed out.
func timedOutAfter(comment string) (time.Duration, bool) {
	rest, ok := strings.CutPrefix(comment, timedOutPrefix)
	if !ok {
		return 0, false
	}
	d, err := time.ParseDuration(rest)
	return d, err == nil
}

// compactStatements are a rebuild of pk on partition.
func compactStatements(tbl table, pk string) []string {
	idx := tbl.sibling(pk)
	return []string{
		fmt.Sprintf("ALTER INDEX %s SET (fillfactor = 100)", idx),
		fmt.Sprintf("REINDEX INDEX CONCURRENTLY %s", idx),
		fmt.Sprintf("COMMENT ON INDEX %s IS %s", idx, quote(compactedMark)),
	}
}

func dropStatement(tbl table, index string) string {
	return fmt.Sprintf("DROP INDEX CONCURRENTLY IF EXISTS %s", tbl.sibling(index))
}

// quote renders s as a string literal that reads the same whatever the
// session's standard_conforming_strings says: one holding a backslash (a
// schema named so) is an escape string, E'...', with the backslash
// doubled; with the setting off, a plain literal would read it as an
// escape, and name another table, or none.
func quote(s string) string {
	s = strings.ReplaceAll(s, "'", "''")
	if strings.Contains(s, `\`) {
		return `E'` + strings.ReplaceAll(s, `\`, `\\`) + "'"
	}
	return "'" + s + "'"
}

// dropLeftovers drops the invalid indexes interrupted rebuilds left on the
// archive's partitions, every run whether it compacts or not: a rebuild
// killed after its build phase (a run's, or an operator's REINDEX ...
// CONCURRENTLY by hand) leaves a unique index that every insert into the
// month still writes and checks, and nothing else would ever drop it. It
// records into res and returns the errors of the drops that failed; a
// cancelled ctx stops it with ctx's error.
func (m *Manager) dropLeftovers(ctx context.Context, conn *pgx.Conn, tbl table, dryRun bool, res *Result) []error {
	var errs []error
	leftovers, err := listLeftovers(ctx, conn, tbl, "")
	if err != nil {
		return append(errs, err)
	}
	for _, l := range leftovers {
		if !l.owned {
			// Not the run's to drop, and every run would fail trying (as
			// a rebuild by hand of a month the run cannot compact, when
			// interrupted, leaves one): reported, as compaction reports
			// the month.
			res.Foreign = append(res.Foreign, Foreign{Name: l.partition, Problem: fmt.Sprintf(
				"an invalid index %s left by an interrupted rebuild, owned by %s, whose privileges this run's user does not have: drop it as %s (DROP INDEX CONCURRENTLY)", l.index, l.owner, l.owner)})
			continue
		}
		res.Statements = append(res.Statements, dropStatement(tbl, l.index))
		if !dryRun {
			if err := m.dropIndex(ctx, conn, tbl, l.index, max(m.cfg.LockTimeout, m.cfg.StatementTimeout)); err != nil {
				if ctx.Err() != nil {
					res.cutShort("compact", l.partition, fmt.Errorf("drop index %s left by an interrupted rebuild: %w (interrupted: the run's context ended)", l.index, err))
					return append(errs, err)
				}
				res.Failed = append(res.Failed, Failure{Action: "compact", Partition: l.partition, Error: err.Error()})
				errs = append(errs, fmt.Errorf("%w: drop index %s left by an interrupted rebuild of partition %s: %w", ErrIncomplete, l.index, l.partition, err))
				continue
			}
		}
		res.DroppedIndexes = append(res.DroppedIndexes, l.index)
	}
	return errs
}

// compaction compacts up to Config.CompactPerRun closed partitions (see
// Compaction), after dropLeftovers. It records into res and returns the
// errors of the steps that failed; a cancelled ctx stops it with ctx's
// error.
func (m *Manager) compaction(ctx context.Context, conn *pgx.Conn, tbl table, parts []Partition, retiring map[string]bool, now time.Time, dryRun bool, res *Result) []error {
	var errs []error
	fail := func(partition string, err error) {
		res.Failed = append(res.Failed, Failure{Action: "compact", Partition: partition, Error: err.Error()})
		errs = append(errs, fmt.Errorf("%w: compact partition %s: %w", ErrIncomplete, partition, err))
	}
	pks, err := listPKs(ctx, conn, tbl)
	if err != nil {
		return append(errs, err)
	}
	done := 0
	for _, p := range closedMonths(parts, retiring, now) {
		pk, ok := pks[p.Name]
		pending := func(format string, args ...any) {
			res.CompactPending = append(res.CompactPending, Pending{Partition: p.Name, Reason: fmt.Sprintf(format, args...)})
		}
		budget := m.budget(ctx)
		switch had, timedOut := timedOutAfter(pk.comment); {
		case !ok:
			pending("it has no valid primary-key index")
			continue
		case pk.comment == compactedMark || !pk.hasRows:
			continue
		case pk.building:
			pending("another session holds it now (an index build, or a vacuum)")
			continue
		case !pk.owned:
			// Not counted against CompactPerRun, nor a failure: a month
			// that every run would fail to rebuild would otherwise take
			// the run's turn each day, and the older months would wait
			// forever behind it.
			pending("it is owned by %s, whose privileges this run's user does not have: give it back to the archive's owner role (ALTER TABLE ... OWNER TO), or rebuild it by hand as %s", pk.owner, pk.owner)
			continue
		case timedOut && had >= budget:
			pending("an earlier rebuild timed out after %s and this run has %s: rebuild it by hand or with a longer PARTITION_STATEMENT_TIMEOUT", had, budget)
			continue
		case done >= m.cfg.CompactPerRun:
			pending("this run compacted the %d partitions a run may (PARTITION_COMPACT_PER_RUN)", m.cfg.CompactPerRun)
			continue
		case budget < min(minCompactBudget, m.cfg.StatementTimeout):
			pending("%s left before the run's deadline, under the %s a rebuild is started with", budget+compactMargin, minCompactBudget+compactMargin)
			continue
		}
		if err := mayCompact(p, now); err != nil {
			fail(p.Name, err)
			continue
		}
		done++
		res.Statements = append(res.Statements, compactStatements(tbl, pk.index)...)
		if !dryRun {
			timedOut, err := m.compact(ctx, conn, tbl, pk, budget)
			if err != nil {
				if ctx.Err() != nil {
					res.cutShort("compact", p.Name, fmt.Errorf("%w (interrupted: the run's context ended; an invalid index the rebuild left is dropped by the next run)", err))
					return append(errs, err)
				}
				fail(p.Name, err)
				if timedOut {
					pending("the rebuild timed out after %s", budget)
				} else {
					pending("the rebuild failed (see failed)")
				}
				continue
			}
		}
		res.Compacted = append(res.Compacted, p.Name)
	}
	return errs
}

// compact rebuilds pk within budget. When the rebuild fails it drops what
// the rebuild left and puts the fillfactor back; timedOut reports a rebuild
// that ran out of its budget (and was marked so).
func (m *Manager) compact(ctx context.Context, conn *pgx.Conn, tbl table, pk pkIndex, budget time.Duration) (timedOut bool, err error) {
	stmts := compactStatements(tbl, pk.index)
	ddl := database.Timeouts(m.cfg.LockTimeout, m.cfg.StatementTimeout)
	if err := database.InTx(ctx, conn, ddl, func(tx pgx.Tx) error { return execTraced(ctx, tx, stmts[0]) }); err != nil {
		return false, fmt.Errorf("%s: %w", stmts[0], err)
	}
	// The index's OID before the rebuild: the swap gives pk's name to the
	// index REINDEX built, so a changed OID says the swap happened.
	before, err := indexOID(ctx, conn, tbl, pk)
	if err != nil {
		return false, err
	}
	// REINDEX ... CONCURRENTLY waits for older transactions, a wait that
	// lock_timeout would cut short; it blocks no reader or writer meanwhile.
	start := time.Now()
	err = m.inSession(ctx, conn, database.Timeouts(budget, budget), func() error { return execTraced(ctx, conn, stmts[1]) })
	if err == nil {
		err = database.InTx(ctx, conn, ddl, func(tx pgx.Tx) error { return execTraced(ctx, tx, stmts[2]) })
		if err != nil {
			// The index is rebuilt; the next run rebuilds it again.
			return false, fmt.Errorf("%s: %w", stmts[2], err)
		}
		return false, nil
	}
	err = fmt.Errorf("%s: %w", stmts[1], err)
	timedOut = ctx.Err() == nil && time.Since(start) >= budget &&
		slices.Contains([]string{database.CodeQueryCanceled, database.CodeLockNotAvailable}, database.SQLState(err))
	// The cleanup has compactMargin, which the budget left before the
	// deadline; what it cannot finish, the next run does.
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), compactMargin)
	defer cancel()
	if swapped, serr := m.finishSwapped(cctx, conn, tbl, pk, before, stmts[2]); serr != nil || swapped {
		// REINDEX stopped after it had swapped the rebuilt index in (its
		// last wait, for the old index's users, ran out): the primary key
		// is compacted, and only the old index is left to drop.
		return false, serr
	}
	if cerr := m.cleanUp(cctx, conn, tbl, pk, timedOut, budget); cerr != nil {
		err = fmt.Errorf("%w (and the cleanup: %w; the next run drops what is left)", err, cerr)
	}
	if timedOut {
		err = fmt.Errorf("%w: the rebuild had %s; later runs skip it until they have longer", err, budget)
	}
	return timedOut, err
}

// indexOID returns the OID of the index named like pk's primary key, 0 when
// there is none.
func indexOID(ctx context.Context, conn *pgx.Conn, tbl table, pk pkIndex) (uint32, error) {
	var oid uint32
	if err := conn.QueryRow(ctx, "SELECT coalesce(to_regclass($1)::oid, 0)", tbl.sibling(pk.index)).Scan(&oid); err != nil {
		return 0, fmt.Errorf("read the primary key of %s: %w", pk.partition, err)
	}
	return oid, nil
}

// oldIndexRE matches the name REINDEX ... CONCURRENTLY gives the index it
// replaced, once it has swapped the new one in.
var oldIndexRE = regexp.MustCompile(`_ccold[0-9]*$`)

// finishSwapped completes a rebuild of pk that stopped after its swap: the
// index under pk's name is then the one REINDEX built (its OID is no longer
// before, the OID it had), and the old one an invalid <pk>_ccold. It drops
// the old index (a failure is left to the next run, which drops every
// leftover first) and marks pk compacted with mark; swapped says whether the
// rebuild had got that far. A rebuild stopped before its swap leaves the old
// index under pk's name, and an invalid <pk>_ccnew.
func (m *Manager) finishSwapped(ctx context.Context, conn *pgx.Conn, tbl table, pk pkIndex, before uint32, mark string) (swapped bool, err error) {
	now, err := indexOID(ctx, conn, tbl, pk)
	if err != nil {
		return false, err
	}
	if now == 0 || now == before {
		return false, nil
	}
	leftovers, err := listLeftovers(ctx, conn, tbl, pk.partition)
	if err != nil {
		return true, err
	}
	for _, l := range leftovers {
		if oldIndexRE.MatchString(l.index) {
			_ = m.dropIndex(ctx, conn, tbl, l.index, compactMargin/2)
		}
	}
	if err := database.InTx(ctx, conn, database.Timeouts(m.cfg.LockTimeout, m.cfg.StatementTimeout), func(tx pgx.Tx) error {
		return execTraced(ctx, tx, mark)
	}); err != nil {
		// The index is rebuilt; the next run rebuilds it again.
		return true, fmt.Errorf("%s: %w", mark, err)
	}
	return true, nil
}

// cleanUp drops the indexes a failed rebuild of pk left and resets its
// fillfactor; after a timeout it records the budget that was not enough.
func (m *Manager) cleanUp(ctx context.Context, conn *pgx.Conn, tbl table, pk pkIndex, timedOut bool, budget time.Duration) error {
	leftovers, err := listLeftovers(ctx, conn, tbl, pk.partition)
	if err != nil {
		return err
	}
	var errs []error
	for _, l := range leftovers {
		if err := m.dropIndex(ctx, conn, tbl, l.index, compactMargin/2); err != nil {
			errs = append(errs, err)
		}
	}
	idx := tbl.sibling(pk.index)
	stmts := []string{fmt.Sprintf("ALTER INDEX %s RESET (fillfactor)", idx)}
	if timedOut {
		stmts = append(stmts, fmt.Sprintf("COMMENT ON INDEX %s IS %s", idx, quote(timedOutPrefix+budget.String())))
	}
	err = database.InTx(ctx, conn, database.Timeouts(m.cfg.LockTimeout, m.cfg.StatementTimeout), func(tx pgx.Tx) error {
		for _, s := range stmts {
			if err := execTraced(ctx, tx, s); err != nil {
				return fmt.Errorf("%s: %w", s, err)
			}
		}
		return nil
	})
	return errors.Join(append(errs, err)...)
}

// dropIndex drops index concurrently: it waits for the transactions that use
// the partition, without blocking them, up to timeout.
func (m *Manager) dropIndex(ctx context.Context, conn *pgx.Conn, tbl table, index string, timeout time.Duration) error {
	stmt := dropStatement(tbl, index)
	timeout = cmp.Or(timeout.Truncate(time.Millisecond), time.Millisecond)
	if err := m.inSession(ctx, conn, database.Timeouts(timeout, timeout), func() error { return execTraced(ctx, conn, stmt) }); err != nil {
		return fmt.Errorf("%s: %w", stmt, err)
	}
	return nil
}

// inSession runs fn with settings for the session, for the statements that
// cannot run in a transaction block, and resets them afterwards.
func (m *Manager) inSession(ctx context.Context, conn *pgx.Conn, settings map[string]string, fn func() error) error {
	for k, v := range settings {
		if _, err := conn.Exec(ctx, "SELECT set_config($1, $2, false)", k, v); err != nil {
			return fmt.Errorf("set %s: %w", k, err)
		}
	}
	defer func() {
		_, _ = conn.Exec(context.WithoutCancel(ctx), "RESET lock_timeout; RESET statement_timeout")
	}()
	return fn()
}
