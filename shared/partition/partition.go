// Package partition keeps idempotency_key_archive partitioned by UTC month: it
// creates partitions ahead of time, retires those older than the retention, and
// reports how far ahead the newest partition reaches and how big the archive is.
//
// A missing partition does not degrade gracefully (inserts into the archive
// fail), so Run creates every month from the previous one through LeadMonths
// ahead. Bounds are UTC month starts whatever the server's or session's
// TimeZone, and partitions are named idempotency_key_archive_YYYY_MM.
//
// New partitions are built beside the table and then attached, which needs only
// a SHARE UPDATE EXCLUSIVE lock on the archive (CREATE TABLE ... PARTITION OF
// would take ACCESS EXCLUSIVE and stall every lookup behind it). Old partitions
// are detached with DETACH PARTITION ... CONCURRENTLY and dropped; a detach that
// was interrupted is finalized on the next run. Runs hold an advisory lock, so
// they are safe to run concurrently with each other and with sweepers.
//
//	m, err := partition.NewManager(pool, partition.Config{LeadMonths: 3}, emitter)
//	res, err := m.Run(ctx, false)
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
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemarchive/idemarchive/shared/database"
	"github.com/idemarchive/idemarchive/shared/metrics"
	"github.com/idemarchive/idemarchive/shared/tracing"
)

// ArchiveTable is the partitioned parent table.
const ArchiveTable = "idempotency_key_archive"

// Config configures the partition manager.
type Config struct {
	// LeadMonths is how many months after the current one must have a
	// partition. Default 3; at least 2 (the runbook's minimum lead).
	LeadMonths int
	// RetentionMonths is how many whole months before the current one are
	// kept. Partitions whose upper bound is older than the start of the current
	// month minus RetentionMonths are detached and dropped. 0 (default) keeps
	// every partition forever; the current month is never retired.
	RetentionMonths int
	// LockTimeout bounds each wait for a table lock (lock_timeout). Default 5s.
	LockTimeout time.Duration
	// StatementTimeout bounds each DDL statement (statement_timeout). DETACH
	// ... CONCURRENTLY waits for transactions that use the partition, so give
	// it room. Default 2 minutes.
	StatementTimeout time.Duration
	// Now returns the current time. Default time.Now; tests move it.
	Now func() time.Time
}

// WithDefaults returns c with zero fields set to their defaults.
func (c Config) WithDefaults() Config {
	c.LeadMonths = cmp.Or(c.LeadMonths, 3)
	c.LockTimeout = cmp.Or(c.LockTimeout, 5*time.Second)
	c.StatementTimeout = cmp.Or(c.StatementTimeout, 2*time.Minute)
	if c.Now == nil {
		c.Now = time.Now
	}
	return c
}

// Validate reports a configuration that would leave the archive exposed.
func (c Config) Validate() error {
	switch {
	case c.LeadMonths < 2:
		return fmt.Errorf("partition lead must be at least 2 months, got %d", c.LeadMonths)
	case c.LeadMonths > 120:
		return fmt.Errorf("partition lead of %d months is more than 10 years", c.LeadMonths)
	case c.RetentionMonths < 0:
		return fmt.Errorf("partition retention must not be negative (0 keeps everything), got %d", c.RetentionMonths)
	case c.LockTimeout <= 0 || c.StatementTimeout <= 0:
		return errors.New("partition lock and statement timeouts must be positive")
	}
	return nil
}

// Partition is one attached (or detach-pending) partition of the archive.
type Partition struct {
	Name          string    `json:"name"`
	From          time.Time `json:"from"` // inclusive; zero for MINVALUE
	To            time.Time `json:"to"`   // exclusive; zero for MAXVALUE
	DetachPending bool      `json:"detach_pending,omitempty"`
}

// Result reports what a run did (or, in a dry run, would do).
type Result struct {
	DryRun     bool     `json:"dry_run"`
	Created    []string `json:"created"`
	Retired    []string `json:"retired"`
	Finalized  []string `json:"finalized"`
	Statements []string `json:"statements"`
	// NewestUpperBound is the exclusive upper bound of the newest partition.
	NewestUpperBound time.Time `json:"newest_upper_bound"`
	// NewestPartitionDays is the number of days from now to NewestUpperBound.
	NewestPartitionDays float64 `json:"newest_partition_days"`
	ArchiveBytes        int64   `json:"archive_bytes"`
	// ArchiveRows is PostgreSQL's estimate (pg_class.reltuples), refreshed by
	// autovacuum and ANALYZE; it costs nothing to read.
	ArchiveRows int64 `json:"archive_rows"`
}

// Manager creates and retires archive partitions.
type Manager struct {
	pool    *pgxpool.Pool
	cfg     Config
	metrics *metrics.Emitter
}

// NewManager validates cfg (after defaults) and returns a Manager. emitter may
// be nil.
func NewManager(pool *pgxpool.Pool, cfg Config, emitter *metrics.Emitter) (*Manager, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Manager{pool: pool, cfg: cfg, metrics: emitter}, nil
}

// MonthStart returns the first instant of t's month in UTC.
func MonthStart(t time.Time) time.Time {
	t = t.UTC()
	return time.Date(t.Year(), t.Month(), 1, 0, 0, 0, 0, time.UTC)
}

// Name returns the partition name for the UTC month starting at month.
func Name(month time.Time) string {
	return fmt.Sprintf("%s_%04d_%02d", ArchiveTable, month.Year(), int(month.Month()))
}

// Covers reports whether one attached partition in parts covers the whole UTC
// month starting at month.
func Covers(parts []Partition, month time.Time) bool {
	end := month.AddDate(0, 1, 0)
	return slices.ContainsFunc(parts, func(p Partition) bool {
		return !p.DetachPending && !p.From.After(month) && (p.To.IsZero() || !p.To.Before(end))
	})
}

// step is one unit of DDL: statements that run in one transaction, or alone
// when they cannot run in a transaction.
type step struct {
	kind       string // "create", "retire", "finalize"
	partition  string
	statements []string
	inTx       bool
}

// Run ensures partitions through LeadMonths ahead, retires expired ones,
// emits the partition metrics, and reports what it did. With dryRun it only
// plans and returns the DDL it would run.
func (m *Manager) Run(ctx context.Context, dryRun bool) (Result, error) {
	res := Result{DryRun: dryRun, Created: []string{}, Retired: []string{}, Finalized: []string{}, Statements: []string{}}
	conn, err := m.pool.Acquire(ctx)
	if err != nil {
		return res, fmt.Errorf("acquire connection: %w", err)
	}
	defer conn.Release()

	if !dryRun {
		unlock, err := advisoryLock(ctx, conn.Conn())
		if err != nil {
			return res, err
		}
		defer unlock()
	}

	tbl, err := lookupTable(ctx, conn.Conn())
	if err != nil {
		return res, err
	}
	parts, err := list(ctx, conn.Conn())
	if err != nil {
		return res, err
	}
	now := m.cfg.Now()
	orphans, err := listOrphans(ctx, conn.Conn(), tbl)
	if err != nil {
		return res, err
	}
	steps, err := m.plan(tbl, parts, orphans, now)
	if err != nil {
		return res, err
	}
	for _, s := range steps {
		res.Statements = append(res.Statements, s.statements...)
		if !dryRun {
			if err := m.execute(ctx, conn.Conn(), s); err != nil {
				return res, err
			}
		}
		switch s.kind {
		case "create":
			res.Created = append(res.Created, s.partition)
		case "retire":
			res.Retired = append(res.Retired, s.partition)
		case "finalize":
			res.Finalized = append(res.Finalized, s.partition)
		}
	}

	if dryRun {
		return res, nil
	}
	if parts, err = list(ctx, conn.Conn()); err != nil {
		return res, err
	}
	for _, p := range parts {
		if !p.DetachPending && p.To.After(res.NewestUpperBound) {
			res.NewestUpperBound = p.To
		}
	}
	if !res.NewestUpperBound.IsZero() {
		res.NewestPartitionDays = res.NewestUpperBound.Sub(now).Hours() / 24
	}
	if err := conn.QueryRow(ctx, sizeSQL, tbl.oid).Scan(&res.ArchiveBytes, &res.ArchiveRows); err != nil {
		return res, fmt.Errorf("measure archive size: %w", err)
	}
	m.metrics.Emit(
		metrics.Value{Name: metrics.ArchiveNewestPartitionDays, Unit: metrics.UnitNone, Value: res.NewestPartitionDays},
		metrics.Value{Name: metrics.ArchiveBytes, Unit: metrics.UnitBytes, Value: float64(res.ArchiveBytes)},
		metrics.Count(metrics.ArchiveRows, res.ArchiveRows),
	)
	return res, nil
}

// EnsureMonth creates the partition for the UTC month containing t unless one
// already covers it. The sweeper calls it when a batch hits a month without a
// partition. It returns the DDL it ran (none when the month was covered).
func (m *Manager) EnsureMonth(ctx context.Context, t time.Time) ([]string, error) {
	conn, err := m.pool.Acquire(ctx)
	if err != nil {
		return nil, fmt.Errorf("acquire connection: %w", err)
	}
	defer conn.Release()
	unlock, err := advisoryLock(ctx, conn.Conn())
	if err != nil {
		return nil, err
	}
	defer unlock()

	tbl, err := lookupTable(ctx, conn.Conn())
	if err != nil {
		return nil, err
	}
	parts, err := list(ctx, conn.Conn())
	if err != nil {
		return nil, err
	}
	s, err := createStep(tbl, parts, MonthStart(t))
	if err != nil || s == nil {
		return nil, err
	}
	if err := m.execute(ctx, conn.Conn(), *s); err != nil {
		return nil, err
	}
	return s.statements, nil
}

func (m *Manager) plan(tbl table, parts []Partition, orphans []string, now time.Time) ([]step, error) {
	var steps []step
	// Finish interrupted detaches first: a detach-pending partition blocks
	// another concurrent detach of the same table.
	for _, p := range parts {
		if p.DetachPending {
			steps = append(steps, step{kind: "finalize", partition: p.Name, statements: []string{
				fmt.Sprintf("ALTER TABLE %s DETACH PARTITION %s FINALIZE", tbl.qualified(), tbl.sibling(p.Name)),
				fmt.Sprintf("DROP TABLE %s", tbl.sibling(p.Name)),
			}})
		}
	}

	// From the previous month: right after midnight on the 1st, the sweeper
	// still archives keys that expired last month, and a fresh install needs
	// that month too.
	current := MonthStart(now)
	for i := -1; i <= m.cfg.LeadMonths; i++ {
		s, err := createStep(tbl, parts, current.AddDate(0, i, 0))
		if err != nil {
			return nil, err
		}
		if s != nil {
			steps = append(steps, *s)
		}
	}

	if m.cfg.RetentionMonths > 0 {
		cutoff := current.AddDate(0, -m.cfg.RetentionMonths, 0)
		for _, p := range parts {
			if p.DetachPending || p.To.IsZero() || p.To.After(cutoff) {
				continue
			}
			steps = append(steps, step{kind: "retire", partition: p.Name, statements: []string{
				fmt.Sprintf("ALTER TABLE %s DETACH PARTITION %s CONCURRENTLY", tbl.qualified(), tbl.sibling(p.Name)),
				fmt.Sprintf("DROP TABLE %s", tbl.sibling(p.Name)),
			}})
		}
		// A partition detached by an earlier run whose DROP failed.
		for _, name := range orphans {
			month, err := time.Parse("2006_01", strings.TrimPrefix(name, ArchiveTable+"_"))
			if err != nil || month.AddDate(0, 1, 0).After(cutoff) {
				continue
			}
			steps = append(steps, step{kind: "retire", partition: name, statements: []string{
				fmt.Sprintf("DROP TABLE IF EXISTS %s", tbl.sibling(name)),
			}})
		}
	}
	return steps, nil
}

// createStep plans the partition for month, or returns nil when a partition
// with exactly its bounds exists. A partition that overlaps the month with other
// bounds (one created by hand in a local time zone, say) is an error that names
// it, rather than a doomed ATTACH.
func createStep(tbl table, parts []Partition, month time.Time) (*step, error) {
	from, to := month, month.AddDate(0, 1, 0)
	for _, p := range parts {
		if p.From.Equal(from) && p.To.Equal(to) {
			return nil, nil
		}
		overlaps := (p.From.IsZero() || p.From.Before(to)) && (p.To.IsZero() || p.To.After(from))
		if overlaps {
			return nil, fmt.Errorf("partition %s covers [%s, %s), which overlaps UTC month %s: re-create it with UTC month bounds",
				p.Name, formatBound(p.From), formatBound(p.To), month.Format("2006-01"))
		}
	}
	name := Name(month)
	part := tbl.sibling(name)
	check := pgx.Identifier{name + "_bounds"}.Sanitize()
	lo, hi := literal(from), literal(to)
	stmts := []string{
		// IF NOT EXISTS re-attaches a month detached by an interrupted retirement.
		fmt.Sprintf("CREATE TABLE IF NOT EXISTS %s (LIKE %s INCLUDING DEFAULTS INCLUDING CONSTRAINTS)", part, tbl.qualified()),
		// The CHECK constraint lets ATTACH skip scanning the new table.
		fmt.Sprintf("ALTER TABLE %s ADD CONSTRAINT %s CHECK (expired_at IS NOT NULL AND expired_at >= %s AND expired_at < %s)", part, check, lo, hi),
		fmt.Sprintf("ALTER TABLE %s ATTACH PARTITION %s FOR VALUES FROM (%s) TO (%s)", tbl.qualified(), part, lo, hi),
		fmt.Sprintf("ALTER TABLE %s DROP CONSTRAINT %s", part, check),
		// Keep every partition with the archive's owner, so that whoever may
		// manage the archive may later detach and drop it.
		fmt.Sprintf("ALTER TABLE %s OWNER TO %s", part, pgx.Identifier{tbl.owner}.Sanitize()),
	}
	return &step{kind: "create", partition: name, statements: stmts, inTx: true}, nil
}

func (m *Manager) execute(ctx context.Context, conn *pgx.Conn, s step) error {
	settings := database.Timeouts(m.cfg.LockTimeout, m.cfg.StatementTimeout)
	if s.inTx {
		err := database.InTx(ctx, conn, settings, func(tx pgx.Tx) error {
			for _, stmt := range s.statements {
				if err := execTraced(ctx, tx, stmt); err != nil {
					return fmt.Errorf("%s: %w", stmt, err)
				}
			}
			return nil
		})
		if err != nil {
			return fmt.Errorf("%s partition %s: %w", s.kind, s.partition, err)
		}
		return nil
	}
	// DETACH ... CONCURRENTLY cannot run inside a transaction block: set the
	// timeouts for the session and put them back afterwards.
	for k, v := range settings {
		if _, err := conn.Exec(ctx, "SELECT set_config($1, $2, false)", k, v); err != nil {
			return fmt.Errorf("set %s: %w", k, err)
		}
	}
	defer func() {
		_, _ = conn.Exec(context.WithoutCancel(ctx), "RESET lock_timeout; RESET statement_timeout")
	}()
	for _, stmt := range s.statements {
		if err := execTraced(ctx, conn, stmt); err != nil {
			return fmt.Errorf("%s partition %s: %s: %w", s.kind, s.partition, stmt, err)
		}
	}
	return nil
}

// execTraced runs one DDL statement inside its own trace subsegment.
func execTraced(ctx context.Context, db interface {
	Exec(context.Context, string, ...any) (pgconn.CommandTag, error)
}, stmt string) error {
	return tracing.Span(ctx, "partition.ddl", func(ctx context.Context) error {
		_, err := db.Exec(ctx, stmt)
		return err
	})
}

// advisoryLock serializes partition DDL per archive table (and so per schema).
func advisoryLock(ctx context.Context, conn *pgx.Conn) (func(), error) {
	const key = `hashtextextended('idempotency_key_archive partitions ' || current_schema(), 0)`
	if _, err := conn.Exec(ctx, "SELECT pg_advisory_lock("+key+")"); err != nil {
		return nil, fmt.Errorf("take partition advisory lock: %w", err)
	}
	return func() {
		_, _ = conn.Exec(context.WithoutCancel(ctx), "SELECT pg_advisory_unlock("+key+")")
	}, nil
}

// table identifies the archive's parent table.
type table struct {
	oid    uint32
	schema string
	owner  string
}

func (t table) qualified() string { return pgx.Identifier{t.schema, ArchiveTable}.Sanitize() }

func (t table) sibling(name string) string { return pgx.Identifier{t.schema, name}.Sanitize() }

const tableSQL = `
SELECT c.oid, n.nspname, pg_get_userbyid(c.relowner)
  FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
 WHERE c.oid = to_regclass('idempotency_key_archive')`

func lookupTable(ctx context.Context, conn *pgx.Conn) (table, error) {
	var t table
	err := conn.QueryRow(ctx, tableSQL).Scan(&t.oid, &t.schema, &t.owner)
	if errors.Is(err, pgx.ErrNoRows) {
		return t, errors.New("table idempotency_key_archive not found on the search_path: run `archivectl migrate` first")
	}
	if err != nil {
		return t, fmt.Errorf("find archive table: %w", err)
	}
	return t, nil
}

const listSQL = `
SELECT c.relname, pg_get_expr(c.relpartbound, c.oid), i.inhdetachpending
  FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
 WHERE i.inhparent = to_regclass('idempotency_key_archive')
 ORDER BY c.relname`

// orphansSQL lists tables named like monthly partitions, in the archive's
// schema, that are not attached to it.
const orphansSQL = `
SELECT c.relname
  FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
 WHERE n.nspname = $1 AND c.relkind = 'r' AND NOT c.relispartition
   AND c.relname ~ '^idempotency_key_archive_[0-9]{4}_[0-9]{2}$'
 ORDER BY c.relname`

func listOrphans(ctx context.Context, conn *pgx.Conn, tbl table) ([]string, error) {
	rows, err := conn.Query(ctx, orphansSQL, tbl.schema)
	if err != nil {
		return nil, fmt.Errorf("list detached partitions: %w", err)
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("list detached partitions: %w", err)
	}
	return names, nil
}

const sizeSQL = `
SELECT coalesce(sum(pg_total_relation_size(t.relid)), 0)::bigint,
       coalesce(sum(greatest(c.reltuples, 0)), 0)::bigint
  FROM pg_partition_tree($1::oid::regclass) t JOIN pg_class c ON c.oid = t.relid
 WHERE t.isleaf`

// List returns the archive's partitions with their bounds in UTC.
func List(ctx context.Context, pool *pgxpool.Pool) ([]Partition, error) {
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return nil, fmt.Errorf("acquire connection: %w", err)
	}
	defer conn.Release()
	return list(ctx, conn.Conn())
}

func list(ctx context.Context, conn *pgx.Conn) ([]Partition, error) {
	var parts []Partition
	// pg_get_expr prints timestamptz bounds in the session's TimeZone and
	// DateStyle: pin both so that the text parses the same everywhere.
	err := database.InTx(ctx, conn, map[string]string{"TimeZone": "UTC", "DateStyle": "ISO, YMD"}, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, listSQL)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var p Partition
			var bound string
			if err := rows.Scan(&p.Name, &bound, &p.DetachPending); err != nil {
				return err
			}
			if p.From, p.To, err = parseBound(bound); err != nil {
				return fmt.Errorf("partition %s: %w", p.Name, err)
			}
			parts = append(parts, p)
		}
		return rows.Err()
	})
	if err != nil {
		return nil, fmt.Errorf("list archive partitions: %w", err)
	}
	return parts, nil
}

var boundRE = regexp.MustCompile(`^FOR VALUES FROM \((MINVALUE|'[^']*')\) TO \((MAXVALUE|'[^']*')\)$`)

// parseBound parses "FOR VALUES FROM ('2026-09-01 00:00:00+00') TO (...)" as
// printed under TimeZone UTC. MINVALUE and MAXVALUE come back as zero times.
func parseBound(s string) (from, to time.Time, err error) {
	m := boundRE.FindStringSubmatch(s)
	if m == nil {
		return from, to, fmt.Errorf("unexpected partition bound %q", s)
	}
	if from, err = parseTimestamp(m[1]); err != nil {
		return from, to, err
	}
	to, err = parseTimestamp(m[2])
	return from, to, err
}

func parseTimestamp(s string) (time.Time, error) {
	switch s {
	case "MINVALUE", "MAXVALUE", "'-infinity'", "'infinity'":
		return time.Time{}, nil
	}
	t, err := time.Parse("2006-01-02 15:04:05-07", strings.Trim(s, "'"))
	if err != nil {
		return time.Time{}, fmt.Errorf("unexpected partition bound %s", s)
	}
	return t.UTC(), nil
}

// literal renders t as a timestamptz literal with an explicit UTC offset, so
// that its meaning does not depend on the session's TimeZone.
func literal(t time.Time) string { return "'" + t.UTC().Format("2006-01-02 15:04:05+00") + "'" }

func formatBound(t time.Time) string {
	if t.IsZero() {
		return "unbounded"
	}
	return t.UTC().Format(time.RFC3339)
}
