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
// are detached with DETACH PARTITION ... CONCURRENTLY and dropped. Runs hold an
// advisory lock, so they are safe to run concurrently with each other and with
// sweepers.
//
// The archive is permanent unless a retention says otherwise, so dropping is
// the one step that can lose data, and it is fenced in:
//
//   - Config.Validate bounds RetentionMonths to 0 (keep forever) through
//     MaxRetentionMonths, so the cutoff arithmetic cannot overflow.
//   - Every DROP comes from retireStep, which asks mayRetire first. mayRetire
//     does not trust the cutoff: it counts whole months with integers and
//     refuses a partition that reaches into the current month or later, or
//     that ends fewer than RetentionMonths months before it. A refusal is
//     reported in Result.Refused and makes Run fail.
//   - A month still inside the retention that was detached (a DETACH ...
//     CONCURRENTLY interrupted, or a detach by hand) is attached again with its
//     rows, never dropped.
//
// A run with Config.CompactPerRun > 0 also rebuilds the primary key of months
// closed for a whole month, which the sweeper's random-order inserts leave
// about half empty, with REINDEX INDEX CONCURRENTLY (see compact.go: what it
// touches, how it is bounded and how an interrupted rebuild is repaired).
//
// Partitions the manager did not make (a DEFAULT partition, bounds that are not
// one UTC month) are reported in Result.Foreign with what to do, and the rest
// is still managed; a step that fails is reported in Result.Failed and the run
// goes on with the others.
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
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemarchive/idemarchive/shared/database"
	"github.com/idemarchive/idemarchive/shared/metrics"
	"github.com/idemarchive/idemarchive/shared/plainkeys"
	"github.com/idemarchive/idemarchive/shared/tracing"
)

// ArchiveTable is the partitioned parent table.
const ArchiveTable = "idempotency_key_archive"

// MaxRetentionMonths is the longest retention Config accepts: 100 years.
// Someone who types a huge number means "forever", which is 0; and month
// arithmetic on a huge number overflows into the future, where every partition
// would look expired.
const MaxRetentionMonths = 1200

// MaxLeadMonths is the longest lead Config accepts: 10 years.
const MaxLeadMonths = 120

// Config configures the partition manager.
type Config struct {
	// LeadMonths is how many months after the current one must have a
	// partition. Default 3; 2 to MaxLeadMonths (2 is the runbook's minimum
	// lead).
	LeadMonths int
	// RetentionMonths is how many whole months before the current one are
	// kept. Partitions whose upper bound is at or before the start of the
	// current month minus RetentionMonths are detached and dropped. 0 (default)
	// keeps every partition forever; at most MaxRetentionMonths. The current
	// month and later months are never retired.
	RetentionMonths int
	// LockTimeout bounds each wait for a table lock (lock_timeout). Default 5s;
	// at least 1ms (PostgreSQL reads 0 as "wait forever").
	LockTimeout time.Duration
	// StatementTimeout bounds each DDL statement (statement_timeout). DETACH
	// ... CONCURRENTLY waits for transactions that use the partition, so give
	// it room. Default 2 minutes; at least 1ms.
	StatementTimeout time.Duration
	// CompactPerRun is how many closed partitions a run rebuilds the primary
	// key of, at most (Result.Compacted). 0, the default, compacts none and
	// leaves every index alone; at most MaxCompactPerRun. Each rebuild gets
	// StatementTimeout, shortened to end 30 s before the run's deadline.
	CompactPerRun int
	// Now returns the current time, used as is (tests move it). Default:
	// both clocks, the host's and the database's now(): months are created
	// from the later of the two, and retired by the earlier, so a host
	// clock that runs ahead can never retire a month the archive still
	// writes to, and neither clock can leave a month without its partition.
	Now func() time.Time
}

// WithDefaults returns c with zero fields set to their defaults. A zero
// RetentionMonths stays 0: it means "keep forever", not "unset".
func (c Config) WithDefaults() Config {
	c.LeadMonths = cmp.Or(c.LeadMonths, 3)
	c.LockTimeout = cmp.Or(c.LockTimeout, 5*time.Second)
	c.StatementTimeout = cmp.Or(c.StatementTimeout, 2*time.Minute)
	return c
}

// dbClockSQL reads the database's clock as microseconds since 1970: a
// number reads the same in every exec mode, where a timestamp read as text
// (the exec and simple_protocol modes) parses only under DateStyle ISO.
const dbClockSQL = "SELECT (extract(epoch FROM now()) * 1000000)::int8"

// clocks returns the time months are created from and the time they are
// retired by (see Config.Now).
func (m *Manager) clocks(ctx context.Context, conn *pgx.Conn) (create, retire time.Time, err error) {
	if m.cfg.Now != nil {
		now := m.cfg.Now()
		return now, now, nil
	}
	host := time.Now()
	var micros int64
	if err := conn.QueryRow(ctx, dbClockSQL).Scan(&micros); err != nil {
		return host, host, fmt.Errorf("read the database clock: %w", err)
	}
	db := time.UnixMicro(micros)
	if db.Before(host) {
		return host, db, nil
	}
	return db, host, nil
}

// ConfigError is a Config.Validate error about one field, so that a caller can
// name the field its own way (an environment variable, a flag, a payload key).
type ConfigError struct {
	// Field is the Config field: LeadMonths, RetentionMonths, LockTimeout,
	// StatementTimeout or CompactPerRun.
	Field string
	Msg   string
}

func (e *ConfigError) Error() string { return e.Msg }

// Validate reports a configuration that would leave the archive exposed. Its
// errors are *ConfigError.
func (c Config) Validate() error {
	bad := func(field, format string, args ...any) error {
		return &ConfigError{Field: field, Msg: fmt.Sprintf(format, args...)}
	}
	switch {
	case c.LeadMonths < 2:
		return bad("LeadMonths", "partition lead must be at least 2 months, got %d", c.LeadMonths)
	case c.LeadMonths > MaxLeadMonths:
		return bad("LeadMonths", "partition lead of %d months is more than %d (10 years)", c.LeadMonths, MaxLeadMonths)
	case c.RetentionMonths < 0:
		return bad("RetentionMonths", "partition retention must not be negative, got %d (0 keeps the archive forever)", c.RetentionMonths)
	case c.RetentionMonths > MaxRetentionMonths:
		return bad("RetentionMonths", "partition retention of %d months is more than %d (100 years); to keep the archive forever, set 0",
			c.RetentionMonths, MaxRetentionMonths)
	case c.CompactPerRun < 0 || c.CompactPerRun > MaxCompactPerRun:
		return bad("CompactPerRun", "partitions compacted per run must be 0 (none) to %d, got %d", MaxCompactPerRun, c.CompactPerRun)
	}
	if err := database.CheckTimeout(c.LockTimeout); err != nil {
		return bad("LockTimeout", "partition lock timeout %s", err)
	}
	if err := database.CheckTimeout(c.StatementTimeout); err != nil {
		return bad("StatementTimeout", "partition statement timeout %s", err)
	}
	return nil
}

// Partition is one attached (or detach-pending) partition of the archive.
type Partition struct {
	Name string    `json:"name"`
	From time.Time `json:"from,omitzero"` // inclusive; zero for MINVALUE and DEFAULT
	To   time.Time `json:"to,omitzero"`   // exclusive; zero for MAXVALUE and DEFAULT
	// DetachPending marks a DETACH ... CONCURRENTLY that was interrupted: new
	// queries no longer see the partition's rows.
	DetachPending bool `json:"detach_pending,omitempty"`
	// Default marks a DEFAULT partition. The manager never creates one.
	Default bool `json:"default,omitempty"`
	// Bound is PostgreSQL's text of the bound (pg_get_expr under TimeZone UTC).
	Bound string `json:"bound,omitempty"`
	// unreadable marks a bound that is not a timestamp range this package
	// reads (a BC date, a year past 9999, an upper bound at the first
	// instant of year 1): From and To are then unknown, not unbounded.
	unreadable bool
	// owner is the partition's owner; owned says whether the session's
	// user has its privileges, which DROP TABLE needs (DETACH needs only
	// the parent's).
	owner string
	owned bool
	// elsewhere is the partition's schema when it is not the archive's,
	// "" when it is. Every statement the manager writes names a partition
	// in the archive's schema, so it acts on those only: one attached from
	// another schema (a restore into a side schema) is reported and left
	// alone, never mistaken for the archive's table of its name.
	elsewhere string
	// oid is the table's, when listed: a name another session gives
	// another table meanwhile does not make that table the one listed.
	oid uint32
	// archiveSchema is the archive's schema, quoted, as listed.
	archiveSchema string
}

// Foreign explains a partition the manager did not make and does not manage
// (a DEFAULT partition, bounds that are not exactly one UTC month) and what to
// do about it. It returns "" for the manager's own kind of partition.
func (p Partition) Foreign() string {
	var problem string
	switch {
	case p.Default:
		problem = "a DEFAULT partition: rows of months without a partition land in it, a month holding such rows cannot " +
			"be attached, and no partition can be detached concurrently; move its rows into monthly partitions and detach it"
	case p.unreadable:
		problem = fmt.Sprintf("bound %s is not a range of timestamps the manager reads; move its rows into monthly partitions and detach it", p.Bound)
	case !isMonth(p.From, p.To):
		problem = fmt.Sprintf("bounds [%s, %s) are not one UTC month; move its rows out, detach it and let the manager create UTC months",
			formatBound(p.From), formatBound(p.To))
	}
	if p.elsewhere == "" {
		return problem
	}
	side := fmt.Sprintf("attached from schema %s, not the archive's: the manager neither retires, reattaches nor compacts it; "+
		"move its rows into the archive's months and detach it, or move it into the archive's schema (ALTER TABLE ... SET SCHEMA)", p.elsewhere)
	if p.DetachPending {
		side += fmt.Sprintf("; its detach was interrupted, so its rows are invisible, and no other partition can be detached: "+
			"finish it by hand (%s)", p.finalizeByHand())
	}
	if problem != "" {
		side += "; and it is " + problem
	}
	return side
}

// OtherSchema is the schema of a partition attached from another schema
// than the archive's, "" for one of the archive's schema. The manager
// leaves such a partition alone (see Partition.Foreign).
func (p Partition) OtherSchema() string { return p.elsewhere }

// finalizeByHand is the statement that finishes p's interrupted detach,
// to be run by hand in any session.
func (p Partition) finalizeByHand() string {
	parent, name := ArchiveTable, pgx.Identifier{p.Name}.Sanitize()
	if p.archiveSchema != "" {
		parent, name = p.archiveSchema+"."+parent, p.archiveSchema+"."+name
	}
	if p.elsewhere != "" {
		name = p.Label()
	}
	return fmt.Sprintf("ALTER TABLE %s DETACH PARTITION %s FINALIZE", parent, name)
}

// Label names p for people: qualified when it is another schema's.
func (p Partition) Label() string {
	if p.elsewhere == "" {
		return p.Name
	}
	return p.elsewhere + "." + pgx.Identifier{p.Name}.Sanitize()
}

// readable reports whether p's From and To are its real bounds.
func (p Partition) readable() bool { return !p.Default && !p.unreadable }

// Readable reports whether p's From and To are its real bounds (zero then
// meaning MINVALUE or MAXVALUE), not unknown: false for a DEFAULT
// partition and for a bound this package does not read ('infinity', a BC
// date, a year past 9999).
func (p Partition) Readable() bool { return p.readable() }

// isMonth reports whether [from, to) is one UTC month. The zero time is the
// start of January of year 1 as well as "no lower bound": the manager makes
// that month FROM (MINVALUE), so that bound is its month too.
func isMonth(from, to time.Time) bool {
	return from.Equal(MonthStart(from)) && to.Equal(from.AddDate(0, 1, 0))
}

// Foreign is a partition the manager does not manage, in a Result.
type Foreign struct {
	Name    string `json:"name"`
	Bound   string `json:"bound"`
	Problem string `json:"problem"`
}

// Refusal is a retirement the last check before DROP refused.
type Refusal struct {
	Partition string `json:"partition"`
	Reason    string `json:"reason"`
}

// Failure is a step that failed or could not be planned; the run went on with
// the others.
type Failure struct {
	Action    string `json:"action"` // create, reattach, retire, finalize, adopt, plain keys, compact, measure
	Partition string `json:"partition"`
	Error     string `json:"error"`
}

// cutShort records in r.Failed the stage (and partition, if any) a run's
// context ended in, so that a summary names where the run stopped.
func (r *Result) cutShort(action, partition string, err error) {
	r.Failed = append(r.Failed, Failure{Action: action, Partition: partition, Error: err.Error()})
	r.cut = true
}

// Result reports what a run did (or, in a dry run, would do).
type Result struct {
	DryRun  bool     `json:"dry_run"`
	Created []string `json:"created"`
	// Reattached lists months inside the retention that had been detached (an
	// interrupted DETACH ... CONCURRENTLY, a detach by hand) and were attached
	// again with their rows.
	Reattached []string `json:"reattached"`
	Retired    []string `json:"retired"`
	// Finalized lists interrupted detaches that were completed, after which
	// the partition was dropped (outside the retention, also in Retired) or
	// attached again (also in Reattached).
	Finalized []string `json:"finalized"`
	// Compacted lists closed partitions whose primary key was rebuilt
	// (Config.CompactPerRun).
	Compacted []string `json:"compacted"`
	// CompactPending lists closed partitions still to compact after the
	// run, and why; empty when the run does not compact.
	CompactPending []Pending `json:"compact_pending,omitempty"`
	// DroppedIndexes lists the invalid indexes interrupted rebuilds had left
	// (<pk>_ccnew, <pk>_ccold), dropped before compacting.
	DroppedIndexes []string `json:"dropped_indexes,omitempty"`
	// Adopted lists partitions attached by something other than the
	// manager (an ATTACH PARTITION by hand), whose bounds the run marked
	// pending (when they had rows) so that lookups read their rows until
	// they are recorded; in a dry run, those it would adopt.
	Adopted []string `json:"adopted,omitempty"`
	// PlainKeys is what the run did to keep idempotency_archive_plain_keys
	// complete and small (package plainkeys); nil in a dry run.
	PlainKeys *PlainKeys `json:"plain_keys,omitempty"`
	// Statements are those of every step the run ran or tried (in a dry
	// run, would run); a step in Failed did not complete them.
	Statements []string `json:"statements"`
	// Foreign lists partitions the manager does not manage.
	Foreign []Foreign `json:"foreign,omitempty"`
	// Refused lists retirements the guard refused; any makes Run fail.
	Refused []Refusal `json:"refused,omitempty"`
	// Failed lists steps that failed; any makes Run fail.
	Failed []Failure `json:"failed,omitempty"`
	// NewestUpperBound is the exclusive upper bound of the newest partition
	// after the run (in a dry run: after the run would have created its
	// months). Omitted when there is no bounded partition.
	NewestUpperBound time.Time `json:"newest_upper_bound,omitzero"`
	// NewestPartitionDays is the number of days from now to NewestUpperBound.
	NewestPartitionDays float64 `json:"newest_partition_days,omitzero"`
	ArchiveBytes        int64   `json:"archive_bytes"`
	// ArchiveRows is PostgreSQL's estimate (pg_class.reltuples), refreshed by
	// autovacuum and ANALYZE; it costs nothing to read.
	ArchiveRows int64 `json:"archive_rows"`

	cut bool // Failed names where the run's context ended
}

// ErrRetirementRefused is wrapped by Run's error when the guard refused to
// drop a partition that the retention arithmetic chose. Nothing was dropped;
// it means a bug or a clock far off.
var ErrRetirementRefused = errors.New("refused to retire a partition that is not outside the retention")

// ErrIncomplete is wrapped by Run's error when a step failed or could not be
// planned; Result.Failed says which and why, and the other steps ran.
var ErrIncomplete = errors.New("partition run incomplete")

// runError reports every problem of a run on one line.
type runError []error

func (e runError) Error() string {
	msgs := make([]string, len(e))
	for i, err := range e {
		msgs[i] = err.Error()
	}
	return strings.Join(msgs, "; ")
}

func (e runError) Unwrap() []error { return e }

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
// month starting at month. A DEFAULT partition covers nothing: rows that land
// in it block the month's own partition.
func Covers(parts []Partition, month time.Time) bool {
	end := month.AddDate(0, 1, 0)
	return slices.ContainsFunc(parts, func(p Partition) bool {
		return p.readable() && !p.DetachPending && !p.From.After(month) && (p.To.IsZero() || !p.To.Before(end))
	})
}

// step is one unit of DDL: statements that run in one transaction, or alone
// when they cannot run in a transaction.
type step struct {
	kind       string // "create", "reattach", "retire"
	partition  string
	statements []string
	inTx       bool
	// finalizes: the step completes an interrupted detach first.
	finalizes bool
	// to is the upper bound the partition has after a create or reattach.
	to time.Time
}

// planned is what a run is going to do, and what it cannot.
type planned struct {
	steps   []step
	refused []Refusal
	blocked []Failure
}

// Run ensures partitions through LeadMonths ahead, attaches again the months
// inside the retention that were detached, retires expired ones, emits the
// partition metrics, and reports what it did. With dryRun it only plans and
// returns the DDL it would run.
//
// A step that fails does not stop the others: Run reports it in Result.Failed
// and returns an error wrapping ErrIncomplete (or ErrRetirementRefused) with
// the full Result. A cancelled context stops the run.
func (m *Manager) Run(ctx context.Context, dryRun bool) (res Result, err error) {
	res = Result{DryRun: dryRun, Created: []string{}, Reattached: []string{}, Retired: []string{}, Finalized: []string{}, Compacted: []string{}, Statements: []string{}}
	conn, err := m.pool.Acquire(ctx)
	if err != nil {
		return res, fmt.Errorf("acquire connection: %w", err)
	}
	defer conn.Release()

	tbl, err := lookupTable(ctx, conn.Conn())
	if err != nil {
		return res, err
	}
	if !dryRun {
		unlock, err := advisoryLock(ctx, conn.Conn(), tbl)
		if err != nil {
			return res, err
		}
		defer unlock()
	}
	parts, err := list(ctx, conn.Conn())
	if err != nil {
		return res, err
	}
	now, retireNow, err := m.clocks(ctx, conn.Conn())
	if err != nil {
		return res, err
	}
	orphans, err := listOrphans(ctx, conn.Conn(), tbl)
	if err != nil {
		return res, err
	}
	// A live table that cannot be read (a role without SELECT on it) costs
	// the backlog's months, not the run.
	backlog, backlogErr := ExpiredLiveMonths(ctx, conn.Conn())
	if backlogErr != nil && ctx.Err() != nil {
		return res, backlogErr
	}
	var deflt *Partition
	for i, p := range parts {
		if problem := p.Foreign(); problem != "" {
			res.Foreign = append(res.Foreign, Foreign{Name: p.Name, Bound: p.Bound, Problem: problem})
		}
		if p.Default {
			deflt = &parts[i]
		}
	}

	pl := m.plan(tbl, parts, orphans, now, retireNow, backlog)
	if backlogErr != nil {
		// Which months expired live rows still need is unknown: this run
		// retires none (a later one will).
		pl.steps = slices.DeleteFunc(pl.steps, func(s step) bool { return s.kind == "retire" })
	}
	var errs []error
	if backlogErr != nil {
		res.Failed = append(res.Failed, Failure{Action: "create", Error: backlogErr.Error()})
		errs = append(errs, fmt.Errorf("%w: %w", ErrIncomplete, backlogErr))
	}
	for _, r := range pl.refused {
		res.Refused = append(res.Refused, r)
		errs = append(errs, fmt.Errorf("%w: %s: %s", ErrRetirementRefused, r.Partition, r.Reason))
	}
	for _, f := range pl.blocked {
		res.Failed = append(res.Failed, f)
		errs = append(errs, fmt.Errorf("%w: %s partition %s: %s", ErrIncomplete, f.Action, f.Partition, f.Error))
	}
	for _, s := range pl.steps {
		res.Statements = append(res.Statements, s.statements...)
		if !dryRun {
			if err := m.execute(ctx, conn.Conn(), s); err != nil {
				if ctx.Err() != nil {
					// The summary says which step was cut short, and what
					// it left: the steps after it did not run.
					err = fmt.Errorf("%w (%s)", err, interrupted(s))
					res.cutShort(s.kind, s.partition, err)
					return res, err
				}
				msg := explain(err, deflt)
				res.Failed = append(res.Failed, Failure{Action: s.kind, Partition: s.partition, Error: msg})
				errs = append(errs, fmt.Errorf("%w: %s", ErrIncomplete, msg))
				continue
			}
		}
		res.record(s)
	}
	// A run whose context ends after its steps names in Failed the stage
	// that did not complete (a stage cut in a partition's work names it
	// itself): an empty Failed beside a context error would read as "every
	// step done". Only a run that returns the context's error was cut: one
	// whose context ended after its last stage returns its own errors.
	stage := ""
	defer func() {
		if err != nil && stage != "" && !res.cut && ctx.Err() != nil && errors.Is(err, ctx.Err()) {
			res.cutShort(stage, "", fmt.Errorf("interrupted: %w; the stages after it did not run", ctx.Err()))
		}
	}()
	// cut is the error of a stage that stopped because the context ended,
	// wrapping the context's error where it does not already (pgx reports
	// a statement cut short as "conn closed", say).
	cut := func(err error) error {
		if !errors.Is(err, ctx.Err()) {
			return fmt.Errorf("%w (%w)", err, ctx.Err())
		}
		return err
	}
	// cutIn says whether a stage's errors hold the context's: the stage
	// itself was cut, not the one after it.
	cutIn := func(stageErrs []error) bool {
		return slices.ContainsFunc(stageErrs, func(e error) bool { return errors.Is(e, ctx.Err()) })
	}
	stage = "adopt"
	if tbl.adopts {
		adopted, failed, err := m.adopt(ctx, conn.Conn(), tbl, dryRun)
		res.Adopted = adopted
		for _, f := range failed {
			res.Failed = append(res.Failed, f)
			errs = append(errs, fmt.Errorf("%w: %s", ErrIncomplete, f.Error))
		}
		if err != nil {
			if ctx.Err() != nil {
				return res, cut(err)
			}
			res.Failed = append(res.Failed, Failure{Action: "adopt", Error: err.Error()})
			errs = append(errs, fmt.Errorf("%w: %w", ErrIncomplete, err))
		}
	}
	stage = "plain keys"
	if !dryRun {
		// While a recording trigger is broken (reported above), rows it
		// misses are found only because their ranges are pending: recorded
		// and removed now, the rows written after this run would be
		// answered not found. The pending ranges are kept, read in full,
		// until a run finds every trigger whole.
		hold := false
		if tbl.rootTriggers {
			err := database.InTx(ctx, conn.Conn(), database.Timeouts(m.cfg.LockTimeout, m.cfg.StatementTimeout), func(tx pgx.Tx) error {
				return tx.QueryRow(ctx, untriggeredSQL).Scan(&hold)
			})
			if err != nil {
				if ctx.Err() != nil {
					return res, cut(err)
				}
				hold = true // unknown: kept, as if broken
				res.Failed = append(res.Failed, Failure{Action: "plain keys", Error: fmt.Sprintf("check the recording triggers (pending ranges kept): %v", err)})
				errs = append(errs, fmt.Errorf("%w: check the recording triggers: %w", ErrIncomplete, err))
			}
		}
		pk, err := maintainPlainKeys(ctx, conn.Conn(), plainkeys.Limits{LockTimeout: m.cfg.LockTimeout}, m.cfg.StatementTimeout, hold)
		res.PlainKeys = &pk
		if err != nil {
			if ctx.Err() != nil {
				return res, cut(err)
			}
			res.Failed = append(res.Failed, Failure{Action: "plain keys", Error: err.Error()})
			errs = append(errs, fmt.Errorf("%w: %w", ErrIncomplete, err))
		}
	}
	stage = "compact"
	leftErrs := m.dropLeftovers(ctx, conn.Conn(), tbl, dryRun, &res)
	errs = append(errs, leftErrs...)
	if err := ctx.Err(); err != nil {
		if !cutIn(leftErrs) && m.cfg.CompactPerRun == 0 {
			stage = "measure"
		}
		return res, runError(append(errs, err))
	}
	if m.cfg.CompactPerRun > 0 {
		retiring := map[string]bool{}
		for _, s := range pl.steps {
			if s.kind == "retire" {
				retiring[s.partition] = true
			}
		}
		compErrs := m.compaction(ctx, conn.Conn(), tbl, parts, retiring, retireNow, dryRun, &res)
		errs = append(errs, compErrs...)
		if err := ctx.Err(); err != nil {
			if !cutIn(compErrs) {
				stage = "measure"
			}
			return res, runError(append(errs, err))
		}
	}

	stage = "measure"
	if !dryRun {
		if parts, err = list(ctx, conn.Conn()); err != nil {
			if ctx.Err() != nil {
				return res, cut(err)
			}
			return res, err
		}
	}
	res.NewestUpperBound = newest(parts)
	if dryRun {
		for _, s := range pl.steps {
			if s.to.After(res.NewestUpperBound) {
				res.NewestUpperBound = s.to
			}
		}
	}
	if !res.NewestUpperBound.IsZero() {
		res.NewestPartitionDays = res.NewestUpperBound.Sub(now).Hours() / 24
	}
	if err := conn.QueryRow(ctx, sizeSQL, tbl.oid).Scan(&res.ArchiveBytes, &res.ArchiveRows); err != nil {
		if ctx.Err() != nil {
			return res, cut(fmt.Errorf("measure archive size: %w", err))
		}
		return res, fmt.Errorf("measure archive size: %w", err)
	}
	if !dryRun {
		values := []metrics.Value{
			{Name: metrics.ArchiveNewestPartitionDays, Unit: metrics.UnitNone, Value: res.NewestPartitionDays},
			{Name: metrics.ArchiveBytes, Unit: metrics.UnitBytes, Value: float64(res.ArchiveBytes)},
			metrics.Count(metrics.ArchiveRows, res.ArchiveRows),
		}
		if m.cfg.CompactPerRun > 0 {
			values = append(values, metrics.Count(metrics.ArchiveUncompactedPartitions, int64(len(res.CompactPending))))
		}
		m.metrics.Emit(values...)
	}
	if len(errs) > 0 {
		return res, runError(errs)
	}
	return res, nil
}

func (r *Result) record(s step) {
	switch s.kind {
	case "create":
		r.Created = append(r.Created, s.partition)
	case "reattach":
		r.Reattached = append(r.Reattached, s.partition)
	case "retire":
		r.Retired = append(r.Retired, s.partition)
	}
	if s.finalizes {
		r.Finalized = append(r.Finalized, s.partition)
	}
}

// newest returns the highest finite upper bound of the attached partitions.
func newest(parts []Partition) time.Time {
	var t time.Time
	for _, p := range parts {
		if p.readable() && !p.DetachPending && p.To.After(t) {
			t = p.To
		}
	}
	return t
}

// explain turns a failed step into one line an operator can act on.
func explain(err error, deflt *Partition) string {
	msg := err.Error()
	if deflt != nil && database.SQLState(err) == database.CodeCheckViolation {
		msg += fmt.Sprintf(" (the DEFAULT partition %s holds rows of this month: move its rows into monthly partitions and detach it)", deflt.Label())
	}
	return msg
}

// EnsureMonth creates the partition for the UTC month containing t unless one
// already covers it; a month whose detach was interrupted is attached again
// with its rows. The sweeper calls it when a batch hits a month without a
// partition. It returns the DDL it ran (none when the month was covered).
func (m *Manager) EnsureMonth(ctx context.Context, t time.Time) ([]string, error) {
	conn, err := m.pool.Acquire(ctx)
	if err != nil {
		return nil, fmt.Errorf("acquire connection: %w", err)
	}
	defer conn.Release()
	tbl, err := lookupTable(ctx, conn.Conn())
	if err != nil {
		return nil, err
	}
	unlock, err := advisoryLock(ctx, conn.Conn(), tbl)
	if err != nil {
		return nil, err
	}
	defer unlock()
	parts, err := list(ctx, conn.Conn())
	if err != nil {
		return nil, err
	}
	month := MonthStart(t)
	exact, overlap := findMonth(parts, month)
	var s step
	switch {
	case exact != nil && exact.DetachPending && exact.elsewhere != "":
		return nil, sideMonthError(*exact, month)
	case exact != nil && exact.DetachPending:
		s = reattachStep(tbl, *exact)
	case exact != nil:
		return nil, nil
	case overlap != nil:
		return nil, overlapError(*overlap, month)
	default:
		s = createStep(tbl, month)
	}
	if err := m.execute(ctx, conn.Conn(), s); err != nil {
		return nil, err
	}
	return s.statements, nil
}

// plan decides the DDL of a run. Only retireStep writes a DROP or a DETACH
// that is not followed by an ATTACH.
// plan decides the steps of a run: months are created around createNow,
// and for every month of the expired live backlog (backlog), and retired by
// retireNow (see Config.Now).
func (m *Manager) plan(tbl table, parts []Partition, orphans []orphan, createNow, retireNow time.Time, backlog []time.Time) planned {
	var pl planned
	current := MonthStart(retireNow)
	now := retireNow
	retention := m.cfg.RetentionMonths
	// expired is the retention arithmetic. It is not trusted alone: every
	// partition it picks still has to pass mayRetire, in retireStep.
	expired := func(to time.Time) bool {
		return retention > 0 && !to.IsZero() && !to.After(current.AddDate(0, -retention, 0))
	}
	retire := func(name string, to time.Time, statements ...string) bool {
		s, err := retireStep(name, to, now, retention, statements...)
		if err != nil {
			pl.refused = append(pl.refused, Refusal{Partition: name, Reason: err.Error()})
			return false
		}
		pl.steps = append(pl.steps, s)
		return true
	}
	var deflt, sidePending *Partition
	for i, p := range parts {
		if p.Default && !p.DetachPending {
			deflt = &parts[i]
		}
		if p.DetachPending && p.elsewhere != "" {
			// PostgreSQL allows one pending detach per table, and the
			// manager finishes only its own schema's.
			sidePending = &parts[i]
		}
	}
	// Months that a reattach below brings back.
	handled := map[time.Time]bool{}
	// awaited reports whether expired live rows wait for a table bounded
	// [from, to) (zero: unbounded). Such a table, attached, detached or
	// half detached, is not retired (a detached one is attached again): the
	// run must leave every month of the backlog with a partition. The first
	// run after its rows were swept retires it.
	awaited := func(from, to time.Time) bool {
		return slices.ContainsFunc(backlog, func(month time.Time) bool {
			return (to.IsZero() || month.Before(to)) && (from.IsZero() || month.AddDate(0, 1, 0).After(from))
		})
	}

	// Interrupted detaches first: a detach-pending partition is invisible to
	// new queries and blocks every other concurrent detach of the table. Each
	// is finalized in one transaction with what follows, dropping it (outside
	// the retention, and no expired live row of its months waiting) or
	// attaching it again (otherwise), so its rows are never out of the
	// archive between two statements.
	for _, p := range parts {
		if !p.DetachPending || p.elsewhere != "" {
			continue // another schema's: reported, not the manager's (see Partition.elsewhere)
		}
		if p.readable() && expired(p.To) && !awaited(p.From, p.To) {
			finalize := fmt.Sprintf("ALTER TABLE %s DETACH PARTITION %s FINALIZE", tbl.qualified(), tbl.sibling(p.Name))
			if retire(p.Name, p.To, finalize, dropListed(tbl, p)) {
				continue
			}
		}
		pl.steps = append(pl.steps, reattachStep(tbl, p))
		if p.readable() && isMonth(p.From, p.To) {
			handled[p.From] = true
		}
	}

	// Tables named like a monthly partition but detached entirely: by hand, or
	// by an earlier run whose DROP failed. Outside the retention they are
	// dropped unless expired live rows of their month wait; otherwise
	// attached again with their rows.
	for _, o := range orphans {
		name := o.name
		month, ok := o.month()
		if !ok {
			continue // not a month: PostgreSQL has no year 0
		}
		if !o.shaped {
			pl.blocked = append(pl.blocked, Failure{Action: "reattach", Partition: name, Error: fmt.Sprintf(
				"table %s is named like a month of the archive but has not the archive's columns: rename it (it is neither attached nor dropped)", name)})
			continue
		}
		end := month.AddDate(0, 1, 0)
		if expired(end) && !awaited(month, end) && retire(name, end, dropOrphan(tbl, name, month, end)) {
			continue
		}
		switch exact, overlap := findMonth(parts, month); {
		case exact != nil && exact.DetachPending && exact.elsewhere != "":
			pl.blocked = append(pl.blocked, Failure{Action: "reattach", Partition: name, Error: sideMonthError(*exact, month).Error()})
		case exact != nil:
			pl.blocked = append(pl.blocked, Failure{Action: "reattach", Partition: name, Error: fmt.Sprintf(
				"detached table %s holds rows of %s, which partition %s covers now: move its rows into the archive and drop it",
				name, month.Format("2006-01"), exact.Label())})
		case overlap != nil:
			pl.blocked = append(pl.blocked, Failure{Action: "reattach", Partition: name, Error: overlapError(*overlap, month).Error()})
		default:
			s := createStep(tbl, month)
			s.kind = "reattach"
			pl.steps = append(pl.steps, s)
			handled[month] = true
		}
	}

	// From the previous month: right after midnight on the 1st, the sweeper
	// still archives keys that expired last month, and a fresh install needs
	// that month too.
	// Around both clocks when they disagree: rows are archived by the
	// database's, and neither may find its month missing.
	var wanted []time.Time
	for _, at := range []time.Time{retireNow, createNow} {
		for i := -1; i <= m.cfg.LeadMonths; i++ {
			if month := MonthStart(at).AddDate(0, i, 0); !slices.Contains(wanted, month) {
				wanted = append(wanted, month)
			}
		}
	}
	// Every month of the expired live backlog, however old (a live table
	// restored from a backup, a sweeper stopped for months): without its
	// partition no batch can move the rows, and with SWEEP_MISSING_PARTITION
	// =fail (or a sweeper that may not create one) the sweep stops on its
	// oldest row until a partition run creates it. A month outside the
	// retention is created too, and retired by a later run once its rows
	// were swept: those keys are then as old as the retention forgets.
	// A month a wider partition covers (made by hand) needs none: the
	// sweeper archives into that one.
	for _, month := range backlog {
		if !slices.Contains(wanted, month) && !Covers(parts, month) {
			wanted = append(wanted, month)
		}
	}
	for _, month := range wanted {
		if handled[month] {
			continue
		}
		switch exact, overlap := findMonth(parts, month); {
		case exact != nil && exact.DetachPending && exact.elsewhere != "":
			pl.blocked = append(pl.blocked, Failure{Action: "create", Partition: Name(month), Error: sideMonthError(*exact, month).Error()})
		case exact != nil:
		case overlap != nil:
			pl.blocked = append(pl.blocked, Failure{Action: "create", Partition: Name(month), Error: overlapError(*overlap, month).Error()})
		default:
			pl.steps = append(pl.steps, createStep(tbl, month))
		}
	}

	for _, p := range parts {
		if p.DetachPending || p.elsewhere != "" || !p.readable() || !expired(p.To) {
			continue
		}
		if awaited(p.From, p.To) {
			continue // expired live rows wait for it: retired once they are swept
		}
		if deflt != nil {
			// PostgreSQL refuses DETACH ... CONCURRENTLY beside a DEFAULT
			// partition, and a plain DETACH would lock every lookup out.
			if err := mayRetire(p.To, now, retention); err == nil {
				pl.blocked = append(pl.blocked, Failure{Action: "retire", Partition: p.Name, Error: fmt.Sprintf(
					"cannot detach concurrently while the DEFAULT partition %s exists: move its rows into monthly partitions and detach it", deflt.Label())})
				continue
			}
		}
		if sidePending != nil {
			if err := mayRetire(p.To, now, retention); err == nil {
				pl.blocked = append(pl.blocked, Failure{Action: "retire", Partition: p.Name, Error: fmt.Sprintf(
					"cannot detach while the detach of %s, another schema's table, is pending: finish it by hand (%s) and the next run retires it",
					sidePending.Label(), sidePending.finalizeByHand())})
				continue
			}
		}
		if !p.owned {
			// DETACH would succeed (it needs the parent's ownership) and
			// DROP would not: the month would leave lookups and stay, a
			// detached table every later run fails to drop. It stays
			// attached until it is given back.
			if err := mayRetire(p.To, now, retention); err == nil {
				pl.blocked = append(pl.blocked, Failure{Action: "retire", Partition: p.Name, Error: fmt.Sprintf(
					"it is owned by %s, whose privileges this run's user does not have, so it could be detached but not dropped: give it back as its owner or a superuser (ALTER TABLE ... OWNER TO the archive's owner role) and the next run retires it", p.owner)})
				continue
			}
		}
		retire(p.Name, p.To, append(checkListed(tbl, p),
			fmt.Sprintf("ALTER TABLE %s DETACH PARTITION %s CONCURRENTLY", tbl.qualified(), tbl.sibling(p.Name)),
			dropListed(tbl, p))...)
	}
	return pl
}

// retireStep is the only way to a step that drops a partition: it returns
// one only when mayRetire agrees. A finalizing retirement (statements that
// start with DETACH ... FINALIZE) runs in one transaction; DETACH ...
// CONCURRENTLY cannot run in one.
func retireStep(name string, to, now time.Time, retention int, statements ...string) (step, error) {
	if err := mayRetire(to, now, retention); err != nil {
		return step{}, err
	}
	finalizes := strings.HasSuffix(statements[0], " FINALIZE")
	return step{kind: "retire", partition: name, statements: statements, inTx: finalizes, finalizes: finalizes}, nil
}

// mayRetire is the last word before a partition ending at to is dropped. It
// does not trust the cutoff that chose the partition: it checks the retention
// is one Config.Validate allows, that the partition ends at or before the
// start of the current UTC month, and counts with integers the whole months
// between its end and the current month, which must be at least retention.
func mayRetire(to, now time.Time, retention int) error {
	current := MonthStart(now)
	switch {
	case retention < 1 || retention > MaxRetentionMonths:
		return fmt.Errorf("retention of %d months is not between 1 and %d", retention, MaxRetentionMonths)
	case to.IsZero():
		return errors.New("it has no upper bound")
	case to.After(current):
		return fmt.Errorf("it ends %s, inside or after the current month %s", formatBound(to), current.Format("2006-01"))
	}
	end := MonthStart(to)
	if end.Before(to) {
		end = end.AddDate(0, 1, 0) // a partial month counts as kept
	}
	gap := (current.Year()-end.Year())*12 + int(current.Month()) - int(end.Month())
	if gap < retention {
		return fmt.Errorf("it ends %s, %d whole months before the current month, inside the retention of %d months",
			formatBound(to), gap, retention)
	}
	return nil
}

// findMonth returns the partition in parts with exactly month's bounds, or
// else one whose bounds overlap it. DEFAULT partitions and bounds this package
// cannot read are left to PostgreSQL, which refuses a conflicting ATTACH.
func findMonth(parts []Partition, month time.Time) (exact, overlap *Partition) {
	from, to := month, month.AddDate(0, 1, 0)
	for i, p := range parts {
		if !p.readable() {
			continue
		}
		if p.From.Equal(from) && p.To.Equal(to) {
			return &parts[i], nil
		}
		if (p.From.IsZero() || p.From.Before(to)) && (p.To.IsZero() || p.To.After(from)) && overlap == nil {
			overlap = &parts[i]
		}
	}
	return nil, overlap
}

// overlapError names a partition created by hand with other bounds (the
// runbook's snippet run in a local time zone, say), rather than a doomed ATTACH.
func overlapError(p Partition, month time.Time) error {
	return fmt.Errorf("partition %s covers [%s, %s), which overlaps UTC month %s: re-create it with UTC month bounds",
		p.Label(), formatBound(p.From), formatBound(p.To), month.Format("2006-01"))
}

// sideMonthError explains a month whose partition is another schema's
// table left detach-pending: the month takes no rows, and the manager,
// which acts on the archive's schema only, neither attaches it again nor
// creates the month beside it (PostgreSQL allows one pending detach per
// table, and refuses a second partition of the month).
func sideMonthError(p Partition, month time.Time) error {
	return fmt.Errorf("month %s's partition %s is another schema's table whose detach was interrupted, so the month takes no rows: "+
		"finish its detach by hand (%s) and the next run creates the month; then move its rows into it",
		month.Format("2006-01"), p.Label(), p.finalizeByHand())
}

// createStep plans the partition for month. CREATE TABLE IF NOT EXISTS makes
// the same statements attach again a table of that name that was detached.
func createStep(tbl table, month time.Time) step {
	name := Name(month)
	part := tbl.sibling(name)
	stmts := append([]string{
		fmt.Sprintf("CREATE TABLE IF NOT EXISTS %s (LIKE %s INCLUDING DEFAULTS INCLUDING CONSTRAINTS)", part, tbl.qualified()),
	}, attachStatements(tbl, Partition{Name: name, From: month, To: month.AddDate(0, 1, 0)})...)
	return step{kind: "create", partition: name, statements: stmts, inTx: true, to: month.AddDate(0, 1, 0)}
}

// reattachStep finalizes p's interrupted detach and attaches it again with
// its own bounds, in one transaction.
func reattachStep(tbl table, p Partition) step {
	stmts := append([]string{
		fmt.Sprintf("ALTER TABLE %s DETACH PARTITION %s FINALIZE", tbl.qualified(), tbl.sibling(p.Name)),
	}, attachStatements(tbl, p)...)
	s := step{kind: "reattach", partition: p.Name, statements: stmts, inTx: true, finalizes: true}
	if p.readable() {
		s.to = p.To
	}
	return s
}

// The registry of migrations 012 and 013 (idempotency_archive_recorded_partitions)
// says which attachments of the archive's partitions the plain-key records
// cover. The invariant lookups rest on: every partition whose current
// attachment the registry vouches for, and which carries the recording
// triggers, has each of its rows recorded or inside a pending range.
//
// A registry row vouches for one attachment: the partition's OID and the
// xmin of its pg_inherits row (migration 013). Every DETACH ends an
// attachment, and an ATTACH (by hand or by the manager) writes a new
// pg_inherits row with another xmin. So a table detached while a run prunes
// the records of months no table holds, or while it indexes a pending range
// through the archive (and so finishes the range without the table's rows),
// is unrecorded again as soon as it is attached again, and the next run
// adopts it, marking its bounds pending. That is why forgetting, adopting,
// indexing and pruning need not read the catalog at one moment: none of
// them can make the registry vouch for an attachment whose rows it did not
// see. forgetSQL only keeps the registry small (and an OID reused by a later
// table from meeting an old row).
//
// A schema at migration 012 has no attachments: a partition is then recorded
// by OID alone (forget012SQL, unadopted012SQL), which has the hole above until
// migrate runs.
const (
	forgetSQL = `
DELETE FROM idempotency_archive_recorded_partitions r
 WHERE NOT EXISTS (SELECT 1 FROM pg_partition_tree(to_regclass('idempotency_key_archive')) t
                     JOIN pg_catalog.pg_inherits i ON i.inhrelid = t.relid
                    WHERE t.level >= 1 AND t.relid = r.partition AND i.xmin = r.attached)`
	// unadoptedSQL lists the partitions of the archive's tree whose rows
	// the records may not cover, or that no query reads, and why; stuck
	// marks a table below a month whose DETACH ... CONCURRENTLY was
	// interrupted (no query sees its rows, and adoption cannot help: the
	// manager finalizes and attaches again only months, the archive's own
	// partitions, which are not listed here).
	//
	// The checks run on the tree's members only, which pg_partition_tree
	// has locked: idempotency_archive_partition_triggered deparses
	// triggers, which opens their tables, and one of another schema's
	// tables being dropped fails that ("could not open relation with
	// OID"). Written as a filter on pg_class, a hash join evaluated them
	// for every relation of the database. OFFSET 0 keeps the planner from
	// moving them out of the subquery.
	unadoptedSQL = `
SELECT c.oid, c.relname,
       CASE WHEN NOT idempotency_archive_partition_recorded(c.oid)
            THEN 'attached by hand and not adopted: the rows it held when attached are not recorded'
            ELSE 'lacks a recording trigger (or one is disabled, replica-only, not what its name says, or was turned off and on again since it was adopted): rows written into it by name, or moved out of it, are not recorded'
       END,
       false
  FROM (SELECT t.relid
          FROM pg_partition_tree(to_regclass('idempotency_key_archive')) t
         WHERE t.level >= 1
           AND NOT EXISTS (SELECT 1 FROM pg_inherits i WHERE i.inhrelid = t.relid AND i.inhdetachpending)
           AND NOT (idempotency_archive_partition_recorded(t.relid) AND idempotency_archive_partition_triggered(t.relid))
        OFFSET 0) AS u
  JOIN pg_class c ON c.oid = u.relid
UNION ALL
SELECT c.oid, c.relname,
       format('detach-pending from %s (an interrupted DETACH ... CONCURRENTLY): no query sees its rows; run ALTER TABLE %s DETACH PARTITION %s FINALIZE, then ATTACH it again',
              i.inhparent::regclass, i.inhparent::regclass, c.oid::regclass),
       true
  FROM pg_inherits i
  JOIN pg_class c ON c.oid = i.inhrelid
 WHERE i.inhdetachpending
   AND i.inhparent IN (SELECT t.relid FROM pg_partition_tree(to_regclass('idempotency_key_archive')) t WHERE t.level >= 1)
 ORDER BY 4, 2`
	forget012SQL = `
DELETE FROM idempotency_archive_recorded_partitions r
 WHERE r.partition NOT IN (SELECT t.relid FROM pg_partition_tree(to_regclass('idempotency_key_archive')) t WHERE t.level >= 1)`
	unadopted012SQL = `
SELECT c.oid, c.relname, 'attached by hand and not adopted: the rows it held when attached are not recorded', false
  FROM pg_partition_tree(to_regclass('idempotency_key_archive')) t
  JOIN pg_class c ON c.oid = t.relid
 WHERE t.level >= 1
   AND NOT EXISTS (SELECT 1 FROM pg_inherits i WHERE i.inhrelid = t.relid AND i.inhdetachpending)
   AND NOT EXISTS (SELECT 1 FROM idempotency_archive_recorded_partitions r WHERE r.partition = c.oid)
 ORDER BY t.level, c.relname`
	adoptSQL = "SELECT idempotency_archive_adopt_partition($1)"
	// rootUnrecordedSQL lists the archive table itself when its own
	// recording triggers, those a sweep's inserts fire, are not all there
	// and enabled (migration 015).
	rootUnrecordedSQL = `
SELECT c.oid, c.relname, 'lacks one of its own recording triggers (or one is disabled, replica-only or not what its name says): rows swept into the archive are not recorded', false
  FROM pg_class c
 WHERE c.oid = to_regclass('idempotency_key_archive')
   AND NOT idempotency_archive_root_triggered()`
	adoptRootSQL      = "SELECT idempotency_archive_adopt_root()"
	vouchNewClonesSQL = "SELECT idempotency_archive_vouch_new_clones()"
	// markAllPendingSQL marks every expiry pending, restarting the range
	// if it is pending already (see plainkeys).
	markAllPendingSQL = `
INSERT INTO idempotency_archive_plain_keys_pending (expired_from, expired_to)
VALUES ('-infinity', 'infinity')
ON CONFLICT (expired_from, expired_to) DO UPDATE SET after_key = '', after_expired_at = '-infinity'`
	// untriggeredSQL says whether a recording trigger of the archive, or of
	// an adopted partition, is missing or not what it should be: after the
	// run's adoptions, one whose adoption (which marked its rows pending)
	// could not replace it. A partition not adopted (its writers never left
	// it free) had nothing marked, and holding the ranges would not help
	// its rows.
	untriggeredSQL = `
SELECT NOT idempotency_archive_root_triggered()
    OR EXISTS (SELECT 1 FROM pg_partition_tree(to_regclass('idempotency_key_archive')) t
                WHERE t.level >= 1
                  AND NOT EXISTS (SELECT 1 FROM pg_inherits i WHERE i.inhrelid = t.relid AND i.inhdetachpending)
                  AND idempotency_archive_partition_recorded(t.relid)
                  AND NOT idempotency_archive_partition_triggered(t.relid))`
)

// Unrecorded is a partition of the archive whose rows lookups may miss
// until a partitions run adopts it.
type Unrecorded struct {
	Name   string `json:"name"`
	Reason string `json:"reason"`
}

// ErrNoRegistry is returned by ListUnrecorded for a schema from before
// migration 013, which does not record attachments.
var ErrNoRegistry = errors.New("the schema does not record which partitions' rows are recorded (migration 13): run `archivectl migrate`")

// ListUnrecorded lists the attached partitions of the archive whose rows the
// plain-key records may not cover: attached by hand and not adopted yet
// (their rows, and those of an attachment made after a detach, were never
// recorded), or lacking the recording triggers. Lookups of keys without a
// timestamp, and of keys used long after theirs, can miss their rows until a
// partitions run adopts them. The archive table itself is listed first while
// its own recording triggers are not all there and enabled (migration 015).
// A detach-pending partition is not listed:
// its rows are invisible to every query (see Partition.DetachPending).
func ListUnrecorded(ctx context.Context, pool *pgxpool.Pool) ([]Unrecorded, error) {
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return nil, fmt.Errorf("acquire connection: %w", err)
	}
	defer conn.Release()
	tbl, err := lookupTable(ctx, conn.Conn())
	if err != nil {
		return nil, err
	}
	if !tbl.attachments {
		return nil, ErrNoRegistry
	}
	cands, err := unadopted(ctx, conn.Conn(), tbl)
	if err != nil {
		return nil, fmt.Errorf("list unrecorded partitions: %w", err)
	}
	out := make([]Unrecorded, len(cands))
	for i, c := range cands {
		out[i] = Unrecorded{Name: c.name, Reason: c.reason}
	}
	return out, nil
}

// candidate is a partition to adopt.
type candidate struct {
	oid    uint32
	name   string
	reason string
	// stuck: detach-pending below a month; reported, not adopted.
	stuck bool
	// root: the archive table itself, whose own triggers are repaired.
	root bool
}

func unadopted(ctx context.Context, db interface {
	Query(context.Context, string, ...any) (pgx.Rows, error)
}, tbl table) ([]candidate, error) {
	sql := unadoptedSQL
	if !tbl.attachments {
		sql = unadopted012SQL
	}
	if tbl.rootTriggers {
		// The archive first: its repair gives the partitions the clones
		// of its row trigger that the partitions' check then asks for.
		sql = rootUnrecordedSQL + "\nUNION ALL (" + sql + ")"
	}
	rows, err := db.Query(ctx, sql)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (candidate, error) {
		var c candidate
		err := row.Scan(&c.oid, &c.name, &c.reason, &c.stuck)
		c.root = c.oid == tbl.oid
		return c, err
	})
}

// adopt marks the bounds of every partition attached by something other
// than the manager (an owner's ATTACH PARTITION of a month restored from a
// dump, or of a table detached and attached again), or lacking the
// recording triggers, pending, when it has rows, gives it the archive's
// recording triggers, and records its attachment as covered: its rows no
// trigger saw are then read in full by lookups until maintainPlainKeys has
// recorded them, as the rows of a month the manager attached are. Each
// partition is adopted in a transaction of its own, so that no partition's
// lock is held while another's is tried, and one that cannot be adopted (its
// triggers cannot be created, its writers never left it free) is reported
// without holding up the others. The archive table itself comes first when
// its own recording triggers (those a sweep's inserts fire) are not all
// there and enabled: every expiry is marked pending and the triggers are
// created or enabled again (migration 015's idempotency_archive_adopt_root).
// It returns the partitions adopted (in a dry run, those it would adopt),
// and those that failed.
func (m *Manager) adopt(ctx context.Context, conn *pgx.Conn, tbl table, dryRun bool) ([]string, []Failure, error) {
	var candidates []candidate
	settings := database.Timeouts(m.cfg.LockTimeout, m.cfg.StatementTimeout)
	err := database.InTx(ctx, conn, settings, func(tx pgx.Tx) error {
		if !dryRun {
			forget := forgetSQL
			if !tbl.attachments {
				forget = forget012SQL
			}
			if _, err := tx.Exec(ctx, forget); err != nil {
				return err
			}
		}
		var err error
		candidates, err = unadopted(ctx, tx, tbl)
		return err
	})
	if err != nil {
		return nil, nil, fmt.Errorf("adopt partitions attached by hand: %w", err)
	}
	var adopted []string
	var failed []Failure
	for _, c := range candidates {
		if c.stuck {
			failed = append(failed, Failure{Action: "adopt", Partition: c.name, Error: fmt.Sprintf("partition %s is %s", c.name, c.reason)})
			continue
		}
		if dryRun {
			adopted = append(adopted, c.name)
			continue
		}
		if c.root {
			// Pending first, in a transaction of its own: rows swept while
			// a trigger did not fire are read in full from now on, even
			// when the repair below fails (the tree never free of writers,
			// a trigger it cannot replace).
			if err := database.InTx(ctx, conn, settings, func(tx pgx.Tx) error {
				_, err := tx.Exec(ctx, markAllPendingSQL)
				return err
			}); err != nil {
				if ctx.Err() != nil {
					return adopted, failed, err
				}
				failed = append(failed, Failure{Action: "adopt", Partition: c.name, Error: fmt.Sprintf(
					"the archive %s, and its expiries could not be marked pending (lookups of keys without a timestamp can miss rows swept since): %v", c.reason, err)})
				continue
			}
		}
		var problem *string
		err := database.InTx(ctx, conn, settings, func(tx pgx.Tx) error {
			if c.root {
				if err := tx.QueryRow(ctx, adoptRootSQL).Scan(&problem); err != nil || problem == nil || *problem != "" || !tbl.vouches {
					return err
				}
				// The clones of its row trigger the repair wrote, under the
				// tree's locks (migration 018).
				_, err := tx.Exec(ctx, vouchNewClonesSQL)
				return err
			}
			// Adopting, it marks what a clone of the row trigger turned off
			// may have let a MERGE move out of it, and vouches for its
			// triggers as they are then (idempotency_archive_partition_triggers,
			// migration 018).
			return tx.QueryRow(ctx, adoptSQL, c.oid).Scan(&problem)
		})
		switch {
		case c.root && err != nil && ctx.Err() == nil:
			failed = append(failed, Failure{Action: "adopt", Partition: c.name, Error: fmt.Sprintf(
				"the archive %s, and its triggers could not be repaired (lookups of keys without a timestamp can miss rows swept "+
					"since; run archivectl partitions again): %v", c.reason, err)})
		case c.root && problem != nil && *problem != "":
			failed = append(failed, Failure{Action: "adopt", Partition: c.name, Error: "the archive's recording triggers: " + *problem})
		case err != nil && ctx.Err() != nil:
			return adopted, failed, err
		case database.SQLState(err) == database.CodeLockNotAvailable:
			// Its writers (or a lock the adoption needs) never left it free
			// (migration 013 raises this; before it, such a partition came
			// back NULL and the run looked clean while lookups could miss
			// its rows). Nothing was done; the next run tries again.
			failed = append(failed, Failure{Action: "adopt", Partition: c.name, Error: fmt.Sprintf(
				"partition %s was not adopted: it was never free of writers long enough (it is %s; lookups of keys without a timestamp "+
					"can miss its rows until a run adopts it: run archivectl partitions again when its writers are done): %v", c.name, c.reason, err)})
		case err != nil:
			failed = append(failed, Failure{Action: "adopt", Partition: c.name, Error: fmt.Sprintf("adopt partition attached by hand: %v", err)})
		case problem == nil:
			// Detached or adopted meanwhile (or, before migration 013,
			// busy): the next run looks again.
		case *problem != "":
			failed = append(failed, Failure{Action: "adopt", Partition: c.name, Error: fmt.Sprintf(
				"partition attached by hand: its rows are marked pending, but it cannot be given the archive's recording triggers "+
					"(rows written into it by name would not be recorded; make idempotency_owner its owner): %s", *problem)})
		case !c.root && tbl.attachments && !m.triggered(ctx, conn, c.oid):
			// Adoption creates a trigger only where none of its name
			// exists: one of the name but another kind or function
			// (migration 016 checks both) stays, and rows written into the
			// partition by name are still not recorded.
			failed = append(failed, Failure{Action: "adopt", Partition: c.name, Error: fmt.Sprintf(
				"partition %s has a trigger of a recording trigger's name but another definition (its rows are marked pending, "+
					"but rows written into it by name are not recorded): drop it (DROP TRIGGER ... ON %s) and run partitions again, which recreates it", c.name, c.name)})
		default:
			adopted = append(adopted, c.name)
		}
	}
	return adopted, failed, nil
}

// triggered reports whether partition oid carries the archive's recording
// triggers, each of its kind, as it should after its adoption. An error
// reads as true: the next run's listing asks again.
func (m *Manager) triggered(ctx context.Context, conn *pgx.Conn, oid uint32) bool {
	ok := true
	err := database.InTx(ctx, conn, database.Timeouts(m.cfg.LockTimeout, m.cfg.StatementTimeout), func(tx pgx.Tx) error {
		return tx.QueryRow(ctx, "SELECT idempotency_archive_partition_triggered($1)", oid).Scan(&ok)
	})
	return err != nil || ok
}

// backlogMonthsSQL lists every UTC month the expired backlog a sweep batch
// can claim falls in (the conditions of package sweep's batch.sql), with one probe of the expiry index
// per month. Not only the months of the oldest rows: a batch skips rows
// other sweepers or completions hold locked, so the rows it failed on can lie
// in any month of the backlog. A month holding only rows no batch claims
// needs no partition.
const backlogMonthsSQL = `
WITH RECURSIVE months (m) AS (
    SELECT date_trunc('month', min(expires_at) AT TIME ZONE 'UTC')
      FROM idempotency_keys
     WHERE expires_at < now() AND expires_at >= '0001-01-01 00:00:00+00'
       AND octet_length(scoped_key) <= 2000
    UNION ALL
    SELECT (SELECT date_trunc('month', min(k.expires_at) AT TIME ZONE 'UTC')
              FROM idempotency_keys k
             WHERE k.expires_at >= (months.m + interval '1 month') AT TIME ZONE 'UTC'
               AND k.expires_at < now() AND octet_length(k.scoped_key) <= 2000)
      FROM months
     WHERE months.m IS NOT NULL
)
-- As microseconds since 1970 (m is a UTC timestamp without time zone): a
-- number reads the same in every exec mode, where a timestamp read as text
-- (the exec and simple_protocol modes) parses only under DateStyle ISO.
SELECT (extract(epoch FROM m) * 1000000)::int8 FROM months WHERE m IS NOT NULL`

// ExpiredLiveMonths returns the UTC months (their first instants) of the
// expired live rows a sweep batch can claim: the months the archive needs
// partitions for before those rows can be swept.
func ExpiredLiveMonths(ctx context.Context, db interface {
	Query(context.Context, string, ...any) (pgx.Rows, error)
}) ([]time.Time, error) {
	rows, err := db.Query(ctx, backlogMonthsSQL)
	if err != nil {
		return nil, fmt.Errorf("list months of expired live rows: %w", err)
	}
	micros, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		return nil, fmt.Errorf("list months of expired live rows: %w", err)
	}
	months := make([]time.Time, len(micros))
	for i, us := range micros {
		m := time.UnixMicro(us).UTC()
		months[i] = time.Date(m.Year(), m.Month(), 1, 0, 0, 0, 0, time.UTC)
	}
	return months, nil
}

// PlainKeys is what a run did to idempotency_archive_plain_keys.
type PlainKeys struct {
	// Scanned and Recorded count the archive rows of pending ranges read
	// and the entries added for them; RangesDone the ranges finished,
	// RangesLeft those still pending (lookups of keys without a timestamp
	// read every partition they reach until they are done).
	Scanned    int64 `json:"scanned"`
	Recorded   int64 `json:"recorded"`
	RangesDone int   `json:"ranges_done"`
	RangesLeft int   `json:"ranges_left"`
	// Pruned counts entries of months no table of the archive holds.
	Pruned int64 `json:"pruned"`
	// Held says the pending ranges were left as they were: a recording
	// trigger of the archive or of a partition is missing or not what it
	// should be (reported among the run's failures), and the rows it
	// misses are found only while their ranges are pending.
	Held bool `json:"held,omitempty"`
}

// maintainPlainKeys records the rows of pending ranges and prunes entries of
// retired months, for at most budget (and never closer than compactMargin
// to ctx's deadline), each statement waiting for locks at most
// l.LockTimeout; what it cannot finish, the next run does.
func maintainPlainKeys(ctx context.Context, conn *pgx.Conn, l plainkeys.Limits, budget time.Duration, hold bool) (PlainKeys, error) {
	pk := PlainKeys{Held: hold}
	deadline := time.Now().Add(budget)
	if dl, ok := ctx.Deadline(); ok && dl.Add(-compactMargin).Before(deadline) {
		deadline = dl.Add(-compactMargin)
	}
	indexBy := deadline
	if hold {
		indexBy = time.Now() // records nothing; counts the ranges left
	}
	p, err := plainkeys.Index(ctx, conn, plainkeys.DefaultBatch, l, indexBy)
	pk.Scanned, pk.Recorded, pk.RangesDone, pk.RangesLeft = p.Scanned, p.Recorded, p.RangesDone, p.RangesLeft
	if err != nil {
		return pk, err
	}
	pk.Pruned, err = plainkeys.Prune(ctx, conn, plainkeys.DefaultBatch, l, deadline)
	return pk, err
}

// attachStatements attaches the table named p.Name with p's bounds. A table
// attached with rows in it gets a pending range of
// idempotency_archive_plain_keys for its bounds, in the same transaction:
// the archive's trigger never saw its rows (see migration 006). The same
// transaction records the partition as covered by the records (migration
// 012), so that idempotency_archive_adopt_partition leaves it alone.
func attachStatements(tbl table, p Partition) []string {
	part := tbl.sibling(p.Name)
	// Keep every partition with the archive's owner, so that whoever may
	// manage the archive may later detach and drop it.
	after := []string{fmt.Sprintf("ALTER TABLE %s OWNER TO %s", part, pgx.Identifier{tbl.owner}.Sanitize())}
	partClass := quote(part) + "::regclass"
	if tbl.triggers {
		// Rows written into the partition directly (it names a statement)
		// are recorded by its own triggers (migration 012).
		after = append(after, fmt.Sprintf("SELECT %s(%s)", tbl.sibling("idempotency_archive_partition_triggers"), partClass))
	}
	switch {
	case tbl.attachments:
		// The attachment this transaction made (migration 013): its
		// pg_inherits row, written by the ATTACH above, carries this
		// transaction's xid as xmin.
		after = append(after, fmt.Sprintf("INSERT INTO %s (partition, attached) SELECT i.inhrelid, i.xmin FROM pg_catalog.pg_inherits i WHERE i.inhrelid = %s "+
			"ON CONFLICT (partition) DO UPDATE SET attached = EXCLUDED.attached",
			tbl.sibling("idempotency_archive_recorded_partitions"), partClass))
	case tbl.adopts:
		after = append(after, fmt.Sprintf("INSERT INTO %s (partition) VALUES (%s) ON CONFLICT (partition) DO NOTHING",
			tbl.sibling("idempotency_archive_recorded_partitions"), partClass))
	}
	if !p.readable() {
		// PostgreSQL's own text of the bound, as it printed it.
		return append([]string{fmt.Sprintf("ALTER TABLE %s ATTACH PARTITION %s %s", tbl.qualified(), part, p.Bound),
			pendingStatement(tbl, part, "MINVALUE", "MAXVALUE")}, after...)
	}
	var conds []string
	lo, hi := "MINVALUE", "MAXVALUE"
	if !p.From.IsZero() {
		lo = literal(p.From)
		conds = append(conds, "expired_at >= "+lo)
	}
	if !p.To.IsZero() {
		hi = literal(p.To)
		conds = append(conds, "expired_at < "+hi)
	}
	check := pgx.Identifier{p.Name + "_bounds"}.Sanitize()
	return append([]string{
		// The CHECK constraint lets ATTACH skip scanning the table; on a table
		// with rows, it is where a row outside the month is found.
		fmt.Sprintf("ALTER TABLE %s ADD CONSTRAINT %s CHECK (%s)", part, check, strings.Join(append([]string{"expired_at IS NOT NULL"}, conds...), " AND ")),
		fmt.Sprintf("ALTER TABLE %s ATTACH PARTITION %s FOR VALUES FROM (%s) TO (%s)", tbl.qualified(), part, lo, hi),
		fmt.Sprintf("ALTER TABLE %s DROP CONSTRAINT %s", part, check),
		pendingStatement(tbl, part, lo, hi),
	}, after...)
}

// pendingStatement marks [lo, hi) pending in idempotency_archive_plain_keys
// when the table part has rows (from the start again, if the range was
// pending already).
func pendingStatement(tbl table, part, lo, hi string) string {
	bound := func(b, inf string) string {
		if b == "MINVALUE" || b == "MAXVALUE" {
			return "'" + inf + "'"
		}
		return b
	}
	return fmt.Sprintf(`INSERT INTO %s (expired_from, expired_to) SELECT %s, %s WHERE EXISTS (SELECT 1 FROM %s) `+
		`ON CONFLICT (expired_from, expired_to) DO UPDATE SET after_key = '', after_expired_at = '-infinity'`,
		tbl.sibling("idempotency_archive_plain_keys_pending"), bound(lo, "-infinity"), bound(hi, "infinity"), part)
}

// finalizeAttempts bounds the tries of a DETACH ... FINALIZE that PostgreSQL
// chose as a deadlock's victim. The statement waits for every older snapshot
// in the database, so it can deadlock with another statement that waits for
// snapshots too (CREATE INDEX or REINDEX CONCURRENTLY, another DETACH
// CONCURRENTLY, on any table of the database). A victim is rolled back and
// the detach stays pending, so trying again is safe; the other statement has
// gone on meanwhile.
const finalizeAttempts = 3

// interrupted says what a step the run's context cut short left behind: a
// transaction's steps roll back; a retirement outside one (DETACH ...
// CONCURRENTLY, then DROP) can leave its month detach-pending or detached,
// which the next run finishes (it finalizes a pending detach and drops a
// detached month past the retention).
func interrupted(s step) string {
	if s.inTx {
		return "interrupted: rolled back, the steps after it did not run"
	}
	return "interrupted: the month may be left detach-pending or detached, which the next partitions run finishes; the steps after it did not run"
}

func (m *Manager) execute(ctx context.Context, conn *pgx.Conn, s step) error {
	for attempt := 1; ; attempt++ {
		err := m.executeOnce(ctx, conn, s)
		if !s.finalizes || attempt == finalizeAttempts || database.SQLState(err) != database.CodeDeadlockDetected {
			return err
		}
		select {
		case <-time.After(time.Duration(attempt) * 100 * time.Millisecond):
		case <-ctx.Done():
			return err
		}
	}
}

func (m *Manager) executeOnce(ctx context.Context, conn *pgx.Conn, s step) error {
	lockTimeout := m.cfg.LockTimeout
	if s.finalizes {
		// DETACH ... FINALIZE first waits for every older snapshot in the
		// database, a wait that lock_timeout cuts short. It blocks no reader
		// or writer meanwhile (it holds SHARE UPDATE EXCLUSIVE on the
		// archive), so let it wait as long as a statement may.
		lockTimeout = max(lockTimeout, m.cfg.StatementTimeout)
	}
	settings := database.Timeouts(lockTimeout, m.cfg.StatementTimeout)
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
	// DETACH ... CONCURRENTLY cannot run inside a transaction block.
	return m.inSession(ctx, conn, settings, func() error {
		for _, stmt := range s.statements {
			if err := execTraced(ctx, conn, stmt); err != nil {
				return fmt.Errorf("%s partition %s: %s: %w", s.kind, s.partition, stmt, err)
			}
		}
		return nil
	})
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
//
// It tries pg_try_advisory_lock every lockPoll rather than waiting inside
// pg_advisory_lock: a statement that waits holds its snapshot all along, and
// the run holding the lock may be in a REINDEX ... CONCURRENTLY or a
// DETACH ... CONCURRENTLY, which waits for every snapshot older than its
// own. Each would wait for the other, a deadlock PostgreSQL breaks by
// failing one of them. Between tries this session holds no snapshot.
//
// The lock is the archive's, keyed by the schema it lies in (not the
// session's current_schema(), which a search_path that names another
// schema first would make another lock for the same archive); in the
// usual setup the two are the same, so releases that key it either way
// share it.
func advisoryLock(ctx context.Context, conn *pgx.Conn, tbl table) (func(), error) {
	const key = `hashtextextended('idempotency_key_archive partitions ' || $1::text, 0)`
	for {
		var held bool
		if err := conn.QueryRow(ctx, "SELECT pg_try_advisory_lock("+key+")", tbl.schema).Scan(&held); err != nil {
			return nil, fmt.Errorf("take partition advisory lock: %w", err)
		}
		if held {
			break
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("take partition advisory lock: %w", ctx.Err())
		case <-time.After(lockPoll):
		}
	}
	return func() {
		// Bounded even once ctx has ended: a database that stopped
		// answering must not hold the run (and a Lambda's answer) past its
		// deadline. A lock not released goes with its connection, closed.
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), unlockWait)
		defer cancel()
		if _, err := conn.Exec(ctx, "SELECT pg_advisory_unlock("+key+")", tbl.schema); err != nil {
			_ = conn.Close(ctx)
		}
	}, nil
}

// unlockWait bounds the release of the partition advisory lock.
const unlockWait = 2 * time.Second

// lockPoll is how often a partition run or EnsureMonth tries the advisory
// lock while another holds it.
const lockPoll = 100 * time.Millisecond

// table identifies the archive's parent table.
type table struct {
	oid    uint32
	schema string
	owner  string
	// adopts: the schema has migration 012's record of the partitions the
	// plain-key records cover, and its function that adopts the others.
	adopts bool
	// triggers: the schema has migration 012's function that gives a
	// partition the archive's recording triggers.
	triggers bool
	// attachments: the record names the attachment of each partition, not
	// only its OID (migration 013).
	attachments bool
	// rootTriggers: the schema has migration 015's functions that check
	// and repair the archive table's own recording triggers.
	rootTriggers bool
	// vouches: the schema records the partitions' recording triggers as
	// adopted (migration 018).
	vouches bool
}

func (t table) qualified() string { return pgx.Identifier{t.schema, ArchiveTable}.Sanitize() }

func (t table) sibling(name string) string { return pgx.Identifier{t.schema, name}.Sanitize() }

const tableSQL = `
SELECT c.oid, n.nspname, pg_get_userbyid(c.relowner),
       to_regclass(quote_ident(n.nspname) || '.idempotency_archive_recorded_partitions') IS NOT NULL
       AND to_regprocedure(quote_ident(n.nspname) || '.idempotency_archive_adopt_partition(oid)') IS NOT NULL,
       to_regprocedure(quote_ident(n.nspname) || '.idempotency_archive_partition_triggers(regclass)') IS NOT NULL,
       EXISTS (SELECT 1 FROM pg_attribute a
                WHERE a.attrelid = to_regclass(quote_ident(n.nspname) || '.idempotency_archive_recorded_partitions')
                  AND a.attname = 'attached' AND NOT a.attisdropped)
       AND to_regprocedure(quote_ident(n.nspname) || '.idempotency_archive_partition_recorded(oid)') IS NOT NULL
       AND to_regprocedure(quote_ident(n.nspname) || '.idempotency_archive_partition_triggered(oid)') IS NOT NULL,
       to_regprocedure(quote_ident(n.nspname) || '.idempotency_archive_adopt_root()') IS NOT NULL,
       to_regprocedure(quote_ident(n.nspname) || '.idempotency_archive_vouch_partition_triggers(oid)') IS NOT NULL
  FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
 WHERE c.oid = to_regclass('idempotency_key_archive')`

func lookupTable(ctx context.Context, conn *pgx.Conn) (table, error) {
	var t table
	err := conn.QueryRow(ctx, tableSQL).Scan(&t.oid, &t.schema, &t.owner, &t.adopts, &t.triggers, &t.attachments, &t.rootTriggers, &t.vouches)
	if errors.Is(err, pgx.ErrNoRows) {
		return t, errors.New("table idempotency_key_archive not found on the search_path: run `archivectl migrate` first")
	}
	if err != nil {
		return t, fmt.Errorf("find archive table: %w", err)
	}
	return t, nil
}

const listSQL = `
SELECT c.oid, quote_ident(pn.nspname),
       c.relname, pg_get_expr(c.relpartbound, c.oid), i.inhdetachpending,
       c.relowner::regrole::text, pg_has_role(c.relowner, 'USAGE'),
       CASE WHEN c.relnamespace <> pc.relnamespace THEN c.relnamespace::regnamespace::text ELSE '' END
  FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
  JOIN pg_class pc ON pc.oid = i.inhparent JOIN pg_namespace pn ON pn.oid = pc.relnamespace
 WHERE i.inhparent = to_regclass('idempotency_key_archive')
 ORDER BY c.relname`

// orphansSQL lists tables named like monthly partitions, in the archive's
// schema, that are not attached to it: plain tables and partitioned ones (a
// month partitioned itself, detached whole), and whether each has the
// archive's columns, of the archive's types. One that has not is another
// table that happens to have such a name.
const orphansSQL = `
SELECT c.relname,
       (SELECT count(*) FROM pg_attribute a
         WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
           AND (a.attname::text, format_type(a.atttypid, NULL)) IN (
               ('scoped_key', 'text'), ('fingerprint', 'bytea'), ('status_code', 'smallint'), ('resource_id', 'text'),
               ('created_at', 'timestamp with time zone'), ('expired_at', 'timestamp with time zone'))) = 6
  FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
 WHERE n.nspname = $1 AND c.relkind IN ('r', 'p') AND NOT c.relispartition
   AND c.relname ~ '^idempotency_key_archive_[0-9]{4}_[0-9]{2}$'
 ORDER BY c.relname`

// orphan is a table named like a monthly partition and not attached.
type orphan struct {
	name string
	// shaped: it has the archive's columns (see orphansSQL).
	shaped bool
}

// month returns the month o is named for, false for a name that is no
// month (month 13; year 0000, as PostgreSQL has no year 0).
func (o orphan) month() (time.Time, bool) {
	month, err := time.Parse("2006_01", strings.TrimPrefix(o.name, ArchiveTable+"_"))
	return month, err == nil && month.Year() >= 1
}

func listOrphans(ctx context.Context, conn *pgx.Conn, tbl table) ([]orphan, error) {
	rows, err := conn.Query(ctx, orphansSQL, tbl.schema)
	if err != nil {
		return nil, fmt.Errorf("list detached partitions: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (orphan, error) {
		var o orphan
		return o, r.Scan(&o.name, &o.shaped)
	})
	if err != nil {
		return nil, fmt.Errorf("list detached partitions: %w", err)
	}
	return out, nil
}

// dropOrphanSQL drops a detached month only when every row it holds expired
// in that month: a table detached by hand may hold rows of other months
// (inside the retention) that lookups need back, and they are not the
// month's to lose. The check and the drop are one statement, under the
// table's ACCESS EXCLUSIVE lock, so no row arrives between them; a table
// dropped meanwhile (by hand, by another run) is no error. The check reads
// nothing when the table carries the CHECK constraint a DETACH ...
// CONCURRENTLY leaves (constraint_exclusion proves it empty). %[1]s is the
// table, %[2]s and %[3]s the month's bounds, %[4]s its name as a literal,
// %[5]s the table as a literal; dropOrphan gives the block its quotes.
const dropOrphanSQL = `
BEGIN
    IF to_regclass(%[5]s) IS NULL THEN
        RETURN;
    END IF;
    PERFORM set_config('constraint_exclusion', 'on', true);
    LOCK TABLE %[1]s IN ACCESS EXCLUSIVE MODE;
    IF EXISTS (SELECT FROM %[1]s WHERE expired_at IS NULL OR expired_at < %[2]s OR expired_at >= %[3]s) THEN
        RAISE EXCEPTION 'detached table %% holds rows that expired outside its month: left in place; move them into the archive, then drop it', %[4]s;
    END IF;
    DROP TABLE %[1]s;
END
`

// dropOrphan is the statement that drops the detached table name of the
// month [from, to) (see dropOrphanSQL), in dollar quotes no name can close.
func dropOrphan(tbl table, name string, from, to time.Time) string {
	return doBlock(fmt.Sprintf(dropOrphanSQL, tbl.sibling(name), quote(from.Format(time.RFC3339)), quote(to.Format(time.RFC3339)),
		quote(name), quote(tbl.sibling(name))))
}

// A statement finds a table by its name when it runs, and again after a
// lock wait: hand DDL meanwhile (the listed table moved away, and a month
// inside the retention renamed to its name) would make a retirement detach
// and drop another month. checkListedSQL, run just before the DETACH ...
// CONCURRENTLY (which cannot run in a transaction, nor beside a lock held
// for it), takes the locks the DETACH takes (SHARE UPDATE EXCLUSIVE on the
// archive, %[5]s, and on the month), in its order, so that it waits for
// whatever the DETACH would wait for (an ANALYZE, an index build, hand
// DDL); it then refuses a name that no longer means the table the run
// listed (%[3]s, its OID), and the DETACH, right after, finds nothing left
// to wait for.
// dropListedSQL checks the same under the lock DROP takes, so the DROP
// never acts on another table: one detached in the instant between the
// check and the DETACH is left in place, for the next run to refuse (its
// rows are not its name's month). A table dropped meanwhile is no error
// to the DROP. %[1]s is the table, %[2]s its name as a literal, %[4]s the
// table as a literal.
const (
	checkListedSQL = `
BEGIN
    LOCK TABLE %[5]s, %[1]s IN SHARE UPDATE EXCLUSIVE MODE;
    IF to_regclass(%[4]s) IS DISTINCT FROM %[3]s::oid::regclass THEN
        RAISE EXCEPTION 'table %% is no longer the partition this run listed (renamed since): not retired', %[2]s;
    END IF;
END
`
	dropListedSQL = `
BEGIN
    IF to_regclass(%[4]s) IS NULL THEN
        RETURN;
    END IF;
    LOCK TABLE %[1]s IN ACCESS EXCLUSIVE MODE;
    IF to_regclass(%[4]s) IS DISTINCT FROM %[3]s::oid::regclass THEN
        RAISE EXCEPTION 'table %% is no longer the partition this run listed (renamed since): left in place; if this run detached it, attach it again with the bounds of its CHECK constraint', %[2]s;
    END IF;
    DROP TABLE %[1]s;
END
`
)

// checkListed is the statement that refuses to go on when p's name no
// longer means the table listed (see checkListedSQL); none for a
// Partition not read from the catalog (no OID).
func checkListed(tbl table, p Partition) []string {
	if p.oid == 0 {
		return nil
	}
	return []string{listedBlock(checkListedSQL, tbl, p)}
}

// dropListed is the statement that drops p, retired, if it is still the
// table listed (see dropListedSQL). A Partition not read from the catalog
// (no OID) is dropped by name.
func dropListed(tbl table, p Partition) string {
	if p.oid == 0 {
		return fmt.Sprintf("DROP TABLE %s", tbl.sibling(p.Name))
	}
	return listedBlock(dropListedSQL, tbl, p)
}

func listedBlock(body string, tbl table, p Partition) string {
	return doBlock(fmt.Sprintf(body, tbl.sibling(p.Name), quote(p.Name), strconv.FormatUint(uint64(p.oid), 10), quote(tbl.sibling(p.Name)), tbl.qualified()))
}

// doBlock wraps a PL/pgSQL body in DO, with a dollar-quote tag the body
// does not hold.
func doBlock(body string) string {
	tag := "$drop$"
	for i := 0; strings.Contains(body, tag); i++ {
		tag = "$drop" + strconv.Itoa(i) + "$"
	}
	return "DO " + tag + body + tag
}

const sizeSQL = `
SELECT coalesce(sum(pg_total_relation_size(t.relid)), 0)::bigint,
       coalesce(sum(greatest(c.reltuples, 0)), 0)::bigint
  FROM pg_partition_tree($1::oid::regclass) t JOIN pg_class c ON c.oid = t.relid
 WHERE t.isleaf`

// Detached returns the tables of the archive's schema named like a
// monthly partition, with the archive's columns, and not attached to it: a
// month detached entirely (by hand, or a retirement whose DROP failed),
// whose rows no lookup sees until a partitions run attaches it again
// (inside the retention) or drops it (outside it).
func Detached(ctx context.Context, pool *pgxpool.Pool) ([]string, error) {
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return nil, fmt.Errorf("acquire connection: %w", err)
	}
	defer conn.Release()
	tbl, err := lookupTable(ctx, conn.Conn())
	if err != nil {
		return nil, err
	}
	orphans, err := listOrphans(ctx, conn.Conn(), tbl)
	if err != nil {
		return nil, err
	}
	var names []string
	for _, o := range orphans {
		// As a run reads them: a name that is no month (month 13, year
		// 0000) is left alone by every run, so it is not listed.
		if _, ok := o.month(); ok && o.shaped {
			names = append(names, o.name)
		}
	}
	return names, nil
}

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
	// A table another session is attaching right now can be listed before
	// its bound is (the catalog rows are read in two snapshots): its bound
	// reads NULL. The list is read again, a moment later, a few times, and
	// then given without it: the next run sees it attached (a step that
	// collides with it meanwhile fails, and is reported).
	for attempt := 1; ; attempt++ {
		var attaching bool
		var err error
		parts, attaching, err = listOnce(ctx, conn)
		if err != nil || !attaching || attempt == 3 {
			return parts, err
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func listOnce(ctx context.Context, conn *pgx.Conn) ([]Partition, bool, error) {
	var parts []Partition
	var attaching bool
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
			var bound *string
			if err := rows.Scan(&p.oid, &p.archiveSchema, &p.Name, &bound, &p.DetachPending, &p.owner, &p.owned, &p.elsewhere); err != nil {
				return err
			}
			if bound == nil {
				attaching = true
				continue
			}
			p.Bound = *bound
			// A partition added by hand must not stop the manager from
			// managing the rest: it is kept, marked, and reported.
			if p.Bound == "DEFAULT" {
				p.Default = true
			} else if p.From, p.To, err = parseBound(p.Bound); err != nil {
				p.From, p.To, p.unreadable = time.Time{}, time.Time{}, true
			}
			parts = append(parts, p)
		}
		return rows.Err()
	})
	if err != nil {
		return nil, false, fmt.Errorf("list archive partitions: %w", err)
	}
	return parts, attaching, nil
}

var boundRE = regexp.MustCompile(`^FOR VALUES FROM \((MINVALUE|'[^']*')\) TO \((MAXVALUE|'[^']*')\)$`)

// parseBound parses "FOR VALUES FROM ('2026-09-01 00:00:00+00') TO (...)" as
// printed under TimeZone UTC, with fractional seconds where a bound has them.
// MINVALUE and '-infinity' below, MAXVALUE and 'infinity' above, come back as
// zero times (unbounded). An infinity on the other side ('infinity' below,
// '-infinity' above: a partition of the single value infinity, or of none)
// is not a bound this package reads, rather than one read as unbounded, which
// would make the partition seem to cover, and overlap, every month.
func parseBound(s string) (from, to time.Time, err error) {
	m := boundRE.FindStringSubmatch(s)
	if m == nil || m[1] == "'infinity'" || m[2] == "'-infinity'" {
		return from, to, fmt.Errorf("unexpected partition bound %q", s)
	}
	if from, err = parseTimestamp(m[1]); err != nil {
		return from, to, err
	}
	if to, err = parseTimestamp(m[2]); err == nil && to.IsZero() && m[2] != "MAXVALUE" && m[2] != "'infinity'" {
		// The first instant of year 1 as an upper bound: the zero time
		// would read it as none, a partition of every month. (As a lower
		// bound it is no bound at all, for the rows this package keeps.)
		return from, to, fmt.Errorf("unexpected partition bound %q", s)
	}
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
func literal(t time.Time) string { return "'" + t.UTC().Format("2006-01-02 15:04:05.999999+00") + "'" }

func formatBound(t time.Time) string {
	if t.IsZero() {
		return "unbounded"
	}
	return t.UTC().Format(time.RFC3339Nano)
}
