// Package verify runs the runbook's four verification checks, and two of its own, against a live
// database: the expired backlog is zero, recent archive rows exist, the archive
// has no column able to hold a payload, and partitions exist at least two
// months ahead. A DEFAULT partition (added by hand) fails the partitions
// check, with what to do: rows of months without a partition land in it and
// block those months' partitions; so does a detach-pending partition, whose
// rows no query sees.
//
// A fifth check holds the invariant lookups rest on: every attached
// partition's rows are recorded for lookups of keys without a timestamp (or
// lie in a pending range that they read in full). It fails while a partition
// attached by hand is not adopted yet, or lacks the recording triggers
// (partition.ListUnrecorded): such a lookup can answer not found for a key
// whose row is in the archive.
//
// A sixth holds what keeps the rows and the skip's guarantee: the tables'
// shape (schema.Mismatches), the live table's triggers, its expiry index,
// no UNLOGGED table, and no write or DDL privilege for PUBLIC or the reader
// role (integrity.sql).
package verify

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemarchive/idemarchive/shared/database"
	"github.com/idemarchive/idemarchive/shared/partition"
	"github.com/idemarchive/idemarchive/shared/schema"
)

// Check is the outcome of one verification.
type Check struct {
	Name   string `json:"name"`
	Pass   bool   `json:"pass"`
	Figure string `json:"figure"`
}

// Options tune the checks.
type Options struct {
	// Recent is the window in which archive rows must exist. Default 24h.
	Recent time.Duration
	// Now returns the current time. Default: the database's clock, which
	// the sweeper and the live stores judge expiries by (a machine whose
	// clock is slow would count keys the sweeper has yet to move as none,
	// a fast one keys still inside their grace).
	Now func() time.Time
	// InFlightGrace is how long past its expiry the sweeper leaves a key
	// still in flight live (SWEEP_IN_FLIGHT_GRACE): such a key is not
	// backlog. Zero: none.
	InFlightGrace time.Duration
}

// archiveColumns is the archive's whole, payload-free column set, each of
// its type: a column retyped (status_code to text, resource_id to xml or a
// domain over jsonb) could hold a payload under its name.
var archiveColumns = map[string]string{
	"created_at":  "timestamp with time zone",
	"expired_at":  "timestamp with time zone",
	"fingerprint": "bytea",
	"resource_id": "text",
	"scoped_key":  "text",
	"status_code": "smallint",
}

// clockSQL reads the database's clock as microseconds since 1970: a number
// reads the same in every exec mode, where a timestamp read as text (the
// exec and simple_protocol modes, as through RDS Proxy) parses only under
// DateStyle ISO.
const clockSQL = "SELECT (extract(epoch FROM now()) * 1000000)::int8"

//go:embed integrity.sql
var integritySQL string

// Run performs the checks. An error means a check could not run at all.
func Run(ctx context.Context, pool *pgxpool.Pool, opts Options) ([]Check, error) {
	if opts.Recent == 0 {
		opts.Recent = 24 * time.Hour
	}
	var now time.Time
	if opts.Now != nil {
		now = opts.Now()
	} else {
		var micros int64
		if err := pool.QueryRow(ctx, clockSQL).Scan(&micros); err != nil {
			return nil, fmt.Errorf("read the database's clock: %w", err)
		}
		now = time.UnixMicro(micros)
	}
	var checks []Check

	var backlog int64
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM idempotency_keys
		WHERE expires_at < $1 AND (state = 'completed' OR expires_at < $1::timestamptz - $2 * interval '1 millisecond')`,
		now, opts.InFlightGrace.Milliseconds()).Scan(&backlog); err != nil {
		return nil, fmt.Errorf("count expired live rows: %w", err)
	}
	checks = append(checks, Check{"expired backlog is zero", backlog == 0, fmt.Sprintf("%d expired live rows", backlog)})

	var recent int64
	// Rows a Redis store archives at completion carry the end of their
	// window, in the future: they show no sweep.
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM idempotency_key_archive WHERE expired_at > $1 AND expired_at <= $2`,
		now.Add(-opts.Recent), now).Scan(&recent); err != nil {
		return nil, fmt.Errorf("count recent archive rows: %w", err)
	}
	checks = append(checks, Check{"recent archive rows exist", recent > 0, fmt.Sprintf("%d rows expired in the last %s", recent, shortDuration(opts.Recent))})

	rows, err := pool.Query(ctx, `
		SELECT attname, format_type(atttypid, NULL)
		  FROM pg_attribute
		 WHERE attrelid = to_regclass('idempotency_key_archive') AND attnum > 0 AND NOT attisdropped
		 ORDER BY attname`)
	if err != nil {
		return nil, fmt.Errorf("read archive columns: %w", err)
	}
	type column struct{ Name, Type string }
	cols, err := pgx.CollectRows(rows, pgx.RowToStructByPos[column])
	if err != nil {
		return nil, fmt.Errorf("read archive columns: %w", err)
	}
	var names, extra []string
	for _, c := range cols {
		names = append(names, c.Name)
		if typ, ok := archiveColumns[c.Name]; !ok || c.Type != typ {
			extra = append(extra, c.Name+" "+c.Type)
		}
	}
	figure := "columns: " + strings.Join(names, ", ")
	if len(extra) > 0 {
		figure = "unexpected columns: " + strings.Join(extra, ", ")
	}
	checks = append(checks, Check{"no column can hold a payload", len(cols) > 0 && len(extra) == 0, figure})

	parts, err := partition.List(ctx, pool)
	if err != nil {
		return nil, err
	}
	current := partition.MonthStart(now)
	var missing []string
	for i := 0; i <= 2; i++ {
		m := current.AddDate(0, i, 0)
		if !partition.Covers(parts, m) {
			missing = append(missing, m.Format("2006-01"))
		}
	}
	var newest time.Time
	var advice []string
	hasDefault, detachPending, foreign, endless := false, false, false, false
	for _, p := range parts {
		if p.DetachPending {
			// Whatever its month: its rows are invisible to every lookup
			// until a partitions run attaches it again.
			detachPending = true
			if p.OtherSchema() != "" {
				// Another schema's: no partitions run touches it.
				advice = append(advice, fmt.Sprintf("%s: %s", p.Label(), p.Foreign()))
				continue
			}
			advice = append(advice, fmt.Sprintf("%s is detach-pending (its rows are invisible): run archivectl partitions, which attaches it again inside the retention and finishes its retirement outside it", p.Name))
			continue
		}
		if p.Default {
			// Rows of months without a partition land in DEFAULT, where
			// they block the month's partition: the check fails until it
			// is gone.
			hasDefault = true
			advice = append(advice, fmt.Sprintf("DEFAULT partition %s: move its rows into monthly partitions and detach it", p.Label()))
			continue
		}
		if p.To.After(newest) {
			newest = p.To
		}
		endless = endless || (p.Readable() && p.To.IsZero())
		if problem := p.Foreign(); problem != "" && overlaps(p, current, current.AddDate(0, 3, 0)) {
			// It may cover these months, but the manager cannot create,
			// retire or compact the months it overlaps: every partitions
			// run fails on it. Bounds it cannot read ('infinity') count
			// as overlapping: which months they hold is unknown here.
			foreign = true
			advice = append(advice, fmt.Sprintf("%s: %s", p.Label(), problem))
		}
	}
	detached, err := partition.Detached(ctx, pool)
	if err != nil {
		return nil, err
	}
	for _, name := range detached {
		// A month detached entirely: its rows are as invisible as a
		// detach-pending month's.
		advice = append(advice, fmt.Sprintf("%s is detached (its rows are invisible): run archivectl partitions, which attaches it again inside the retention and drops it outside it, or says why it cannot", name))
	}
	switch {
	case endless:
		figure = "a partition has no upper bound"
	case !newest.IsZero():
		figure = fmt.Sprintf("newest partition ends %s (%.0f days ahead)", newest.Format("2006-01-02"), newest.Sub(now).Hours()/24)
	default:
		figure = "no partitions"
	}
	if len(missing) > 0 {
		figure += "; missing " + strings.Join(missing, ", ")
	}
	if len(advice) > 0 {
		figure += "; " + strings.Join(advice, "; ")
	}
	checks = append(checks, Check{"partitions exist two months ahead", len(missing) == 0 && !hasDefault && !detachPending && len(detached) == 0 && !foreign, figure})

	check, err := recorded(ctx, pool)
	if err != nil {
		return nil, err
	}
	checks = append(checks, check)

	check, err = intact(ctx, pool)
	if err != nil {
		return nil, err
	}
	return append(checks, check), nil
}

// intact checks that the tables are as migrate made them: the shape the
// sweeper, the live stores and lookups rely on (schema.Mismatches), and
// what keeps their rows (integrity.sql says why each matters).
func intact(ctx context.Context, pool *pgxpool.Pool) (Check, error) {
	const name = "tables are as migrate made them"
	problems, err := schema.Mismatches(ctx, pool)
	if err != nil {
		return Check{}, err
	}
	rows, err := pool.Query(ctx, integritySQL)
	if err != nil {
		return Check{}, fmt.Errorf("read table integrity: %w", err)
	}
	more, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return Check{}, fmt.Errorf("read table integrity: %w", err)
	}
	problems = append(problems, more...)
	if len(problems) == 0 {
		return Check{name, true, "shape, triggers, expiry index, durability and privileges as migrated"}, nil
	}
	// Nothing here is the manager's to repair: each was done by hand or
	// by another tool, and is undone by hand.
	return Check{name, false, strings.Join(problems, "; ") + " (repair by hand: ALTER TABLE ... SET LOGGED, ENABLE TRIGGER, CREATE INDEX, REVOKE)"}, nil
}

// recorded checks that lookups of keys without a timestamp find every
// attached partition's rows (see partition.ListUnrecorded).
func recorded(ctx context.Context, pool *pgxpool.Pool) (Check, error) {
	const name = "every partition's rows are recorded"
	unrecorded, err := partition.ListUnrecorded(ctx, pool)
	if errors.Is(err, partition.ErrNoRegistry) {
		return Check{name, false, err.Error()}, nil
	}
	if database.SQLState(err) == database.CodeInsufficientPrivilege {
		// Unknown is no pass: the registry is the owner's alone.
		return Check{name, false, "cannot read which partitions are recorded (idempotency_archive_recorded_partitions is the owner's): " +
			"run verify as a member of idempotency_owner"}, nil
	}
	if err != nil {
		return Check{}, err
	}
	if len(unrecorded) == 0 {
		return Check{name, true, "every attached partition is adopted, with the recording triggers"}, nil
	}
	var problems []string
	for _, u := range unrecorded {
		problems = append(problems, fmt.Sprintf("%s: %s", u.Name, u.Reason))
	}
	return Check{name, false, strings.Join(problems, "; ") +
		"; lookups of keys without a timestamp can miss these rows until a partitions run adopts the partition: run archivectl partitions"}, nil
}

// overlaps reports whether p's bounds meet [from, to). Bounds the partition
// package cannot read count as meeting it.
func overlaps(p partition.Partition, from, to time.Time) bool {
	if p.From.IsZero() && p.To.IsZero() {
		return true
	}
	return (p.From.IsZero() || p.From.Before(to)) && (p.To.IsZero() || p.To.After(from))
}

// shortDuration writes d as time.Duration does, without a zero tail of
// minutes and seconds: 24h, 10m, 1h10m, 50s.
func shortDuration(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}
