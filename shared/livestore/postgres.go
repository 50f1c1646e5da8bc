// Package livestore holds the live stores behind the idempotency middleware:
// Postgres (the idempotency_keys table that the sweeper archives from) and
// Redis (which archives at completion, because Redis cannot be swept).
package livestore

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemarchive/idemarchive/shared/archive"
	"github.com/idemarchive/idemarchive/shared/database"
	"github.com/idemarchive/idemarchive/shared/idempotency"
	"github.com/idemarchive/idemarchive/shared/keytime"
)

// ErrNotInFlight means Complete found no in-flight entry with that fingerprint
// (it expired, or was released): idempotency.ErrNotInFlight.
var ErrNotInFlight = idempotency.ErrNotInFlight

// Postgres keeps live keys in idempotency_keys.
//
// It enforces the invariant of package keytime with the database's clock:
// before it registers keys under a (TTL, skew) it holds a lease on that pair
// in idempotency_writers, and the registration statement refuses a key
// whose timestamp lies more than the skew ahead of now() and registers
// nothing without a live lease. The same statement then decides, from every
// writer on record, whether an earlier life of the fresh key can have
// expired (and been archived): when none can, the middleware skips the
// archive lookup. Its pool's role needs the idempotency_writer grants.
type Postgres struct {
	pool   *pgxpool.Pool
	leases *leases
	// untokenedUntil, while in the future (Unix nanoseconds), makes the store
	// register, complete and release without registration tokens: the
	// database has no registration column yet (migration 008 not run, the
	// middleware upgraded first). Checked again a minute later.
	untokenedUntil atomic.Int64
}

// byToken runs tokened (args, then the token as its last parameter) for the
// entry stored with token, or stored without one when token is nil
// (registration IS NOT DISTINCT FROM NULL). Only a nil token may fall back to
// untokened (args alone), which matches key and fingerprint whatever the
// entry's token: in a database without the registration column no entry has
// one. A token never falls back: a release by a token whose registration may
// not have landed must not free a concurrent duplicate's entry instead.
func (p *Postgres) byToken(ctx context.Context, token []byte, tokened, untokened string, args ...any) (pgconn.CommandTag, error) {
	token = nonEmpty(token)
	if token == nil && !p.tokens() {
		return p.pool.Exec(ctx, untokened, args...)
	}
	tag, err := p.pool.Exec(ctx, tokened, append(args, token)...)
	if token == nil && p.noTokenColumn(err) {
		return p.pool.Exec(ctx, untokened, args...)
	}
	return tag, err
}

// nonEmpty is token, or nil for an empty one: both mean "no token".
func nonEmpty(token []byte) []byte {
	if len(token) == 0 {
		return nil
	}
	return token
}

// tokens reports whether the database takes registration tokens, as far as
// the store last saw.
func (p *Postgres) tokens() bool { return time.Now().UnixNano() >= p.untokenedUntil.Load() }

// noTokenColumn reports an error that means the registration column does not
// exist yet, and makes the store go without tokens for a minute.
func (p *Postgres) noTokenColumn(err error) bool {
	if database.SQLState(err) != database.CodeUndefinedColumn || !strings.Contains(err.Error(), "registration") {
		return false
	}
	p.untokenedUntil.Store(time.Now().Add(time.Minute).UnixNano())
	return true
}

var _ idempotency.Store = (*Postgres)(nil)

// NewPostgres returns a store over pool.
func NewPostgres(pool *pgxpool.Pool) *Postgres {
	return &Postgres{pool: pool, leases: newLeases(pool)}
}

// expirySlack widens the "can it have expired yet" test of the skip: a row
// counts as possibly expired from expirySlack before its earliest expiry, so
// a database clock that steps back by up to that much never lets a key skip
// a lookup it needs.
const expirySlack = time.Second

const (
	// pgRegisterSQL registers $1 (fingerprint $2, TTL $3 ms, skew $4 ms,
	// timestamp $5 or NULL) when this writer's lease covers now() and the
	// timestamp is at most the skew ahead of now(). It reports whether the
	// lease was live, whether the key is ahead, the new row's times when one
	// was inserted, and whether an earlier life of the key can be archived:
	// a key without a timestamp always can; otherwise some writer w on
	// record could have registered it (it was in use at or after
	// minted - w.skew) early enough for that registration to have expired by
	// now (a registration is no earlier than minted - w.skew and no earlier
	// than w.first_used, and lives w.ttl). A writer that bounded nothing
	// could have registered anything. A writer that archives at completion
	// (ttl 0, the Redis store) could have archived any key minted while its
	// lease ran: its registrations follow its own clock, not the database's,
	// so a host clock ahead of the database's lets it archive a key minted
	// ahead of now(), which the expiry test would rule out. clock_timestamp() is read after the
	// insert, which waited for any sweep of the key's previous row to
	// commit, so a row that sweep archived had expired before it.
	pgRegisterTemplate = `
WITH lease AS (
    SELECT EXISTS (SELECT 1 FROM idempotency_writers
                    WHERE ttl_ms = $3 AND skew_ms = $4 AND bounded
                      AND first_used <= now() AND used_until >= now()) AS live
), ahead AS (
    SELECT $5::timestamptz IS NOT NULL AND $5::timestamptz > now() + $4 * interval '1 millisecond' AS ahead
), ins AS (
    INSERT INTO idempotency_keys (scoped_key, fingerprint, expires_at, skew_ms%[1]s)
    SELECT $1, $2, now() + $3 * interval '1 millisecond', $4%[2]s
      FROM lease, ahead
     WHERE lease.live AND NOT ahead.ahead
    ON CONFLICT (scoped_key) DO NOTHING
    RETURNING created_at, expires_at
)
SELECT lease.live, ahead.ahead, ins.created_at, ins.expires_at,
       ins.created_at IS NOT NULL AND ($5::timestamptz IS NULL OR EXISTS (
           SELECT 1 FROM idempotency_writers w
            WHERE NOT w.bounded
               OR (w.used_until >= $5::timestamptz - w.skew_ms * interval '1 millisecond'
                   AND (w.ttl_ms = 0
                        OR greatest($5::timestamptz - w.skew_ms * interval '1 millisecond', w.first_used)
                           + w.ttl_ms * interval '1 millisecond'
                           <= clock_timestamp() + $6 * interval '1 millisecond'))))
  FROM lease CROSS JOIN ahead LEFT JOIN ins ON true`

	// pgGetSQL reads an entry, and whether its window has ended by the
	// database's clock, the one that set expires_at.
	pgGetSQL = `
SELECT fingerprint, state, coalesce(status_code, 0), coalesce(response_raw, convert_to(response::text, 'UTF8')),
       coalesce(content_type, ''), resource_id, created_at, expires_at, expires_at <= now(),
       response_raw IS NULL AND response IS NOT NULL
  FROM idempotency_keys
 WHERE scoped_key = $1`

	// pgCompleteSQL and pgReleaseSQL act only on the entry this request
	// registered: its fingerprint and its registration token (NULL for an
	// entry registered without one, see migration 008).
	pgCompleteUntokenedSQL = `
UPDATE idempotency_keys
   SET state = 'completed', status_code = $3, response = $4::text::jsonb, response_raw = $5,
       content_type = $6, resource_id = $7
 WHERE scoped_key = $1 AND fingerprint = $2 AND state = 'in_flight'`
	pgCompleteSQL = pgCompleteUntokenedSQL + `
   AND registration IS NOT DISTINCT FROM $8::bytea`

	pgReleaseUntokenedSQL = `
DELETE FROM idempotency_keys
 WHERE scoped_key = $1 AND fingerprint = $2 AND state = 'in_flight'`
	pgReleaseSQL = pgReleaseUntokenedSQL + `
   AND registration IS NOT DISTINCT FROM $3::bytea`

	// pgReleaseInWindowSQL and its untokened form release an entry only
	// while its window lasts, by the database's clock (see Release).
	pgReleaseInWindowSQL = pgReleaseSQL + `
   AND expires_at > now()`
	pgReleaseInWindowUntokenedSQL = pgReleaseUntokenedSQL + `
   AND expires_at > now()`
)

// pgRegisterSQL registers with the request's token ($7); the untokened form
// is for a database not yet migrated to migration 008.
var (
	pgRegisterSQL          = fmt.Sprintf(pgRegisterTemplate, ", registration", ", $7::bytea")
	pgRegisterUntokenedSQL = fmt.Sprintf(pgRegisterTemplate, "", "")
)

// Register bounds: the registration statement runs under a server-side
// statement timeout of registerTimeout, or less when the request's deadline
// comes sooner, and its caller waits up to registerGrace longer than that
// for the server's answer, whatever the request's context says.
//
// Why (the invariant): every registration is released by its token when its
// request cannot go on, and a release finds only a row that has committed.
// The insert can wait on a row lock (a sweep batch holding the key's expired
// row) and commits by itself when the wait ends. Were the wait cut short on
// the client (the client went away, the request's deadline passed), pgx
// would close the connection at once, and the server, which notices a
// closed connection only when it next writes to it, would commit the row
// after the release had found nothing: an entry nobody releases, answered
// 409 in flight for the whole window. Waiting for the server's answer, which
// its own timeout guarantees within the statement timeout, makes the
// outcome known before the request goes on, and a registration that landed
// is released by the same token. Only a connection that stops answering for
// registerGrace past its timeout (or a process killed mid-statement) can
// still leave one.
//
// The wait covers the statement alone: a request whose context has ended
// before its statement is sent (while it waits for a pool connection, or
// between attempts) sends nothing and returns its context's error at once,
// since nothing of it can be on the server.
const (
	registerTimeout = 5 * time.Second
	registerGrace   = 2 * time.Second
)

// registerSettingsSQL is textOutputSQL with the statement timeout of the
// registration ($1, as '<n>ms'), all local to its implicit transaction.
const registerSettingsSQL = "SELECT set_config('DateStyle', 'ISO, YMD', true), set_config('bytea_output', 'hex', true), set_config('statement_timeout', $1, true)"

// Register inserts an in-flight row, or returns the existing one. The insert
// and the read are separate statements: under READ COMMITTED the read then
// sees a row that a concurrent request committed while the insert waited.
// The insert is bounded by ctx's deadline but, once sent, not cut short by
// ctx (see registerTimeout).
func (p *Postgres) Register(ctx context.Context, req idempotency.Registering) (idempotency.Registration, error) {
	if err := req.Validate(); err != nil {
		return idempotency.Registration{}, fmt.Errorf("register idempotency key: %w", err)
	}
	l := lease{ttlMS: durationMS(req.TTL), skewMS: durationMS(req.ClockSkew)}
	var minted pgtype.Timestamptz
	if ts, ok := keytime.FromKey(req.Key); ok {
		minted = pgtype.Timestamptz{Time: ts, Valid: true}
	}
	if err := p.leases.renew(ctx, l, false); err != nil {
		return idempotency.Registration{}, err
	}
	for attempt := 0; attempt < 6; attempt++ {
		var live, ahead bool
		var created, expires *time.Time
		var mayBeArchived bool
		scan := func(row pgx.Row) error { return row.Scan(&live, &ahead, &created, &expires, &mayBeArchived) }
		args := []any{req.Key, req.Fingerprint, l.ttlMS, l.skewMS, minted, expirySlack.Milliseconds()}
		token := nonEmpty(req.Token)
		// Under a default_transaction_isolation of REPEATABLE READ or
		// SERIALIZABLE, a registration that waited for another of the same
		// key fails with a serialization failure, writing nothing: run
		// again with a new snapshot, it sees that one's row.
		err := untilSerialized(ctx, func() error {
			if token != nil && p.tokens() {
				err := p.insert(ctx, scan, pgRegisterSQL, append(args, token)...)
				if !p.noTokenColumn(err) {
					return err
				}
			}
			token = nil
			return p.insert(ctx, scan, pgRegisterUntokenedSQL, args...)
		})
		if err != nil {
			return idempotency.Registration{}, fmt.Errorf("register idempotency key: %w", err)
		}
		switch {
		case !live:
			// The lease ran out (a paused process, a clock jump): renew
			// it now and try again.
			if err := p.leases.renew(ctx, l, true); err != nil {
				return idempotency.Registration{}, err
			}
			continue
		case ahead:
			// Not stored under this writer's skew. A writer that allows
			// more may have stored it: its entry is the answer.
			e, err := p.get(ctx, req.Key)
			if errors.Is(err, pgx.ErrNoRows) {
				return idempotency.Registration{Ahead: true}, nil
			}
			return idempotency.Registration{Entry: e}, err
		case created != nil:
			e := idempotency.Entry{Fingerprint: req.Fingerprint, State: idempotency.InFlight, CreatedAt: *created, ExpiresAt: *expires}
			return idempotency.Registration{Entry: e, Fresh: true, MayBeArchived: mayBeArchived, Token: token}, nil
		}
		e, err := p.get(ctx, req.Key)
		if errors.Is(err, pgx.ErrNoRows) {
			continue // released between the two statements: try again
		}
		return idempotency.Registration{Entry: e}, err
	}
	return idempotency.Registration{}, errors.New("register idempotency key: the key keeps being released concurrently, or the writer lease keeps running out")
}

// textOutputSQL pins how the statement after it, in the same implicit
// transaction, writes dates and bytea as text. In the exec and
// simple_protocol modes (RDS Proxy's) results come back as text, which pgx
// reads only in ISO dates and hex bytea: a role, database or parameter group
// with another DateStyle, or with bytea_output = escape, would fail every
// registration of a key already stored (its fingerprint is bytea).
const textOutputSQL = "SELECT set_config('DateStyle', 'ISO, YMD', true), set_config('bytea_output', 'hex', true)"

// queryRow runs sql with args after textOutputSQL, in one round trip, and
// passes its row to scan.
func (p *Postgres) queryRow(ctx context.Context, scan func(pgx.Row) error, sql string, args ...any) error {
	return p.pool.SendBatch(ctx, rowAfter(textOutputSQL, nil, scan, sql, args...)).Close()
}

// rowAfter returns the batch that runs sql with args after the statement
// settings (with settingsArgs), which set values local to their implicit
// transaction, and passes sql's row to scan.
func rowAfter(settings string, settingsArgs []any, scan func(pgx.Row) error, sql string, args ...any) *pgx.Batch {
	b := &pgx.Batch{}
	b.Queue(settings, settingsArgs...)
	b.Queue(sql, args...).QueryRow(scan)
	return b
}

// insert runs a registration statement as queryRow does, under a server-side
// statement timeout of registerTimeout or what is left of ctx's deadline,
// whichever is shorter, and once it is sent waits for its answer up to
// registerGrace longer even when ctx ends first (see registerTimeout).
//
// Everything before the statement is sent runs under ctx, and its failure
// wraps idempotency.ErrNotSent: the wait for a pool connection, and, in the
// execution modes that prepare statements in a round trip of their own
// before the batch (every extended mode but exec), the preparation, which
// can wait on a relation lock (a migration's) with no statement timeout yet
// set. A Parse commits nothing, so cutting it short leaves nothing behind;
// the timeout is computed after both, from what is left of the deadline.
func (p *Postgres) insert(ctx context.Context, scan func(pgx.Row) error, sql string, args ...any) error {
	if err := ctx.Err(); err != nil {
		return notSent(err)
	}
	conn, err := p.pool.Acquire(ctx)
	if err != nil {
		return notSent(err)
	}
	defer conn.Release()
	settings, statement := registerSettingsSQL, sql
	if prepares(conn.Conn().Config().DefaultQueryExecMode) {
		// At most registerTimeout, even for a request without a deadline.
		pctx, cancel := context.WithTimeout(ctx, registerTimeout)
		if settings, err = prepare(pctx, conn.Conn(), registerSettingsSQL); err == nil {
			statement, err = prepare(pctx, conn.Conn(), sql)
		}
		cancel()
		if err != nil {
			return notSent(err) // a Parse registers nothing
		}
	}
	timeout := registerTimeout
	if deadline, ok := ctx.Deadline(); ok {
		timeout = min(timeout, time.Until(deadline))
	}
	if err := ctx.Err(); err != nil {
		return notSent(err)
	}
	if timeout < time.Millisecond {
		// Never '0ms': PostgreSQL reads it as no timeout at all.
		return notSent(context.DeadlineExceeded)
	}
	wait, cancel := context.WithTimeout(context.WithoutCancel(ctx), timeout+registerGrace)
	defer cancel()
	b := rowAfter(settings, []any{strconv.FormatInt(timeout.Milliseconds(), 10) + "ms"}, scan, statement, args...)
	return conn.SendBatch(wait, b).Close()
}

// notSent marks err as the failure of a registration that was never sent.
func notSent(err error) error {
	return fmt.Errorf("%w: %w", idempotency.ErrNotSent, err)
}

// prepares reports whether mode prepares a statement (Parse, Describe) in a
// round trip before the batch that runs it.
func prepares(mode pgx.QueryExecMode) bool {
	return mode != pgx.QueryExecModeExec && mode != pgx.QueryExecModeSimpleProtocol
}

// prepare prepares sql on conn under a name of its own and returns the
// name, which a batch then runs without preparing it again. Preparing the
// same statement again on the same connection is a no-op.
func prepare(ctx context.Context, conn *pgx.Conn, sql string) (string, error) {
	sum := sha256.Sum256([]byte(sql))
	sd, err := conn.Prepare(ctx, "idemarchive_register_"+hex.EncodeToString(sum[:8]), sql)
	if err != nil {
		return "", err
	}
	return sd.Name, nil
}

func (p *Postgres) get(ctx context.Context, key string) (idempotency.Entry, error) {
	var e idempotency.Entry
	var state string
	var status int16
	var response []byte
	var created, expires pgtype.Timestamptz
	var ended bool
	err := p.queryRow(ctx, func(row pgx.Row) error {
		return row.Scan(&e.Fingerprint, &state, &status, &response, &e.ContentType, &e.ResourceID, &created, &expires, &ended, &e.BodyIsJSONB)
	}, pgGetSQL, key)
	if err != nil {
		if errors.Is(err, pgx.ErrNoRows) {
			return e, err
		}
		return e, fmt.Errorf("read idempotency key: %w", err)
	}
	e.Status = int(status)
	if state == "completed" {
		e.State = idempotency.Completed
	}
	e.Body = response
	// An infinite time (a row written by hand) is the zero time, which
	// answers write as null; whether the window ended is ended's to say.
	e.CreatedAt, e.ExpiresAt, e.WindowEnded = archive.Instant(created), archive.Instant(expires), &ended
	return e, nil
}

// Complete records the response byte for byte in response_raw, whatever
// its content type: a replay returns exactly what the first request got.
// (Storing JSON as jsonb would reorder keys, drop whitespace, and reject
// valid JSON that jsonb cannot hold, such as \u0000, a lone surrogate or
// 1e1000000, which would leave a request that ran with no completed key.)
// The resource id was read in Go and travels in its own column, so the
// sweeper never needs the jsonb response of rows this store writes.
func (p *Postgres) Complete(ctx context.Context, key string, c idempotency.Completion) error {
	var asJSON *string // kept in the statement for rows other writers store as jsonb
	raw := c.Body
	if raw == nil {
		raw = []byte{}
	}
	// An entry is completed by the token it was stored with, and one stored
	// without a token only without one: never one for the other.
	args := []any{key, c.Fingerprint, c.Status, asJSON, raw, c.ContentType, c.ResourceID}
	tag, err := p.byToken(ctx, c.Token, pgCompleteSQL, pgCompleteUntokenedSQL, args...)
	if err != nil {
		return fmt.Errorf("complete idempotency key: %w", err)
	}
	if tag.RowsAffected() == 0 {
		return ErrNotInFlight
	}
	return nil
}

// Release deletes the in-flight row this request registered, but only while
// its window lasts by the database's clock: once it has ended, retries have
// been answered 409 expired ("not run again"), and the sweeper archives the
// row as expired in flight when its grace ends (SWEEP_IN_FLIGHT_GRACE).
// Removed, it would be in neither place and the next retry would run. The
// middleware frees a registration whose handler never started with
// ReleaseBeforeRun instead; a store wrapped so that it hides that method
// only keeps such an entry too, the safe way to fail.
func (p *Postgres) Release(ctx context.Context, key string, fp, token []byte) error {
	return p.release(ctx, pgReleaseInWindowSQL, pgReleaseInWindowUntokenedSQL, key, fp, token)
}

// ReleaseBeforeRun deletes the in-flight row of a request whose handler
// never started, whatever its window says: nothing ran, so the retry its
// 503 asks for must run.
func (p *Postgres) ReleaseBeforeRun(ctx context.Context, key string, fp, token []byte) error {
	return p.release(ctx, pgReleaseSQL, pgReleaseUntokenedSQL, key, fp, token)
}

// release runs a release statement by the token the entry was stored with,
// or without one only for an entry stored without one: a release by a token
// never falls back to matching key and fingerprint alone, which could free
// a concurrent duplicate's entry (a Register whose reply was lost may not
// have landed).
func (p *Postgres) release(ctx context.Context, tokened, untokened, key string, fp, token []byte) error {
	if _, err := p.byToken(ctx, token, tokened, untokened, key, fp); err != nil {
		return fmt.Errorf("release idempotency key: %w", err)
	}
	return nil
}
