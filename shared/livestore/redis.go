package livestore

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/idemarchive/idemarchive/shared/archive"
	"github.com/idemarchive/idemarchive/shared/idempotency"
	"github.com/idemarchive/idemarchive/shared/keytime"
)

// Redis keeps live keys in Redis hashes that expire with the key's window.
//
// Redis cannot be swept (keyspace notifications are best effort and are
// dropped when a client is slow), so the archive row is written at completion,
// when the record becomes immutable. The archive row is written first and the
// Redis entry marked completed second: a crash between the two leaves the key
// in flight in Redis until it expires — retries get 409 in flight, then 409
// expired from the archive — and never a completed key without an archive row.
// The archive row is written before Redis is even read, so an outcome is
// archived whatever Redis answers. If the archive row cannot be written,
// the hash is completed without an expiry instead, so that the key keeps
// replaying rather than ever running twice, and the error is returned: the
// middleware's next attempt writes the row and gives the hash its expiry
// back; after the last, the operator reconciles it. An in-flight
// hash is kept inFlightGrace past its window, so a request that outlives the
// TTL still archives its outcome; one that never completes (a crashed
// process) is not archived, and its key may run again after the grace.
//
// Because a key's archive row exists from completion on, a lost hash (a
// failover, a restart, an eviction) leaves the archive as the only record of
// it, however fresh the key: every fresh key is looked up
// (Registration.MayBeArchived is always true). A hash lost while its request
// is still in flight leaves nothing until the request completes, which then
// archives its outcome from the registration's times (completeLost): a retry
// before that runs again. A key whose timestamp lies
// more than the skew ahead of this process's clock is refused before
// anything is written, so the archive's pruning bound holds for its rows too
// (their created_at is this process's clock at registration).
type Redis struct {
	client  *redis.Client
	archive *pgxpool.Pool
	leases  *leases
	prefix  string
	now     func() time.Time
}

// MaxRedisTTL bounds the Redis store's TTL: its archive rows are written at
// completion with expired_at at the end of the window, into a month whose
// partition must already exist (the partition manager keeps
// PARTITION_LEAD_MONTHS, at least 2, ahead), and investigations read that
// far past their window while a Redis store is on record.
const MaxRedisTTL = archive.MaxCompletionTTL

// MaxTTL reports MaxRedisTTL; idempotency.New refuses a longer LiveTTL.
func (s *Redis) MaxTTL() time.Duration { return MaxRedisTTL }

// inFlightGrace keeps an in-flight hash this long past its window, so that a
// request running longer than the TTL still finds its entry at completion
// and archives its outcome; meanwhile retries get 409 expired (in flight).
// A completed hash expires at the end of its window.
const inFlightGrace = 15 * time.Minute

var _ idempotency.Store = (*Redis)(nil)

var _ idempotency.CompletionArchiver = (*Redis)(nil)

// ArchivesAtCompletion reports true: the archive row exists from completion
// on, so a lost hash must be looked up in the archive whatever the key's
// timestamp says.
func (s *Redis) ArchivesAtCompletion() bool { return true }

// NewRedis returns a store keeping entries under prefix+scoped key in client,
// and writing archive rows through archivePool (whose role needs INSERT on
// idempotency_key_archive, as idempotency_sweeper has).
func NewRedis(client *redis.Client, archivePool *pgxpool.Pool, prefix string) *Redis {
	r := &Redis{client: client, archive: archivePool, leases: newLeases(archivePool), prefix: prefix, now: time.Now}
	// Its leases are stamped with the clock it refuses keys by.
	r.leases.clock = func() time.Time { return r.now() }
	return r
}

// Hash fields: fp, state, status, body, ct, rid, has_rid, created, expires
// (Unix milliseconds), reg (the registration token; absent in hashes of
// older writers, matched as an empty token), key (the scoped key, which
// Reconcile archives the hash under; absent in hashes of older writers).
var (
	// redisRegister answers the key's hash, or, where there is none, the
	// outcome kept aside (KEYS[2], see keepLost), made the key's hash again
	// (RENAME keeps its expiry, or its lack of one), or registers the key.
	redisRegister = redis.NewScript(`
if redis.call('EXISTS', KEYS[1]) == 0 and redis.call('EXISTS', KEYS[2]) == 1 then
  redis.call('RENAME', KEYS[2], KEYS[1])
end
if redis.call('EXISTS', KEYS[1]) == 1 then
  local h = redis.call('HGETALL', KEYS[1])
  table.insert(h, 'pttl')
  table.insert(h, tostring(redis.call('PTTL', KEYS[1])))
  return h
end
redis.call('HSET', KEYS[1], 'fp', ARGV[1], 'state', 'in_flight', 'created', ARGV[2], 'expires', ARGV[3], 'reg', ARGV[5], 'key', ARGV[6])
redis.call('PEXPIRE', KEYS[1], ARGV[4])
return false`)

	redisComplete = redis.NewScript(`
if redis.call('HGET', KEYS[1], 'state') ~= 'in_flight' or redis.call('HGET', KEYS[1], 'fp') ~= ARGV[1]
   or (redis.call('HGET', KEYS[1], 'reg') or '') ~= ARGV[9] then
  return 0
end
redis.call('HSET', KEYS[1], 'state', 'completed', 'status', ARGV[2], 'body', ARGV[3], 'ct', ARGV[4], 'rid', ARGV[5], 'has_rid', ARGV[6])
if ARGV[7] == '1' then
  redis.call('PERSIST', KEYS[1])
else
  redis.call('PEXPIRE', KEYS[1], ARGV[8])
end
return 1`)

	// redisExpireArchived gives a completed hash of the registration ARGV[1]
	// kept without expiry (its archive row could not be written then) its
	// expiry back, once its request's later attempt, or redis-reconcile,
	// has written the row. It looks at both places such a hash can be, the
	// key's own (KEYS[1]) and aside (KEYS[2]), in one script: a
	// registration takes up the outcome kept aside by renaming it
	// (redisRegister), and a check of one name and then the other could
	// fall between the two and leave the hash without expiry for good. It
	// answers how many it gave an expiry.
	redisExpireArchived = redis.NewScript(`
local n = 0
for _, k in ipairs(KEYS) do
  if redis.call('HGET', k, 'state') == 'completed' and (redis.call('HGET', k, 'reg') or '') == ARGV[1]
     and redis.call('PTTL', k) == -1 then
    n = n + redis.call('PEXPIRE', k, ARGV[2])
  end
end
return n`)

	// redisKeepLost writes back, completed and without expiry, the hash of
	// a request whose hash was lost and whose archive row could not be
	// written (1). Where another request has registered the key since, it
	// writes it aside instead (KEYS[2], 2), never over that registration,
	// unless another outcome is aside already (0). Where the key's own
	// hash is this registration's outcome already (a registration took up
	// the copy aside since the caller read the key), it is kept (1) and no
	// second copy is written. ARGV: fp, created, expires, reg, key, status,
	// body, ct, rid, has_rid.
	redisKeepLost = redis.NewScript(`
local dest, kept = KEYS[1], 1
if redis.call('HGET', KEYS[1], 'state') == 'completed' and redis.call('HGET', KEYS[1], 'reg') == ARGV[4] then
  return 1
end
if redis.call('EXISTS', KEYS[1]) == 1 then
  if redis.call('EXISTS', KEYS[2]) == 1 and (redis.call('HGET', KEYS[2], 'reg') or '') ~= ARGV[4] then
    return 0
  end
  dest, kept = KEYS[2], 2
end
redis.call('HSET', dest, 'fp', ARGV[1], 'state', 'completed', 'created', ARGV[2], 'expires', ARGV[3], 'reg', ARGV[4], 'key', ARGV[5],
           'status', ARGV[6], 'body', ARGV[7], 'ct', ARGV[8], 'rid', ARGV[9], 'has_rid', ARGV[10])
return kept`)

	redisRelease = redis.NewScript(`
if redis.call('HGET', KEYS[1], 'state') == 'in_flight' and redis.call('HGET', KEYS[1], 'fp') == ARGV[1]
   and (redis.call('HGET', KEYS[1], 'reg') or '') == ARGV[2] then
  return redis.call('DEL', KEYS[1])
end
return 0`)
)

// Register creates the in-flight hash atomically unless the key exists.
func (s *Redis) Register(ctx context.Context, req idempotency.Registering) (idempotency.Registration, error) {
	if err := req.Validate(); err != nil {
		return idempotency.Registration{}, fmt.Errorf("register idempotency key: %w", err)
	}
	if strings.IndexByte(req.Key, 0) >= 0 {
		// The archive cannot hold it, and its hash could be named like
		// another key's outcome kept aside (asideSuffix).
		return idempotency.Registration{}, errors.New("register idempotency key: the key holds a NUL byte")
	}
	if req.TTL > MaxRedisTTL {
		return idempotency.Registration{}, fmt.Errorf("register idempotency key: the Redis store's TTL must be at most %s (its archive rows go into a month that must already have a partition), got %s", MaxRedisTTL, req.TTL)
	}
	// This store writes archive rows at completion: it records itself
	// (TTL 0: archived from registration on), so that a Postgres store
	// sharing the archive never skips a lookup for its keys.
	if err := s.leases.renew(ctx, lease{ttlMS: 0, skewMS: durationMS(req.ClockSkew)}, false); err != nil {
		return idempotency.Registration{}, err
	}
	now := s.now()
	if _, ahead := keytime.Ahead(req.Key, now, req.ClockSkew); ahead {
		// Not stored under this writer's skew. A writer that allows more
		// may have stored it: its entry is the answer.
		var hget, agget *redis.MapStringStringCmd
		var pttl, apttl *redis.DurationCmd
		_, err := s.client.Pipelined(ctx, func(p redis.Pipeliner) error {
			hget, pttl = p.HGetAll(ctx, s.prefix+req.Key), p.PTTL(ctx, s.prefix+req.Key)
			agget, apttl = p.HGetAll(ctx, s.aside(req.Key)), p.PTTL(ctx, s.aside(req.Key))
			return nil
		})
		if err != nil {
			return idempotency.Registration{}, fmt.Errorf("register idempotency key: %w", err)
		}
		h := hget.Val()
		if len(h) == 0 {
			// An outcome kept aside (keepLost) answers as the key's own.
			h, pttl = agget.Val(), apttl
		}
		if len(h) == 0 {
			return idempotency.Registration{Ahead: true}, nil
		}
		ms := int64(pttl.Val()) // go-redis keeps -1 (no expiry) and -2 (gone) as they are
		if ms >= 0 {
			ms = pttl.Val().Milliseconds()
		}
		h["pttl"] = strconv.FormatInt(ms, 10)
		return idempotency.Registration{Entry: entryFromHash(h)}, nil
	}
	created, expires := now.UnixMilli(), now.Add(req.TTL).UnixMilli()
	// Expiries are relative: the hash's times come from this process's
	// clock, and an absolute PEXPIREAT read by a Redis server whose clock is
	// ahead by more than the TTL would drop the hash at once, and let the
	// next identical request register it again.
	res, err := redisRegister.Run(ctx, s.client, s.both(req.Key), req.Fingerprint, created, expires, (req.TTL + inFlightGrace).Milliseconds(), req.Token, req.Key).Result()
	if errors.Is(err, redis.Nil) {
		e := idempotency.Entry{Fingerprint: req.Fingerprint, State: idempotency.InFlight, CreatedAt: time.UnixMilli(created), ExpiresAt: time.UnixMilli(expires)}
		return idempotency.Registration{Entry: e, Fresh: true, MayBeArchived: true, Token: req.Token}, nil
	}
	if err != nil {
		return idempotency.Registration{}, fmt.Errorf("register idempotency key: %w", err)
	}
	fields, ok := res.([]any)
	if !ok {
		return idempotency.Registration{}, fmt.Errorf("register idempotency key: unexpected reply %T", res)
	}
	h := map[string]string{}
	for i := 0; i+1 < len(fields); i += 2 {
		k, _ := fields[i].(string)
		v, _ := fields[i+1].(string)
		h[k] = v
	}
	if ownRegistration(h, req) {
		// go-redis sends a command again when its reply was lost (an EOF,
		// a read timeout; MaxRetries): this is the second run of this
		// request's own registration, which its first run wrote. Taken
		// for another request's entry, it would be answered 409 in
		// flight and left in flight for the whole window, neither
		// completed nor released, for an operation that never ran. Its
		// times are the first run's (the same command, the same times).
		e := entryFromHash(h)
		e.WindowEnded = nil
		return idempotency.Registration{Entry: e, Fresh: true, MayBeArchived: true, Token: req.Token}, nil
	}
	return idempotency.Registration{Entry: entryFromHash(h)}, nil
}

// ownRegistration reports whether the existing hash h is the in-flight
// entry that req itself registered (a registration script sent again by
// the client after its reply was lost). Only a non-empty token can say
// so: the middleware draws 16 random bytes for each request, so no other
// request's hash carries them.
func ownRegistration(h map[string]string, req idempotency.Registering) bool {
	return len(req.Token) > 0 && h["reg"] == string(req.Token) && h["state"] == "in_flight" &&
		h["fp"] == string(req.Fingerprint) && h["key"] == req.Key
}

// windowEnded is the Redis server's verdict on whether an in-flight hash's
// window has ended, from its PTTL in milliseconds (h["pttl"], as Register
// reads it with the hash), or nil where it gives none. An in-flight hash
// expires inFlightGrace after its window (PEXPIRE at registration, counted
// by the server's clock alone), so its window has ended once no more than
// inFlightGrace is left. Were each host's clock to decide, a host whose
// clock runs ahead would answer a request still running on another host
// 409 expired, never completed, which a client may take for "never ran" and
// charge again under a new key. A completed hash gives no verdict: it
// lives at least a second past a window that ended before its request
// completed, so its PTTL cannot say, and a host's clock that errs only
// answers it 409 expired with its real status, or replays it. Nor does a
// hash kept without expiry (PTTL -1): the middleware's clock decides, as
// for a hash read without its PTTL.
func windowEnded(h map[string]string) *bool {
	pttl, err := strconv.ParseInt(h["pttl"], 10, 64)
	if err != nil || pttl == -1 || h["state"] != "in_flight" {
		return nil
	}
	ended := pttl <= inFlightGrace.Milliseconds() // -2 (gone since) too
	return &ended
}

func entryFromHash(h map[string]string) idempotency.Entry {
	e := idempotency.Entry{Fingerprint: []byte(h["fp"]), ContentType: h["ct"]}
	if h["state"] == "completed" {
		e.State = idempotency.Completed
		e.Status, _ = strconv.Atoi(h["status"])
		e.Body = []byte(h["body"])
	}
	if h["has_rid"] == "1" {
		rid := h["rid"]
		e.ResourceID = &rid
	}
	created, _ := strconv.ParseInt(h["created"], 10, 64)
	expires, _ := strconv.ParseInt(h["expires"], 10, 64)
	e.CreatedAt, e.ExpiresAt = time.UnixMilli(created).UTC(), time.UnixMilli(expires).UTC()
	e.WindowEnded = windowEnded(h)
	return e
}

const redisArchiveSQL = `
INSERT INTO idempotency_key_archive (scoped_key, fingerprint, status_code, resource_id, created_at, expired_at)
VALUES ($1, $2, $3, $4, $5, $6)
ON CONFLICT (scoped_key, expired_at) DO NOTHING`

// Complete writes the archive row, then marks the hash completed (see Redis).
//
// The archive row comes first, from the registration's times (the same
// milliseconds the hash holds), before Redis is read: the operation ran, so
// its outcome must outlive the hash whatever Redis answers, or fails to
// (an outage through every attempt, a failover to a replica that never got
// the hash). Writing it again is harmless (ON CONFLICT DO NOTHING: the same
// key and expiry). Only a caller that did not say when it registered
// (Completion.ExpiresAt zero) has it written from the hash's times.
func (s *Redis) Complete(ctx context.Context, key string, c idempotency.Completion) error {
	var archiveErr error
	if !c.ExpiresAt.IsZero() {
		archiveErr = s.archiveOutcome(ctx, key, c, c.CreatedAt, c.ExpiresAt)
	}
	h, err := s.client.HGetAll(ctx, s.prefix+key).Result()
	if err != nil {
		if archiveErr != nil {
			return fmt.Errorf("complete idempotency key: archive: %w; redis: %w", archiveErr, err)
		}
		return fmt.Errorf("complete idempotency key (its outcome is archived): %w", err)
	}
	e := entryFromHash(h)
	switch {
	case len(h) > 0 && h["reg"] == string(c.Token) && len(c.Token) > 0 && e.State != idempotency.InFlight:
		// This request's own entry, completed by an earlier attempt whose
		// reply was lost, or whose archive row could not be written then
		// (the hash was kept without expiry): now that the row exists, the
		// hash may expire with its window.
		if archiveErr != nil {
			return fmt.Errorf("archive idempotency key at completion (the key is kept in Redis without expiry until archived): %w", archiveErr)
		}
		if !c.ExpiresAt.IsZero() {
			if err := redisExpireArchived.Run(ctx, s.client, s.both(key), c.Token, s.remaining(e.ExpiresAt)).Err(); err != nil {
				return fmt.Errorf("complete idempotency key (its outcome is archived): give its hash back its expiry: %w", err)
			}
		}
		return ErrNotInFlight
	case (len(h) == 0 || h["reg"] != string(c.Token)) && archiveErr != nil && len(c.Token) > 0:
		// This request's hash was lost and its outcome could not be
		// archived: were nothing kept, a retry would find neither and run
		// the operation again. Keep it in Redis, completed and without
		// expiry, as when the archive fails with the hash there: the next
		// attempt archives it and gives it back its expiry, or
		// redis-reconcile does. Where another request has registered the
		// key since, it is kept aside: that request looked the key up in
		// the same archive, which may have failed it too (it then released
		// the key, never running), and the next registration takes up the
		// outcome kept aside.
		return s.keepLost(ctx, key, c, archiveErr)
	case len(h) == 0 || e.State != idempotency.InFlight || string(e.Fingerprint) != string(c.Fingerprint) || h["reg"] != string(c.Token):
		// Not this request's entry: it was lost, and maybe another request
		// registered the key since. The operation ran all the same. An
		// earlier attempt may have kept its outcome aside: archived now, it
		// may expire with its window.
		if archiveErr == nil && len(c.Token) > 0 && !c.ExpiresAt.IsZero() {
			if err := redisExpireArchived.Run(ctx, s.client, s.both(key), c.Token, s.remaining(c.ExpiresAt)).Err(); err != nil && !errors.Is(err, redis.Nil) {
				return fmt.Errorf("complete idempotency key (its outcome is archived): give the outcome kept aside its expiry back: %w", err)
			}
		}
		return completeLost(c, archiveErr)
	}
	if c.ExpiresAt.IsZero() {
		archiveErr = s.archiveOutcome(ctx, key, c, e.CreatedAt, e.ExpiresAt)
	}
	// Without its archive row the key must never be forgotten, or a retry
	// after the window would run the operation again: complete it and drop
	// its expiry, so it replays until an attempt archives it (or someone
	// reconciles it).
	persist := "0"
	if archiveErr != nil {
		persist = "1"
	}
	rid, hasRID := "", "0"
	if c.ResourceID != nil {
		rid, hasRID = *c.ResourceID, "1"
	}
	n, err := redisComplete.Run(ctx, s.client, []string{s.prefix + key}, c.Fingerprint, c.Status, c.Body, c.ContentType, rid, hasRID, persist, s.remaining(e.ExpiresAt), c.Token).Int()
	switch {
	case err != nil && archiveErr != nil:
		// Neither step held: the hash is still in flight, with its expiry
		// (or gone). The next attempt tries both again; the error must not
		// say the outcome is kept, which redis-reconcile would then find.
		return fmt.Errorf("archive idempotency key at completion: %w; and keeping its hash failed too (neither archived nor kept: a retry after the hash expires runs again): %w", archiveErr, err)
	case err != nil:
		return fmt.Errorf("complete idempotency key: %w", err)
	case n == 0 && archiveErr != nil && len(c.Token) > 0:
		// The hash went between the read above and the script (an
		// eviction, a failover): kept as a hash lost before it.
		return s.keepLost(ctx, key, c, archiveErr)
	case n == 0 && archiveErr != nil:
		return fmt.Errorf("archive idempotency key at completion: %w; its hash was gone, and nothing was kept (a retry after its window runs again)", archiveErr)
	case archiveErr != nil:
		return fmt.Errorf("archive idempotency key at completion (the key is kept in Redis without expiry until archived): %w", archiveErr)
	case n == 0:
		return ErrNotInFlight
	}
	return nil
}

// archiveOutcome writes the archive row of a completion, ending
// redisReserve before ctx's deadline, or the request's while it lies ahead
// (half the time left, when that is less): the Redis steps after it must still have time to run, above all
// the one that keeps the hash without expiry when the row could not be
// written. An archive that stalls (a lock held by a migration or a DDL
// statement) would otherwise use up the whole deadline, and the hash,
// neither archived nor kept, would expire with its window: a retry after
// it would run the operation again. A slow archive keeps nearly all of a
// first attempt's time.
func (s *Redis) archiveOutcome(ctx context.Context, key string, c idempotency.Completion, created, expires time.Time) error {
	deadline, ok := ctx.Deadline()
	// The request's own deadline, while it lies ahead, comes first: it
	// may be the process's end (idempotency.RequestDeadline).
	if d, rok := idempotency.RequestDeadline(ctx); rok && time.Until(d) > 0 && (!ok || d.Before(deadline)) {
		deadline, ok = d, true
	}
	if ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, deadline.Add(-min(redisReserve, time.Until(deadline)/2)))
		defer cancel()
	}
	_, err := s.archive.Exec(ctx, redisArchiveSQL, key, c.Fingerprint, c.Status, c.ResourceID, created, expires)
	return err
}

// redisReserve is the time a completion keeps for its Redis steps after
// the archive write: two round trips and a script, with room for a slow
// network.
const redisReserve = 2 * time.Second

// remaining is how long a completed hash lives: to the end of its window
// (by this process's clock, as the window was set), at least a second, in
// milliseconds.
func (s *Redis) remaining(expires time.Time) int64 {
	return max(time.Second, expires.Sub(s.now())).Milliseconds()
}

// keepLost writes the lost hash of this request back, completed and without
// expiry (redisKeepLost), after its archive row failed (archiveErr). When
// another request registered the key meanwhile, the outcome is kept aside,
// without expiry, under the key's name and asideSuffix: that registration
// looked the key up in the archive, whose outage may have failed the
// lookup too, and then released the key without running (the middleware's
// default, FailClosed), or its handler failed. The next registration of
// the key finds no hash and takes up the outcome kept aside as the key's
// own (redisRegister), so a retry replays it rather than running the
// operation again; the request's later attempt, or redis-reconcile,
// archives it and gives it back its expiry. Were it dropped, the charge
// would be recorded nowhere once the outage ended.
func (s *Redis) keepLost(ctx context.Context, key string, c idempotency.Completion, archiveErr error) error {
	rid, hasRID := "", "0"
	if c.ResourceID != nil {
		rid, hasRID = *c.ResourceID, "1"
	}
	kept, err := redisKeepLost.Run(ctx, s.client, s.both(key), c.Fingerprint, c.CreatedAt.UnixMilli(), c.ExpiresAt.UnixMilli(),
		c.Token, key, c.Status, c.Body, c.ContentType, rid, hasRID).Int()
	switch {
	case err != nil:
		return fmt.Errorf("archive idempotency key at completion, its Redis entry lost: %w; keep it in Redis: %w", archiveErr, err)
	case kept == 0:
		return completeLost(c, archiveErr)
	case kept == 2:
		return fmt.Errorf("archive idempotency key at completion (its Redis entry was lost, and the key registered again since; its outcome is kept aside in Redis, without expiry until archived, for the registration after that one): %w", archiveErr)
	}
	return fmt.Errorf("archive idempotency key at completion (its Redis entry was lost; it is kept in Redis, completed, without expiry until archived): %w", archiveErr)
}

// asideSuffix ends the name of a key's outcome kept aside (keepLost). A
// scoped key holds no NUL byte (Register refuses one), so no key's own hash
// is named like another's outcome kept aside.
const asideSuffix = "\x00aside"

// aside is the Redis key of key's outcome kept aside.
func (s *Redis) aside(key string) string { return s.prefix + key + asideSuffix }

// both names key's own hash and its outcome kept aside.
func (s *Redis) both(key string) []string { return []string{s.prefix + key, s.aside(key)} }

// completeLost answers the completion of a request whose hash is gone
// (evicted, flushed, a failover to a replica that had not received it, or
// expired after a request that outlived its window by inFlightGrace), or was
// replaced by another request's registration of the key since: the
// operation ran, and its archive row, written from the registration's
// times before Redis was read (archiveErr says how that went), answers a
// retry that finds no hash, or finds the other registration released (a
// completion-archiving store's fresh keys are always looked up), instead of
// running it again. It reports ErrNotInFlight, the live entry not being
// this request's, once the row is written.
func completeLost(c idempotency.Completion, archiveErr error) error {
	switch {
	case c.ExpiresAt.IsZero():
		return ErrNotInFlight // a caller that did not say when it registered
	case archiveErr != nil:
		return fmt.Errorf("archive idempotency key at completion, its Redis entry lost: %w", archiveErr)
	}
	return fmt.Errorf("%w: its Redis entry was lost before completion (or replaced by another registration of the key); the outcome is archived, and retries are answered from the archive", ErrNotInFlight)
}

// Release deletes the in-flight hash this request registered (its
// fingerprint and registration token).
func (s *Redis) Release(ctx context.Context, key string, fp, token []byte) error {
	if err := redisRelease.Run(ctx, s.client, []string{s.prefix + key}, fp, token).Err(); err != nil && !errors.Is(err, redis.Nil) {
		return fmt.Errorf("release idempotency key: %w", err)
	}
	return nil
}
