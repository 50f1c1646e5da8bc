// Package archive reads idempotency_key_archive: the point lookup that answers
// a late retry, and the investigation query that lists what was archived under
// a scope.
//
// A point lookup reads the partitioned primary key. For keys that embed their
// creation time (ULID, UUIDv7; see package keytime) the query also bounds
// expired_at from below by that time minus keytime.MaxClockSkew: every writer
// refuses a key whose timestamp lies further ahead of its clock than its skew,
// so a key's rows were registered, and expired, after that instant, whatever
// the timestamp says. The bound lets PostgreSQL prune every older partition,
// so the lookup touches the months from the key's own on. A key minted two
// months or more ago first reads idempotency_archive_plain_keys, where the
// rows that expired more than PromptSpan after their key's timestamp are
// recorded (migration 010), and then only the months from its timestamp to
// the end of that span or to its last late row. A key without a
// timestamp is first looked up in idempotency_archive_plain_keys, which
// records the expiry of each of its archive rows (migration 006): a key not
// archived is answered there, and an archived one reads only the partitions
// of its expiries. Every key reads every partition while idempotency_writers
// records writers that bounded nothing (keys stored before writers recorded
// their bounds), and keys without a timestamp do while rows archived before
// migration 006 are not all recorded yet (package plainkeys).
//
//	r := archive.NewReader(pool, archive.Config{LiveTTL: 24 * time.Hour}, emitter)
//	rec, err := r.Lookup(ctx, "idem:v1:probe", fingerprint)
//	if errors.Is(err, archive.ErrNotFound) { ... }
package archive

import (
	"bytes"
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemarchive/idemarchive/shared/database"
	"github.com/idemarchive/idemarchive/shared/keytime"
	"github.com/idemarchive/idemarchive/shared/metrics"
	"github.com/idemarchive/idemarchive/shared/tracing"
)

// Errors returned by the Reader. Callers map them to responses.
var (
	// ErrNotFound means the archive holds no row for the key.
	ErrNotFound = errors.New("archive: key not found")
	// ErrInvalidKey means the scoped key is empty, too long or not UTF-8.
	ErrInvalidKey = errors.New("archive: invalid key")
	// ErrInvalidQuery means the investigation query's parameters are unusable.
	ErrInvalidQuery = errors.New("archive: invalid query")
	// ErrInvalidCursor means a paging cursor was not one this package issued.
	ErrInvalidCursor = errors.New("archive: invalid cursor")
	// ErrTimeout means a query ran out of time: its statement timeout, or
	// the caller's deadline.
	ErrTimeout = errors.New("archive: the query ran out of time")
	// ErrDeadlineBound is joined to ErrTimeout when the context's deadline,
	// not StatementTimeout, set the statement timeout that ended the query:
	// the caller's time ran out, not the archive's budget.
	ErrDeadlineBound = errors.New("archive: the context's deadline bounded the query")
	// ErrUnavailable means the database could not be reached or was not
	// taking connections (database.Unavailable): a later try may succeed.
	ErrUnavailable = errors.New("archive: the database is unavailable")
	// ErrMisconfigured means a lookup can never succeed as configured (an
	// archiveclient.Lambda with a negative Timeout): the middleware never
	// fails open on it, whatever its OnArchiveError.
	ErrMisconfigured = errors.New("archive: misconfigured")
)

// MinLookupTimeout is the shortest bound on one lookup a caller may set
// (idempotency.Config.ArchiveTimeout, archiveclient.Lambda.Timeout): no
// lookup fits in less, so under FailOpen a shorter one would run every key,
// those the archive holds included, as if the archive were down.
const MinLookupTimeout = 10 * time.Millisecond

// DefaultStatementTimeout bounds each lookup and investigation query.
const DefaultStatementTimeout = 3 * time.Second

// deadlineMargin is kept free before the caller's deadline: a query's
// statement timeout ends that much before it, so that the server cancels
// the query (the connection stays usable) and the caller still has time to
// answer "timeout" rather than being cut off itself. A caller that allows
// less than four times as much keeps a quarter of what it allows (see
// marginBefore).
const deadlineMargin = 100 * time.Millisecond

// marginBefore returns the time to keep free before a deadline that is left
// away: deadlineMargin, or a quarter of left when that is less. A caller
// that bounds a lookup tightly (the middleware's ArchiveTimeout of 100 ms,
// say) thus still gives it three quarters of its time, where a fixed margin
// would leave it nothing and fail every lookup.
func marginBefore(left time.Duration) time.Duration {
	return min(deadlineMargin, left/4)
}

// PromptSpan is how long after its key's timestamp an archive row may expire
// without being recorded in idempotency_archive_plain_keys (migration 010,
// whose idempotency_key_prompt_span() is the same): a lookup of a key minted
// long ago reads the partitions of its timestamp's first PromptSpan and
// those of the expiries recorded for it, not every month since. 192 hours
// cover the default MaxLiveTTL of 7 days and a day's delay in first using a
// key; a writer whose keys expire later than that records every row.
const PromptSpan = 192 * time.Hour

// MaxScopedKeyBytes bounds the scoped keys lookups accept, and scope
// prefixes: the longest key the archive holds. The sweeper archives no key
// over it (batch.sql), whichever writer stored it, so a longer key is never
// archived and is refused (ErrInvalidKey), while every archived key can be
// looked up by the key an investigation lists. The middleware's own keys
// are shorter (idempotency.MaxScopedKeyBytes).
const MaxScopedKeyBytes = 2000

// InFlightStatus is the status_code of a key that expired before its request
// completed.
const InFlightStatus = 0

// Config configures a Reader.
type Config struct {
	// LiveTTL is the live store's TTL: the default of MaxLiveTTL's floor.
	// Default 24h.
	LiveTTL time.Duration
	// MaxLiveTTL is the longest TTL any writer of the archive has used. The
	// investigation query reads partitions up to the end of its window plus
	// MaxLiveTTL, or plus the longest TTL idempotency_writers records when
	// that is longer. Default 7 days; at least LiveTTL.
	MaxLiveTTL time.Duration
	// MaxPageSize caps the investigation query's page. Default 1,000.
	MaxPageSize int
	// StatementTimeout bounds each query (statement_timeout, set for that
	// query alone), and is shortened further to end before the context's
	// deadline. Default DefaultStatementTimeout; whole milliseconds, 1ms to
	// 15 minutes.
	StatementTimeout time.Duration
	// Now returns the current time. Default time.Now.
	Now func() time.Time
}

// WithDefaults returns c with zero fields set to their defaults.
func (c Config) WithDefaults() Config {
	c.LiveTTL = cmp.Or(c.LiveTTL, 24*time.Hour)
	c.MaxLiveTTL = cmp.Or(c.MaxLiveTTL, max(7*24*time.Hour, c.LiveTTL))
	c.MaxPageSize = cmp.Or(c.MaxPageSize, 1000)
	c.StatementTimeout = cmp.Or(c.StatementTimeout, DefaultStatementTimeout)
	if c.Now == nil {
		c.Now = time.Now
	}
	return c
}

// ConfigError is a Config.Validate error about one field, so that a caller can
// name the field its own way (an environment variable, a flag).
type ConfigError struct {
	// Field is the Config field: LiveTTL, MaxLiveTTL, MaxPageSize or
	// StatementTimeout.
	Field string
	Msg   string
}

func (e *ConfigError) Error() string { return e.Msg }

// Validate reports an unusable configuration. Its errors are *ConfigError.
func (c Config) Validate() error {
	if c.LiveTTL < time.Second {
		return &ConfigError{"LiveTTL", fmt.Sprintf("live TTL must be at least 1s, got %s", c.LiveTTL)}
	}
	if c.MaxLiveTTL < c.LiveTTL {
		return &ConfigError{"MaxLiveTTL", fmt.Sprintf("max live TTL must be at least the live TTL (%s), got %s", c.LiveTTL, c.MaxLiveTTL)}
	}
	if c.MaxPageSize < 1 {
		return &ConfigError{"MaxPageSize", fmt.Sprintf("max page size must be positive, got %d", c.MaxPageSize)}
	}
	if err := database.CheckTimeout(c.StatementTimeout); err != nil {
		return &ConfigError{"StatementTimeout", fmt.Sprintf("statement timeout %v", err)}
	}
	return nil
}

// Record is one archived key.
type Record struct {
	ScopedKey string `json:"scoped_key"`
	// Status is the original HTTP status, or InFlightStatus (0) when the key
	// expired before its request completed.
	Status     int       `json:"original_status"`
	ResourceID *string   `json:"resource_id"`
	CreatedAt  time.Time `json:"created_at"`
	ExpiredAt  time.Time `json:"expired_at"`
	// FingerprintMatch says whether the fingerprint passed to Lookup equals the
	// archived one: nil when none was passed, or when they differ but one of
	// them is not a SHA-256 digest (so nothing is proven).
	FingerprintMatch *bool `json:"fingerprint_match,omitempty"`
}

// InFlight reports whether the key expired before its request completed.
func (r Record) InFlight() bool { return r.Status == InFlightStatus }

// MarshalJSON writes r with its times in UTC, each null where JSONTime says
// so, so that an odd row in the archive never fails the answer that carries
// it.
func (r Record) MarshalJSON() ([]byte, error) {
	type plain Record // without this method
	return json.Marshal(struct {
		plain
		CreatedAt *time.Time `json:"created_at"`
		ExpiredAt *time.Time `json:"expired_at"`
	}{plain(r), JSONTime(r.CreatedAt), JSONTime(r.ExpiredAt)})
}

// JSONTime is t in UTC for a JSON member, or nil (null) for a time not known
// (the zero time: an archive row stamped 'infinity' or '-infinity') or one
// RFC 3339 cannot write (a year outside 0-9999: a row written by hand with a
// BC date), either of which would otherwise fail the whole answer.
func JSONTime(t time.Time) *time.Time {
	t = t.UTC()
	if t.IsZero() || t.Year() < 0 || t.Year() > 9999 {
		return nil
	}
	return &t
}

// Instant is ts as a time in UTC, or the zero time (which JSONTime writes as
// null) for an infinite one, which a row written by hand may hold.
func Instant(ts pgtype.Timestamptz) time.Time {
	if ts.InfinityModifier != pgtype.Finite {
		return time.Time{}
	}
	return ts.Time.UTC()
}

// Reader reads the archive. It needs only SELECT on idempotency_key_archive
// and idempotency_writers (the idempotency_reader role).
type Reader struct {
	pool    *pgxpool.Pool
	cfg     Config
	metrics *metrics.Emitter

	mu sync.Mutex
	// writers is what idempotency_writers said, read at most once per
	// reachTTL.
	writers     writersView
	writersRead time.Time
	// lateUnreadable is when a lookup last found the tables of migration
	// 010 missing or not granted: for reachTTL after it, lookups read up to
	// their ceiling without trying them (a failed statement would cost the
	// connection its prepared statements).
	lateUnreadable time.Time
}

// writersView is what the writers on record allow a lookup to skip.
type writersView struct {
	// reach is how far before its timestamp a key's rows can lie;
	// negative: unbounded.
	reach time.Duration
	// sweptOnly says that every archive row was moved by a sweep (no writer
	// archives at completion), so that none expires after the database's
	// clock: lookups of keys with a timestamp are bounded above too.
	sweptOnly bool
	// clockOffset is the database's clock minus this host's, when read.
	clockOffset time.Duration
	// maxTTL is the longest TTL a writer on record has leased (0: none),
	// or MaxCompletionTTL when a writer that archives at completion, whose
	// TTL is not recorded, is on record and that is longer.
	maxTTL time.Duration
}

// MaxCompletionTTL is the longest TTL a writer that archives at completion
// (livestore.Redis) may use: its TTL is not recorded in idempotency_writers
// (it records 0, "archived from registration on"), so investigations read
// this far past their window while such a writer is on record.
const MaxCompletionTTL = 31 * 24 * time.Hour

// reachTTL is how long a Reader trusts the writers it read. A stale reach is
// safe: the only change that widens it, a writer that bounded nothing, is
// recorded by the migration that creates the table, before any Reader can
// read it, or by a live-table trigger, and each lookup proves the bounds it
// used (proofSQL).
const reachTTL = time.Minute

// NewReader validates cfg (after defaults) and returns a Reader. emitter may be nil.
func NewReader(pool *pgxpool.Pool, cfg Config, emitter *metrics.Emitter) (*Reader, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Reader{pool: pool, cfg: cfg, metrics: emitter}, nil
}

// lookupSQL reads the archive row that answers for a key: the newest
// completed one, else the newest in-flight one (status 0). A completed row
// wins over a newer in-flight row of the same key: such a row is left behind
// when a registration made after the key's first life (an archive hit, a 503)
// could not be released, and it must not hide the outcome the client needs.
// $2 and $3 bound the expiries the key's rows can have (see expiryRange),
// so that the planner reads only the partitions between them. Lookups whose
// bounds span a few months run lookupWindowSQL instead (see lookupStatement).
const lookupSQL = `
SELECT status_code, resource_id, created_at, expired_at, fingerprint
  FROM idempotency_key_archive
 WHERE scoped_key = $1
   AND expired_at >= $2 AND expired_at <= $3
 ORDER BY status_code <> 0 DESC, expired_at DESC
 LIMIT 1`

// lookupWindowSQL is lookupSQL with the expiries bounded by constants, the
// first instants of two UTC months (windowLiteral), instead of parameters:
// its only parameter is the key.
//
// Why: the planner prunes partitions by constants when it builds the
// statement's generic plan, so that plan holds only the partitions of those
// months, costs what a custom plan costs, and the plan cache settles on it
// after five runs. A generic plan is not planned again: a run locks the
// parent, the partitions in its plan and the primary keys it scans, 3
// relations for one month. lookupSQL's bounds are parameters, which prune
// only when the statement is planned for their values, a custom plan every
// run, and planning locks every index of each partition it keeps (the
// created_at BRIN as well): 4 relations for one month (6 on PostgreSQL 17,
// whose planner locks the parent's two indexes too), and the planning time
// on every lookup.
//
// The window is whole months: it holds every expiry lookupSQL's bounds
// admit, and more (see lookupStatement).
const lookupWindowSQL = `
SELECT status_code, resource_id, created_at, expired_at, fingerprint
  FROM idempotency_key_archive
 WHERE scoped_key = $1
   AND expired_at >= '%s' AND expired_at < '%s'
 ORDER BY status_code <> 0 DESC, expired_at DESC
 LIMIT 1`

// maxWindowMonths is the most months a lookup names as constants.
//
// Every distinct window is a statement of its own, prepared and cached on
// each connection with a generic plan of about 18 KB a partition (measured
// on PostgreSQL 15). So a window also ends in the month before now, this
// month or the next (by the Reader's clock): the windows of timestamped
// keys (whose bounds end at now) and of keys without a timestamp archived
// lately. That makes at most 12 window statements a connection, under 1 MB.
// Any other lookup (a key without a timestamp whose newest row is older, a
// window wider than this, an unbounded one) runs lookupSQL, whose one cached
// statement serves every bound.
const maxWindowMonths = 4

// lookupStatement returns the statement that reads a key's archive rows with
// expiries in [earliest, latest], now being the Reader's clock.
//
// When both bounds are finite and lie within a few months ending near now,
// it is lookupWindowSQL over the months from earliest's to latest's, both
// included. Why reading whole months is safe (the invariant): the window
// starts at or before earliest (the first instant of its month) and ends
// after latest (the first instant of the month after), so it holds every
// expiry between the bounds and misses no row lookupSQL would find. The rows
// it reads beyond the bounds are rows of the same key, which the bounds say
// cannot exist; were one there, the answer would be chosen among more of the
// key's real rows, never fewer. now only chooses which statement runs: a
// clock that is wrong costs plan caching, never a row.
func lookupStatement(scopedKey string, earliest, latest pgtype.Timestamptz, now time.Time) Statement {
	if earliest.InfinityModifier == pgtype.Finite && latest.InfinityModifier == pgtype.Finite {
		from, last := monthStart(earliest.Time), monthStart(latest.Time)
		to := last.AddDate(0, 1, 0)
		months := monthsBetween(from, to)
		recent := monthsBetween(last, monthStart(now))
		if months >= 1 && months <= maxWindowMonths && recent >= -1 && recent <= 1 && from.Year() >= 1000 && to.Year() <= 9999 {
			return Statement{
				SQL:  fmt.Sprintf(lookupWindowSQL, windowLiteral(from), windowLiteral(to)),
				Args: []any{scopedKey},
			}
		}
	}
	return Statement{SQL: lookupSQL, Args: []any{scopedKey, earliest, latest}}
}

// monthsBetween returns how many months the first instant of month b lies
// after that of month a.
func monthsBetween(a, b time.Time) int {
	return (b.Year()-a.Year())*12 + int(b.Month()) - int(a.Month())
}

// monthStart returns the first instant of t's UTC month.
func monthStart(t time.Time) time.Time {
	t = t.UTC()
	return time.Date(t.Year(), t.Month(), 1, 0, 0, 0, 0, time.UTC)
}

// windowLiteral formats the first instant of a UTC month (of a four-digit
// year, see lookupStatement) as a timestamptz constant that reads the same
// under every TimeZone and DateStyle setting.
func windowLiteral(month time.Time) string {
	return month.UTC().Format("2006-01-02 15:04:05+00")
}

// Lookup returns the newest archive row for scopedKey, or ErrNotFound. When
// fingerprint is not nil, the record says whether it matches the archived one.
// It emits idempotency_archive_lookup_duration_ms.
func (r *Reader) Lookup(ctx context.Context, scopedKey string, fingerprint []byte) (Record, error) {
	rec := Record{ScopedKey: scopedKey}
	if err := ValidateKey(scopedKey); err != nil {
		return rec, err
	}
	start := time.Now()
	var archived []byte
	var status int16
	var created, expired pgtype.Timestamptz
	found := false
	err := tracing.Span(ctx, "archive.lookup", func(ctx context.Context) error {
		e, err := r.expiryRange(ctx, scopedKey)
		if err != nil || !e.earliest.Valid {
			return err
		}
		lateFailed := false
		for {
			proven := true
			var lateTo pgtype.Timestamptz
			err := r.bounded(ctx, func(b *pgx.Batch) {
				if e.late != nil {
					b.Queue(e.late.SQL, e.late.Args...).QueryRow(func(row pgx.Row) (err error) {
						_, lateTo, err = scanRange(row)
						return err
					})
				}
				st := lookupStatement(scopedKey, e.earliest, e.latest, r.cfg.Now())
				b.Queue(st.SQL, st.Args...).Query(func(rows pgx.Rows) error {
					// Not found is an empty result, not an error: pgx drops a
					// connection's cached statements after a batch that
					// returns an error, and the next lookup would prepare
					// again before its statement timeout is set.
					for rows.Next() {
						found = true
						if err := rows.Scan(&status, &rec.ResourceID, &created, &expired, &archived); err != nil {
							return err
						}
					}
					return rows.Err()
				})
				if e.reach >= 0 {
					b.Queue(proofSQL, e.ceiling, e.reach.Milliseconds()).QueryRow(func(row pgx.Row) error { return row.Scan(&proven) })
				}
			})
			late := e.late
			e.late = nil
			if err == nil && lateFailed {
				// The same reads without the late one succeeded: it was
				// the late read that failed. Do not try it for a while.
				lateFailed = false
				r.mu.Lock()
				r.lateUnreadable = time.Now()
				r.mu.Unlock()
			}
			switch {
			case err != nil && late != nil && missingGrantOrTable(err):
				// A schema from before migration 010, or a role that may
				// not read its tables: read up to the ceiling, as lateBound
				// does.
				found, e.latest, lateFailed = false, e.ceiling, true
				e.recheck = nil // the same tables: read up to the ceiling, unchecked
				continue
			case err != nil:
				return err
			case !proven:
				// The writers changed since they were read, or the clocks
				// disagree more than the margin: read them again next time,
				// and this time read every partition.
				r.forgetWriters()
				found, e.reach, e.recheck = false, -1, nil
				e.earliest = pgtype.Timestamptz{InfinityModifier: pgtype.NegativeInfinity, Valid: true}
				e.latest = pgtype.Timestamptz{InfinityModifier: pgtype.Infinity, Valid: true}
				continue
			case late != nil:
				// The read above covered the key's prompt span; its late
				// rows, if any, lie up to lateTo: read them too. The late
				// read's snapshot is older than the archive read's, as it
				// would be a round trip earlier (see lateBound).
				if widened := lateBoundFrom(lateTo, e.ts, e.ceiling); later(widened, e.latest) {
					found, e.latest = false, widened
					continue
				}
			}
			if !found && e.recheck != nil {
				// Read where the key's rows are again, now that the read
				// found nothing: a row moved since they were first read is
				// where this says. A round trip of its own, run only for
				// an answer of not found, so a found key pays nothing.
				var lo, hi pgtype.Timestamptz
				err := r.bounded(ctx, func(b *pgx.Batch) {
					b.Queue(e.recheck.SQL, e.recheck.Args...).QueryRow(func(row pgx.Row) (err error) {
						lo, hi, err = scanRange(row)
						return err
					})
				})
				if err != nil {
					return err
				}
				if w, wider := e.widenedBy(lo, hi); wider {
					e = w
					continue
				}
			}
			return nil
		}
	})
	r.metrics.Emit(metrics.Milliseconds(metrics.ArchiveLookupDurationMs, time.Since(start)))
	if err != nil {
		return rec, fmt.Errorf("archive lookup: %w", queryError(ctx, err))
	}
	if !found {
		return rec, ErrNotFound
	}
	rec.Status = int(status)
	rec.CreatedAt, rec.ExpiredAt = Instant(created), Instant(expired)
	rec.FingerprintMatch = compareFingerprints(fingerprint, archived)
	return rec, nil
}

// bounded runs the queries queue adds in one round trip, after a
// set_config that bounds them with a statement timeout, the configured one
// shortened to end a margin (marginBefore) before ctx's deadline, and pins
// their DateStyle and bytea_output (see boundSQL). The batch runs as one
// implicit transaction, so the settings are local to it and are gone
// before the connection returns to the pool.
//
// The connection is taken first, and the timeout measured from then: a
// connection dialed for the batch (TLS, an IAM token) takes its time before
// the server's timer starts, and a timeout reckoned before the dial would
// end after the context's backstop, which closes the connection instead of
// letting the server cancel the query.
func (r *Reader) bounded(ctx context.Context, queue func(*pgx.Batch)) error {
	conn, err := r.pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	timeout := r.cfg.StatementTimeout
	deadlineBound := false
	deadline, hasDeadline := ctx.Deadline()
	var margin time.Duration
	if hasDeadline {
		left := time.Until(deadline)
		margin = marginBefore(left)
		if left-margin < timeout {
			timeout, deadlineBound = left-margin, true
		}
	}
	if timeout < time.Millisecond {
		return context.DeadlineExceeded
	}
	// The server enforces the timeout; the context backs it up where the
	// server cannot: a statement prepared before the batch runs (the
	// cache_statement mode prepares on a connection's first use), or a
	// connection that stops answering. Before a deadline it ends a quarter
	// of the margin before it: the server's cancel, due three quarters of
	// the margin earlier, has that long to arrive on a busy machine, and
	// the caller keeps the last quarter to answer in.
	backstop := time.Now().Add(timeout + time.Second)
	if hasDeadline && deadline.Add(-margin/4).Before(backstop) {
		backstop = deadline.Add(-margin / 4)
	}
	ctx, cancel := context.WithDeadline(ctx, backstop)
	defer cancel()
	b := &pgx.Batch{}
	b.Queue(boundSQL, strconv.FormatInt(timeout.Milliseconds(), 10)+"ms")
	queue(b)
	err = conn.SendBatch(ctx, b).Close()
	if pgErr := (*pgconn.PgError)(nil); deadlineBound && errors.As(err, &pgErr) && pgErr.Code == "57014" {
		err = fmt.Errorf("%w: %w", ErrDeadlineBound, err)
	}
	return err
}

// boundSQL sets the statement timeout of a batch's queries, and how they
// write dates and bytea as text: in the exec and simple_protocol modes (RDS
// Proxy's) results come back as text, and pgx reads only ISO dates and hex
// bytea, so a role, database or parameter group with another DateStyle, or
// with bytea_output = escape, would fail every lookup that finds a row (and
// a middleware that fails open would then run a late retry again).
const boundSQL = "SELECT set_config('statement_timeout', $1, true), set_config('DateStyle', 'ISO, YMD', true), set_config('bytea_output', 'hex', true)"

// queryError turns a cancelled statement or an expired deadline into
// ErrTimeout, and a database that could not be reached into ErrUnavailable
// (both still matching the original error).
func queryError(ctx context.Context, err error) error {
	var pgErr *pgconn.PgError
	if (errors.As(err, &pgErr) && pgErr.Code == "57014") || errors.Is(err, context.DeadlineExceeded) || errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return fmt.Errorf("%w: %w", ErrTimeout, err)
	}
	if database.Unavailable(err) {
		return fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	return err
}

// compareFingerprints says whether two fingerprints match: true when equal,
// false when both are SHA-256 digests and differ, unknown (nil) otherwise — an
// archived fingerprint that is not a digest (the runbook's probe stores
// '\x00') cannot prove a request different.
func compareFingerprints(given, archived []byte) *bool {
	if given == nil {
		return nil
	}
	match := bytes.Equal(given, archived)
	if !match && (len(given) != sha256.Size || len(archived) != sha256.Size) {
		return nil
	}
	return &match
}

// expiries bounds the expiries a key's archive rows can have.
type expiries struct {
	// earliest and latest bound them; an invalid (NULL) earliest means the
	// key has no row in the archive.
	earliest, latest pgtype.Timestamptz
	// reach is the skew the lower bound of a key with a timestamp allowed
	// for: negative when the bounds rest on no view of the writers.
	reach time.Duration
	// ceiling is the upper bound the view of the writers gave, the one
	// proofSQL proves: latest before the key's late rows narrowed it.
	ceiling pgtype.Timestamptz
	// ran is the statement run to learn the bounds (Args the key's), if any.
	ran *Statement
	// late, when set, is lateKeySQL for a key with a timestamp (ts) whose
	// latest is the end of its prompt span, before its late rows widen it:
	// the lookup runs it in the archive read's round trip, just before it,
	// and when its answer (lateBoundFrom, up to ceiling) lies later, reads
	// again up to there (see Lookup).
	late *Statement
	ts   time.Time
	// recheck, when set, is the statement that gave the bounds (ran): when
	// the archive read found nothing, the lookup runs it again, in a round
	// trip after the read's, and when its answer lies wider, reads again
	// over it (see widenedBy). A row moved between the two reads (an
	// owner's UPDATE of expired_at, recorded with the move) is missed by
	// the read only if it moved after the bounds were read and before the
	// read; the recheck, after the read, sees where it went.
	recheck *Statement
}

// widenedBy returns e's bounds widened to the range a recheck read (lo,
// hi: NULLs when the tables record nothing for the key), and whether that
// changed them. A timestamped key's recheck (lateKeySQL) moves only its
// upper bound, by its late rows, up to the ceiling, as the first read
// does; a key without one takes the range as read.
func (e expiries) widenedBy(lo, hi pgtype.Timestamptz) (expiries, bool) {
	w := e
	if e.recheck == nil {
		return w, false
	}
	if e.recheck.SQL == lateKeySQL {
		w.latest = lateBoundFrom(hi, e.ts, e.ceiling)
	} else if lo.Valid && hi.Valid {
		w.earliest, w.latest = earlier(e.earliest, lo), e.latest
		if later(hi, w.latest) {
			w.latest = hi
		}
	}
	return w, later(w.latest, e.latest) || later(e.earliest, w.earliest)
}

// earlier returns the earlier of a and b.
func earlier(a, b pgtype.Timestamptz) pgtype.Timestamptz {
	if later(a, b) {
		return b
	}
	return a
}

// expiryRange bounds the expiries a key's archive rows can have, so that
// its lookup reads only the partitions between them.
//
// A key with a timestamp: its rows were registered no earlier than its
// timestamp minus the reach (keytime.MaxClockSkew, see package keytime) and
// expired after that. This deliberately does not add the TTL: TTLs change,
// minting times do not. With no writer on record that archives at
// completion, every archive row was moved by a sweep, after it expired by
// the database's clock: the key is then also bounded above, by the
// database's clock as last read plus ceilingMargin. When that leaves months
// to read past the key's prompt span (lateReadSaves), the upper bound is
// narrowed to the span, and the lookup widens it to the key's late rows
// (e.late, lateBound).
//
// A key without one: the expiries idempotency_archive_plain_keys records for
// it, widened to every range whose rows are not all recorded yet (see
// migration 006 for the invariant). The database decides with the same rule
// as the trigger that records them whether the key has a timestamp; where it
// disagrees with keytime, every partition is read.
//
// The bounds of a key with a timestamp rest on a view of the writers up to
// reachTTL old: reach tells the lookup to prove them with proofSQL in the
// same round trip, after the lookup, and to read every partition when the
// proof fails.
func (r *Reader) expiryRange(ctx context.Context, scopedKey string) (expiries, error) {
	all := expiries{
		earliest: pgtype.Timestamptz{InfinityModifier: pgtype.NegativeInfinity, Valid: true},
		latest:   pgtype.Timestamptz{InfinityModifier: pgtype.Infinity, Valid: true},
		reach:    -1,
	}
	all.ceiling = all.latest
	if ts, ok := keytime.FromKey(scopedKey); ok {
		w, err := r.readWriters(ctx, reachTTL)
		if err != nil || w.reach < 0 {
			return all, err
		}
		e := all
		e.earliest, e.reach = pgtype.Timestamptz{Time: ts.Add(-w.reach), Valid: true}, w.reach
		if w.sweptOnly {
			e.latest = pgtype.Timestamptz{Time: r.cfg.Now().Add(w.clockOffset + ceilingMargin), Valid: true}
		}
		e.ceiling = e.latest
		if !lateReadSaves(ts, e.latest) || r.lateTablesUnreadable() {
			return e, nil
		}
		e.ran = &Statement{SQL: lateKeySQL, Args: []any{scopedKey, PromptSpan, ts}}
		e.late, e.ts, e.recheck = e.ran, ts, e.ran
		e.latest = lateBoundFrom(pgtype.Timestamptz{}, ts, e.latest) // the span's end: no late row known yet
		return e, nil
	}
	all.ran = &Statement{SQL: plainKeySQL, Args: []any{scopedKey}}
	var lo, hi pgtype.Timestamptz
	err := r.bounded(ctx, func(b *pgx.Batch) {
		b.Queue(plainKeySQL, scopedKey).QueryRow(func(row pgx.Row) (err error) {
			lo, hi, err = scanRange(row)
			return err
		})
	})
	if err != nil {
		if missingGrantOrTable(err) {
			// A schema migrated before the table existed, or a role without
			// SELECT on it: every partition is read. Correct, only slower.
			return all, nil
		}
		return all, fmt.Errorf("read where the key's rows are: %w", queryError(ctx, err))
	}
	e := all
	e.earliest, e.latest = lo, hi
	e.recheck = all.ran
	return e, nil
}

// settledRange is expiryRange with a timestamped key's late rows read in a
// round trip of their own: the bounds of the archive statement Lookup runs
// last, for measurements and tests of it.
func (r *Reader) settledRange(ctx context.Context, scopedKey string) (expiries, error) {
	e, err := r.expiryRange(ctx, scopedKey)
	if err != nil || e.late == nil {
		return e, err
	}
	e.latest, err = r.lateBound(ctx, *e.late, e.ts, e.ceiling)
	e.late = nil
	return e, err
}

// lateReadSaves reports whether a timestamped key's lookup should read
// where its late rows are (lateKeySQL) and then its prompt span and those
// rows, rather than every month from its timestamp to latest: when that
// spares at least two months (the read costs about as many relations as two
// partitions, and a second round trip for a key with late rows), or latest
// is unbounded.
func lateReadSaves(ts time.Time, latest pgtype.Timestamptz) bool {
	if latest.InfinityModifier != pgtype.Finite {
		return true
	}
	return monthsBetween(monthStart(ts.Add(PromptSpan)), monthStart(latest.Time)) >= 2
}

// lateKeySQL returns the range of expiries, beyond its prompt span, that a
// key with a timestamp can have archive rows at ($1 the key, $2 PromptSpan,
// $3 its timestamp by keytime): the records of migration 010 for it and every
// range still pending under either rule (NULLs when there is none), and
// whether the database judges the key otherwise than keytime (no timestamp,
// another timestamp, another span), when every expiry is possible (see
// scanRange).
//
// The spans are compared as text, field by field: interval's own equality
// holds '8 days' equal to '192 hours', but the trigger subtracts the span in
// the writer's TimeZone, where 8 days across a DST change are 191 or 193
// hours, so a span of days (changed by hand) would leave rows up to an hour
// past it unrecorded while the lookup trusted the records.
//
// The judgment is a column, not a branch of the union that yields the
// infinite range: as a branch, the statement planned in 0.6 ms on a fresh
// connection and in 1.6-2.5 ms on one that had run lookups in exec mode (a
// Lambda's connection behind RDS Proxy, measured on PostgreSQL 15); as a
// column, in 0.3-0.4 ms on either.
const lateKeySQL = `
SELECT min(lo), max(hi),
       NOT idempotency_key_has_time($1)
       OR idempotency_key_prompt_span()::text <> $2::interval::text
       OR idempotency_key_time_before($1, idempotency_key_time_bound($3, true), idempotency_key_time_bound($3, false))
       OR NOT idempotency_key_time_before($1, idempotency_key_time_bound($3::timestamptz + interval '1 millisecond', true),
                                              idempotency_key_time_bound($3::timestamptz + interval '1 millisecond', false))
  FROM (SELECT expired_at, expired_at
          FROM idempotency_archive_plain_keys
         WHERE key_hash = idempotency_key_hash($1)
        UNION ALL
        SELECT expired_from, expired_to
          FROM idempotency_archive_plain_keys_pending
        UNION ALL
        SELECT expired_from, expired_to
          FROM idempotency_archive_late_keys_pending) AS reach (lo, hi)`

// scanRange reads the row of lateKeySQL or plainKeySQL: the range of
// expiries the tables record for the key (NULLs when none), widened to every
// expiry when the database judges the key otherwise than keytime (its
// records then follow another rule, and say nothing of where this key's rows
// are). A NULL judgment counts as otherwise too.
func scanRange(row pgx.Row) (lo, hi pgtype.Timestamptz, err error) {
	var otherwise pgtype.Bool
	if err := row.Scan(&lo, &hi, &otherwise); err != nil {
		return lo, hi, err
	}
	if !otherwise.Valid || otherwise.Bool {
		lo = pgtype.Timestamptz{InfinityModifier: pgtype.NegativeInfinity, Valid: true}
		hi = pgtype.Timestamptz{InfinityModifier: pgtype.Infinity, Valid: true}
	}
	return lo, hi, nil
}

// lateBound returns the upper bound of a timestamped key's expiries, given
// by its prompt span and where its late rows are (st, lateKeySQL), at most
// latest.
//
// Why the rows it leaves out cannot exist (the invariant of migration 010):
// a row of the key that expired later than ts + PromptSpan is recorded, or
// lies in a pending range, and lateKeySQL's range holds both; so every row
// expired by ts + PromptSpan or lies in that range, and the bound is the
// later of the two ends. (The range between is read as well: one range
// keeps the lookup one statement.) A schema from before migration 010, or a
// role that may not read its tables, keeps latest.
func (r *Reader) lateBound(ctx context.Context, st Statement, ts time.Time, latest pgtype.Timestamptz) (pgtype.Timestamptz, error) {
	var hi pgtype.Timestamptz
	err := r.bounded(ctx, func(b *pgx.Batch) {
		b.Queue(st.SQL, st.Args...).QueryRow(func(row pgx.Row) (err error) {
			_, hi, err = scanRange(row)
			return err
		})
	})
	if err != nil {
		if missingGrantOrTable(err) {
			return latest, nil
		}
		return latest, fmt.Errorf("read where the key's late rows are: %w", queryError(ctx, err))
	}
	return lateBoundFrom(hi, ts, latest), nil
}

// lateBoundFrom is lateBound's answer from the end of lateKeySQL's range,
// hi (NULL when it found none).
func lateBoundFrom(hi pgtype.Timestamptz, ts time.Time, latest pgtype.Timestamptz) pgtype.Timestamptz {
	bound := pgtype.Timestamptz{Time: ts.Add(PromptSpan), Valid: true}
	if hi.Valid && later(hi, bound) {
		bound = hi
	}
	return earlier(bound, latest)
}

// later reports whether a lies after b (valid timestamps, infinities
// included).
func later(a, b pgtype.Timestamptz) bool {
	rank := func(t pgtype.Timestamptz) int { return int(t.InfinityModifier) }
	if rank(a) != rank(b) {
		return rank(a) > rank(b)
	}
	return a.InfinityModifier == pgtype.Finite && a.Time.After(b.Time)
}

// ceilingMargin is added to the database's clock as last read to bound a
// lookup above. It absorbs the drift between this host's clock and the
// database's over reachTTL (proofSQL catches anything larger), and a
// database clock that steps back after a sweep (a failover to a host whose
// clock is behind) by up to as much, which nothing can catch afterwards.
// Partitions are monthly, so an hour costs a partition more only in the
// last hour of a month.
const ceilingMargin = time.Hour

// proofSQL proves, after a lookup bounded by the writers as last read, that
// the bounds missed nothing: $1 the upper bound (infinity when none), $2 the
// skew the lower bound allowed for, in milliseconds.
//
// Every writer records itself before it writes a row, and no writer row is
// ever deleted; this statement's snapshot is later than the lookup's. So
// when it sees no writer that bounded nothing and no skew above $2, none had
// stored a row the lower bound could miss. The upper bound: archive rows are
// written only by sweeps (expired_at < the database's now() when swept)
// unless a writer archives at completion (ttl_ms = 0); when none is on
// record, every row the lookup could see was swept before it began, at a
// database time before clock_timestamp() here, and a bound at or after that
// time missed nothing.
const proofSQL = `
SELECT NOT coalesce(bool_or(NOT bounded), false)
       AND coalesce(max(skew_ms), 0) <= $2
       AND ($1::timestamptz = 'infinity'
            OR ($1 >= clock_timestamp() AND NOT coalesce(bool_or(ttl_ms = 0), false)))
  FROM idempotency_writers`

// Statement is one SQL statement of a lookup, with its arguments.
type Statement struct {
	SQL  string
	Args []any
}

// LookupStatements returns the statements Lookup runs for scopedKey, in
// order, for measurements of a lookup (its plans, the locks it takes): the
// read of idempotency_archive_plain_keys for a key without a timestamp (which
// it runs, to learn the next statement's bounds), the archive's, and the
// proof of a timestamped key's bounds: those of a lookup that finds its key
// (one that does not also reads where the key's rows are again).
func (r *Reader) LookupStatements(ctx context.Context, scopedKey string) ([]Statement, error) {
	if err := ValidateKey(scopedKey); err != nil {
		return nil, err
	}
	var out []Statement
	e, err := r.settledRange(ctx, scopedKey)
	if err != nil {
		return nil, err
	}
	if e.ran != nil {
		out = append(out, *e.ran)
	}
	if e.earliest.Valid {
		out = append(out, lookupStatement(scopedKey, e.earliest, e.latest, r.cfg.Now()))
	}
	if e.reach >= 0 {
		out = append(out, Statement{SQL: proofSQL, Args: []any{e.ceiling, e.reach.Milliseconds()}})
	}
	return out, nil
}

// plainKeySQL returns the range of expiries a key without a timestamp can
// have archive rows at (NULLs when it has none), and whether the database
// judges that the key has a timestamp, when every expiry is possible (see
// scanRange). A column, not a branch of the union, as in lateKeySQL.
const plainKeySQL = `
SELECT min(lo), max(hi), idempotency_key_has_time($1)
  FROM (SELECT expired_at, expired_at
          FROM idempotency_archive_plain_keys
         WHERE key_hash = idempotency_key_hash($1)
        UNION ALL
        SELECT expired_from, expired_to
          FROM idempotency_archive_plain_keys_pending) AS reach (lo, hi)`

// missingGrantOrTable reports an error that means the schema predates a
// table, or the role may not read it.
func missingGrantOrTable(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && (pgErr.Code == "42P01" || pgErr.Code == "42883" || pgErr.Code == "42501")
}

// writersSQL reads how far before its timestamp a key can have been stored
// (NULL when a writer on record bounded nothing, else the largest skew on
// record in milliseconds, 0 when none), whether a writer archives at
// completion, and the database's clock.
const writersSQL = `
SELECT CASE WHEN bool_or(NOT bounded) THEN NULL ELSE coalesce(max(skew_ms), 0) END,
       coalesce(bool_or(ttl_ms = 0), false),
       clock_timestamp(),
       coalesce(max(ttl_ms), 0)
  FROM idempotency_writers`

// readWriters returns the writers on record, as read at most maxAge ago (0:
// read now).
func (r *Reader) readWriters(ctx context.Context, maxAge time.Duration) (writersView, error) {
	r.mu.Lock()
	w, read := r.writers, r.writersRead
	r.mu.Unlock()
	if !read.IsZero() && time.Since(read) < maxAge {
		return w, nil
	}
	// Not under the lock: one slow caller must not hold up the others.
	// Bounded like every query: a migration holds this table exclusively
	// for a moment on every deploy.
	var ms *int64
	var atCompletion bool
	var dbNow time.Time
	var ttlMS int64
	sent, start := r.cfg.Now(), time.Now()
	err := r.bounded(ctx, func(b *pgx.Batch) {
		b.Queue(writersSQL).QueryRow(func(row pgx.Row) error { return row.Scan(&ms, &atCompletion, &dbNow, &ttlMS) })
	})
	if err != nil {
		if missingGrantOrTable(err) {
			// A schema migrated before writers recorded their bounds (run
			// migrate), or a role without SELECT on idempotency_writers
			// (grant idempotency_reader): nothing is bounded, every
			// partition is read. Correct, only slower.
			return writersView{reach: -1}, nil
		}
		return writersView{}, fmt.Errorf("read the writers' clock skews: %w", queryError(ctx, err))
	}
	// A TTL past maxRecordedTTL (written by hand) would overflow a
	// Duration; it reads as that long, which reaches every partition.
	w = writersView{reach: -1, maxTTL: time.Duration(min(ttlMS, maxRecordedTTL.Milliseconds())) * time.Millisecond}
	if atCompletion {
		w.maxTTL = max(w.maxTTL, MaxCompletionTTL)
	}
	if ms != nil {
		w.reach = max(keytime.MaxClockSkew, time.Duration(*ms)*time.Millisecond)
		w.sweptOnly = !atCompletion
		w.clockOffset = dbNow.Sub(sent.Add(time.Since(start) / 2))
	}
	r.mu.Lock()
	r.writers, r.writersRead = w, time.Now()
	r.mu.Unlock()
	return w, nil
}

// maxRecordedTTL caps the TTL read from idempotency_writers: 200 years.
const maxRecordedTTL = 200 * 365 * 24 * time.Hour

// forgetWriters makes the next lookup read idempotency_writers again.
// lateTablesUnreadable reports whether a lookup found the tables of
// migration 010 missing or not granted less than reachTTL ago. Reading up
// to the ceiling instead is what lateBound does when they are: slower,
// never a row missed.
func (r *Reader) lateTablesUnreadable() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return !r.lateUnreadable.IsZero() && time.Since(r.lateUnreadable) < reachTTL
}

func (r *Reader) forgetWriters() {
	r.mu.Lock()
	r.writersRead = time.Time{}
	r.mu.Unlock()
}

// ValidateKey reports a scoped key no lookup accepts (ErrInvalidKey): empty,
// longer than MaxScopedKeyBytes, not UTF-8, or with a NUL byte, which
// PostgreSQL text cannot hold, so no archived key is one of them.
func ValidateKey(k string) error {
	switch {
	case k == "":
		return fmt.Errorf("%w: empty", ErrInvalidKey)
	case len(k) > MaxScopedKeyBytes:
		return fmt.Errorf("%w: longer than %d bytes", ErrInvalidKey, MaxScopedKeyBytes)
	case !utf8.ValidString(k):
		return fmt.Errorf("%w: not valid UTF-8", ErrInvalidKey)
	case strings.IndexByte(k, 0) >= 0:
		// PostgreSQL text cannot hold NUL: no archived key contains one.
		return fmt.Errorf("%w: contains a NUL byte", ErrInvalidKey)
	}
	return nil
}

// Query selects archived keys for an investigation.
type Query struct {
	// ScopePrefix selects keys that start with it, byte for byte ('%' and '_'
	// are ordinary characters). Required.
	ScopePrefix string
	// CreatedFrom (inclusive) and CreatedTo (exclusive) bound created_at,
	// each rounded up to a whole microsecond. The zero time is 0001-01-01,
	// as any other.
	CreatedFrom, CreatedTo time.Time
	// Limit is the page size: 0 for DefaultPageSize (or
	// Config.MaxPageSize, if smaller), at most Config.MaxPageSize.
	Limit int
	// Cursor continues from a previous Page.NextCursor.
	Cursor string
}

// Page is one page of an investigation query, in (scoped_key, expired_at) order.
type Page struct {
	Records []Record `json:"records"`
	// NextCursor continues the query; empty on the last page.
	NextCursor string `json:"next_cursor,omitempty"`

	query string // the query's queryID, for Cut
}

// Cut keeps the page's first n records (at least one), and makes its
// NextCursor continue the query after the last of them: what a smaller
// limit would have answered. A page that must fit a size (a Lambda answer
// holds at most 6 MB) is cut instead of failing. Cut does nothing to a page
// of at most n records, nor to one that did not come from Investigate.
func (p *Page) Cut(n int) {
	n = max(n, 1)
	if len(p.Records) <= n || p.query == "" {
		return
	}
	p.Records = p.Records[:n]
	last := p.Records[n-1]
	p.NextCursor = encodeCursor(cursor{Key: last.ScopedKey, ExpiredAt: last.ExpiredAt, Query: p.query})
}

// querySQL pages through a key range in primary-key order. expired_at is
// bounded on both sides so that only the partitions the created_at window can
// reach are read: created_at <= expired_at <= created_at + MaxLiveTTL.
const querySQL = `
SELECT scoped_key, status_code, resource_id, created_at, expired_at
  FROM idempotency_key_archive
 WHERE scoped_key >= $1 AND scoped_key < $2
   AND starts_with(scoped_key, $3)
   AND (scoped_key, expired_at) > ($4, $5)
   AND created_at >= $6 AND created_at < $7
   AND expired_at >= $6 AND expired_at <= $8
 ORDER BY scoped_key, expired_at
 LIMIT $9`

// cursor is where a page ended: its last row's key and expiry, and the
// query it continues (queryID; empty in a cursor issued before cursors
// named their query, which continues any query of a prefix its key starts
// with).
type cursor struct {
	Key       string
	ExpiredAt time.Time
	Query     string
}

// queryID names the query a cursor continues: its prefix and window, as
// read (rounded up to microseconds), not its page size. A cursor continued
// under another prefix or window would start after its key there, leaving
// out, without a word, the rows of that query before it.
func queryID(prefix string, from, to time.Time) string {
	h := sha256.New()
	h.Write([]byte(prefix))
	h.Write([]byte{0})
	h.Write([]byte(strconv.FormatInt(from.UnixMicro(), 10) + "," + strconv.FormatInt(to.UnixMicro(), 10)))
	return base64.RawURLEncoding.EncodeToString(h.Sum(nil)[:12])
}

// DefaultPageSize is the page size of a Query that sets none.
const DefaultPageSize = 100

// maxCursorBytes bounds what decoding a cursor reads. It is not a bound on
// keys: the archive's schema has none, and btree compresses an index entry
// before its 2,704-byte limit applies, so a compressible key of another
// writer (or a hand insert) may be far longer, and the cursor of a page
// that ends on it must still continue the query. 1 MiB holds the JSON form
// (six bytes a key byte at most) of a key of over 170 KB; a request
// carrying a cursor is bounded anyway (6 MB a Lambda payload, 10 KB a
// request line through API Gateway).
const maxCursorBytes = 1 << 20

// cursorJSON is a cursor as issued before the binary form: the expiry in
// microseconds since 1970, PostgreSQL's precision, which holds every year
// from 4713 BC to 294246 AD (RFC 3339 cannot write a year outside 0-9999,
// and a row written by hand may have one; pgx reads no timestamp later
// than int64 microseconds hold). Older cursors carry it as RFC 3339
// instead ("e").
type cursorJSON struct {
	Key    string     `json:"k"`
	Micros *int64     `json:"u,omitempty"`
	RFC    *time.Time `json:"e,omitempty"`
	Query  string     `json:"q,omitempty"`
}

// Timestamps PostgreSQL holds: 4713 BC to 294276 AD.
var (
	minCursorTime = time.Date(-4712, 1, 1, 0, 0, 0, 0, time.UTC)
	maxCursorTime = time.Date(294276, 12, 31, 0, 0, 0, 0, time.UTC)
)

// Investigate returns one page of archived keys under q.ScopePrefix created
// within [q.CreatedFrom, q.CreatedTo).
func (r *Reader) Investigate(ctx context.Context, q Query) (Page, error) {
	page := Page{Records: []Record{}}
	// The query is checked before anything is read, so that bad input is
	// refused as such whatever the state of the database (never a 503 that
	// invites a retry of input that can never succeed).
	inv, err := r.investigation(q)
	if err != nil {
		return page, err
	}
	// A writer on record with a TTL longer than MaxLiveTTL (a setting left
	// behind when a TTL was raised) widens the expiries read, so that its
	// rows are not silently left out.
	// Writers that cannot be read fail the query rather than narrow it
	// silently; a schema or role without the table reads MaxLiveTTL alone.
	// They are read afresh for every page: unlike a lookup's bounds, which
	// proofSQL checks afterwards, nothing would catch a view up to
	// reachTTL old that misses a writer come on record since (a Redis store
	// archiving at completion, with TTLs past MaxLiveTTL). A writer that
	// comes on record between this read and the page's query can leave out
	// only rows archived in that moment, which a query begun a moment
	// earlier would not have listed either.
	w, err := r.readWriters(ctx, 0)
	if err != nil {
		return page, fmt.Errorf("archive investigation query: %w", err)
	}
	args := inv.args(max(r.cfg.MaxLiveTTL, w.maxTTL))
	err = tracing.Span(ctx, "archive.investigate", func(ctx context.Context) error {
		return r.bounded(ctx, func(b *pgx.Batch) {
			b.Queue(querySQL, args...).Query(func(rows pgx.Rows) error {
				for rows.Next() {
					var rec Record
					var status int16
					var created, expired pgtype.Timestamptz
					if err := rows.Scan(&rec.ScopedKey, &status, &rec.ResourceID, &created, &expired); err != nil {
						return err
					}
					rec.Status = int(status)
					rec.CreatedAt, rec.ExpiredAt = Instant(created), Instant(expired)
					page.Records = append(page.Records, rec)
				}
				return rows.Err()
			})
		})
	})
	if err != nil {
		return Page{Records: []Record{}}, fmt.Errorf("archive investigation query: %w", queryError(ctx, err))
	}
	page.query = inv.id
	// One row more than the page was read to learn whether another page exists.
	if len(page.Records) > inv.limit {
		page.Cut(inv.limit)
	}
	return page, nil
}

// investigation is a checked Query: the arguments of querySQL but the
// expiries' upper bound, which depends on the writers' TTLs.
type investigation struct {
	prefix, upper string
	afterKey      string
	afterExpiry   pgtype.Timestamptz
	from, to      time.Time
	limit         int
	id            string // queryID
}

// args returns the arguments of querySQL, for rows that lived up to ttl.
func (inv investigation) args(ttl time.Duration) []any {
	return []any{
		inv.prefix, inv.upper, inv.prefix, inv.afterKey, inv.afterExpiry,
		inv.from, inv.to, inv.to.Add(ttl), inv.limit + 1,
	}
}

// investigation validates q, reading nothing.
func (r *Reader) investigation(q Query) (investigation, error) {
	if q.ScopePrefix == "" || !utf8.ValidString(q.ScopePrefix) || len(q.ScopePrefix) > MaxScopedKeyBytes || strings.IndexByte(q.ScopePrefix, 0) >= 0 {
		return investigation{}, fmt.Errorf("%w: scope prefix must be non-empty UTF-8 without NUL bytes, of at most %d bytes", ErrInvalidQuery, MaxScopedKeyBytes)
	}
	// PostgreSQL keeps microseconds: both bounds are rounded up to one,
	// which keeps exactly the times [from, to) holds.
	from, to := ceilMicrosecond(q.CreatedFrom), ceilMicrosecond(q.CreatedTo)
	if !from.Before(to) {
		return investigation{}, fmt.Errorf("%w: created_from must be before created_to", ErrInvalidQuery)
	}
	if q.Limit == 0 {
		q.Limit = min(DefaultPageSize, r.cfg.MaxPageSize)
	}
	if q.Limit < 1 || q.Limit > r.cfg.MaxPageSize {
		return investigation{}, fmt.Errorf("%w: limit must be between 1 and %d", ErrInvalidQuery, r.cfg.MaxPageSize)
	}
	upper, ok := prefixUpperBound(q.ScopePrefix)
	if !ok {
		return investigation{}, fmt.Errorf("%w: a scope prefix made only of U+10FFFF has no upper bound", ErrInvalidQuery)
	}
	inv := investigation{
		prefix: q.ScopePrefix, upper: upper, afterKey: q.ScopePrefix,
		afterExpiry: pgtype.Timestamptz{InfinityModifier: pgtype.NegativeInfinity, Valid: true},
		from:        from, to: to, limit: q.Limit, id: queryID(q.ScopePrefix, from, to),
	}
	if q.Cursor != "" {
		c, err := decodeCursor(q.Cursor)
		if err != nil {
			return investigation{}, err
		}
		if (c.Query != "" && c.Query != inv.id) || !strings.HasPrefix(c.Key, q.ScopePrefix) {
			// Read under another prefix or window it would answer a page
			// without the rows before its key, or an empty one, as if
			// the scope held nothing more.
			return investigation{}, fmt.Errorf("%w: it continues a query of another scope prefix or window", ErrInvalidCursor)
		}
		inv.afterKey, inv.afterExpiry = c.Key, pgtype.Timestamptz{Time: c.ExpiredAt, Valid: true}
	}
	return inv, nil
}

// ceilMicrosecond rounds t up to a whole microsecond.
func ceilMicrosecond(t time.Time) time.Time {
	if c := t.Truncate(time.Microsecond); c.Before(t) {
		return c.Add(time.Microsecond)
	}
	return t
}

// cursorChecked is the first byte of a cursor in its binary form: then the
// expiry in microseconds since 1970 (8 bytes, big-endian, signed), the
// query id's length (1 byte) and bytes, the key's bytes, as they are, and
// the CRC-32C of everything before it (4 bytes, big-endian). The checksum
// refuses a cursor cut short (a copy, a log line) or altered: its key's
// tail would otherwise read as another key of the prefix, and the next page
// would list keys again or skip some, without a word. Base64url makes it
// about 4/3 of the key: the JSON form (still accepted, from cursors issued
// before) wrote a byte of key in up to six ('<', a control character), and
// a page ending on a 2,000-byte key had a 16 KB cursor, past the 10 KB
// request line API Gateway accepts.
//
// cursorBinary is the same form without the checksum, as releases before
// it issued cursors; still accepted.
const (
	cursorBinary  = 0x02
	cursorChecked = 0x03
)

var cursorCRC = crc32.MakeTable(crc32.Castagnoli)

func encodeCursor(c cursor) string {
	q := c.Query[:min(len(c.Query), 255)] // queryID's are 16 bytes
	b := make([]byte, 0, 14+len(q)+len(c.Key))
	b = append(b, cursorChecked)
	b = binary.BigEndian.AppendUint64(b, uint64(c.ExpiredAt.UnixMicro()))
	b = append(b, byte(len(q)))
	b = append(b, q...)
	b = append(b, c.Key...)
	b = binary.BigEndian.AppendUint32(b, crc32.Checksum(b, cursorCRC))
	return base64.RawURLEncoding.EncodeToString(b)
}

func decodeCursor(s string) (cursor, error) {
	b, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil || len(b) > maxCursorBytes || len(b) == 0 {
		return cursor{}, ErrInvalidCursor
	}
	var c cursor
	if b[0] == cursorChecked {
		n := len(b) - 4
		if n < 1 || binary.BigEndian.Uint32(b[n:]) != crc32.Checksum(b[:n], cursorCRC) {
			return cursor{}, ErrInvalidCursor
		}
		b = b[:n]
	}
	if b[0] == cursorBinary || b[0] == cursorChecked {
		// Every binary cursor was issued with its query's id: one without
		// would continue any query of a prefix its key starts with, the
		// leniency kept for JSON cursors of releases before query ids.
		if len(b) < 10 || b[9] == 0 || len(b) < 10+int(b[9]) {
			return cursor{}, ErrInvalidCursor
		}
		c.ExpiredAt = time.UnixMicro(int64(binary.BigEndian.Uint64(b[1:9]))).UTC()
		c.Query, c.Key = string(b[10:10+int(b[9])]), string(b[10+int(b[9]):])
	} else if c, err = decodeCursorJSON(b); err != nil {
		return cursor{}, err
	}
	if c.Key == "" || !utf8.ValidString(c.Key) || strings.IndexByte(c.Key, 0) >= 0 ||
		c.ExpiredAt.Before(minCursorTime) || c.ExpiredAt.After(maxCursorTime) {
		return cursor{}, ErrInvalidCursor
	}
	return c, nil
}

// decodeCursorJSON reads a cursor issued in the JSON form.
func decodeCursorJSON(b []byte) (cursor, error) {
	var j cursorJSON
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&j); err != nil || dec.More() || (j.Micros == nil) == (j.RFC == nil) {
		return cursor{}, ErrInvalidCursor
	}
	c := cursor{Key: j.Key, Query: j.Query}
	if j.Micros != nil {
		c.ExpiredAt = time.UnixMicro(*j.Micros).UTC()
	} else {
		c.ExpiredAt = j.RFC.UTC().Truncate(time.Microsecond)
	}
	return c, nil
}

// prefixUpperBound returns the smallest string greater than every string that
// starts with p, in byte order (UTF-8 preserves code point order), or false
// when there is none.
func prefixUpperBound(p string) (string, bool) {
	runes := []rune(p)
	for i := len(runes) - 1; i >= 0; i-- {
		switch r := runes[i]; {
		case r == utf8.MaxRune:
			continue
		case r == 0xD7FF:
			runes[i] = 0xE000 // skip the surrogate range
		default:
			runes[i] = r + 1
		}
		return string(runes[:i+1]), true
	}
	return "", false
}
