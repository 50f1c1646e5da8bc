package livestore

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"
)

// ReconcileResult says what Redis.Reconcile found and did.
type ReconcileResult struct {
	// Scanned counts the keys under the store's prefix (one that SCAN
	// returns twice, as it may while Redis resizes its table, twice).
	Scanned int `json:"scanned"`
	// Kept counts the completed hashes kept without expiry: outcomes whose
	// archive row could not be written at completion. An outcome kept
	// twice, aside and under its key's own name (a later attempt of its
	// request wrote it back while the archive was down), counts once, as
	// the run gives both copies their expiry in one step (and is counted by
	// the first copy the run comes to; a second that fails is reported
	// all the same).
	Kept int `json:"kept"`
	// Archived counts those now archived and given their expiry back (in a
	// dry run, those that would be).
	Archived int `json:"archived"`
	// Failed counts the keys without expiry left as they were, each
	// reported with its reason: kept hashes it could not archive, hashes
	// not completed or without a state, and keys that are not hashes.
	Failed int `json:"failed"`
	// Already counts the kept hashes this run archived whose expiry it did
	// not give back because it was no longer missing when it came to
	// (another run beside this one, or the request's own later attempt,
	// gave it back first; or the hash vanished since the scan, or changed
	// and has an expiry: changed and still without one, it counts as
	// failed).
	// Their rows are archived all the same. Kept is Archived + Already +
	// the kept hashes that failed.
	Already int `json:"already"`
}

// reconcileScanCount is how many keys each SCAN step asks for: Redis answers
// each step in a bounded time, beside live traffic, and the step's expiries
// are read in one round trip.
const reconcileScanCount = 500

// ErrNoRedisStoreOnRecord: the archive's database has never had a Redis
// store write to it (no ttl_ms = 0 row in idempotency_writers), so it is not
// the archive of the store being reconciled.
var ErrNoRedisStoreOnRecord = errors.New("no Redis store on record in idempotency_writers: this database is not the Redis store's archive")

// Reconcile finds the completed hashes kept without expiry, whose archive
// row no completion attempt could write (see Complete: the key then replays
// from Redis alone, and would run again were the hash lost to an eviction
// or a failover), writes each one's archive row from the hash, and gives it
// its expiry back: the end of its window, or a second when that has passed.
// With dryRun it counts them and writes nothing. report is called for each
// key without expiry under the prefix it leaves as it was, with the reason
// (a hash without a state, or a key that is not a hash, included: only a
// key gone since the scan is passed over); the error it returns is for the
// scan itself.
//
// Why giving an expiry back is safe (the invariant): it happens only after
// the archive row is committed, under the key a lookup asks for. That key
// is the one the hash records (the key field); a hash of an older writer,
// without it, is archived under the key its name gives, only when that is
// a key the middleware scopes ("idem:v1:" or "idem:v1t:"): a prefix that
// is not the store's own (the start of another store's, one character
// short) would otherwise archive a row nobody looks up, and then let the
// hash expire. Fields a completion could not have written (a status outside
// 100-599, a fingerprint that is not SHA-256, a window that ends before it
// starts) leave the hash alone. Leaving a hash is always safe: it replays.
//
// It is safe beside live traffic and beside another Reconcile: the row is
// inserted with ON CONFLICT DO NOTHING (the same key and expiry, the same
// row a completion writes), and the expiry is given back by the script a
// completion uses, only to a hash still completed by the same registration
// and still without expiry.
func (s *Redis) Reconcile(ctx context.Context, dryRun bool, report func(key string, err error)) (ReconcileResult, error) {
	var res ReconcileResult
	var onRecord bool
	if err := s.archive.QueryRow(ctx, redisLeaseSQL).Scan(&onRecord); err != nil {
		return res, fmt.Errorf("reconcile: read idempotency_writers: %w", err)
	}
	if !onRecord {
		return res, ErrNoRedisStoreOnRecord
	}
	server, err := s.serverRunID(ctx)
	if err != nil {
		return res, err
	}
	pattern := escapeGlob(s.prefix) + "*"
	// seen holds the kept hashes this run came to (SCAN may return a key
	// twice while Redis resizes its table), counted holds the outcomes
	// (key and registration) this run came to, whatever it did for them:
	// an outcome can be kept twice, aside and under its key's own name
	// (a later attempt of its request wrote it back while the archive was
	// still down), and the run gives both their expiry in one step. The
	// second copy is counted with the first, once: whether the scan still
	// finds it without expiry depends on where SCAN puts the two.
	seen, counted := map[string]bool{}, map[[2]string]bool{}
	var cursor uint64
	for {
		keys, next, err := s.client.Scan(ctx, cursor, pattern, reconcileScanCount).Result()
		if err != nil {
			return res, fmt.Errorf("reconcile: scan %q: %w", pattern, err)
		}
		res.Scanned += len(keys)
		kept, err := s.withoutExpiry(ctx, keys)
		if err != nil {
			return res, err
		}
		for _, hashKey := range kept {
			h, err := s.client.HGetAll(ctx, hashKey).Result()
			switch {
			case err != nil && strings.HasPrefix(err.Error(), "WRONGTYPE"):
				// No release of this store writes anything but hashes under
				// its prefix: a key without expiry there is named, never
				// passed over as if the run had found nothing left.
				res.Failed++
				report(hashKey, errors.New("a key without expiry that is not a hash: left alone (no release of this store writes one; is the prefix the store's own?)"))
				continue
			case err != nil:
				return res, fmt.Errorf("reconcile: read %q: %w", hashKey, err)
			case len(h) == 0:
				continue // gone since the scan: nothing is left
			case h["state"] == "":
				res.Failed++
				report(hashKey, errors.New("a hash without expiry and without a state: left alone (no release of this store writes one; look its key up in the archive before removing it by hand)"))
				continue
			case h["state"] != "completed":
				res.Failed++
				report(hashKey, errors.New("a hash without expiry that is not completed: left alone (no release of this store writes one; look its key up in the archive before removing it by hand)"))
				continue
			}
			if seen[hashKey] {
				continue
			}
			seen[hashKey] = true
			outcome := [2]string{h["key"], h["reg"]}
			twin := h["key"] != "" && counted[outcome]
			if twin && dryRun {
				continue // the run gives it its expiry with the first copy
			}
			expired, err := s.reconcileOne(ctx, hashKey, h, dryRun)
			if h["key"] != "" {
				counted[outcome] = true
			}
			switch {
			case err != nil:
				// Named whatever its twin did; counted once with it.
				report(hashKey, err)
				if !twin {
					res.Kept++
					res.Failed++
				}
			case expired && twin:
				// Given its expiry here, not with the first copy (it
				// changed in between): what the run did for it is told by
				// the first copy's count.
			case expired:
				res.Kept++
				res.Archived++
			case twin:
				// Given its expiry with the first copy, or before.
			default:
				res.Kept++
				res.Already++
			}
		}
		if cursor = next; cursor == 0 {
			break
		}
	}
	// SCAN guarantees every key present throughout only on one server: a
	// failover or restart mid-scan (a replica promoted behind the same
	// endpoint) continues the cursor on another, which may skip keys, and a
	// run that ended without a word would be taken for complete.
	after, err := s.serverRunID(ctx)
	if err != nil {
		return res, err
	}
	if after != server {
		return res, ErrServerChanged
	}
	return res, nil
}

// ErrServerChanged: the Redis server behind the URL changed during the scan
// (a failover or a restart), so the scan may have missed keys; what was
// archived stays archived, and a run again finds the rest.
var ErrServerChanged = errors.New("reconcile: the Redis server changed during the scan (a failover or restart), which may have skipped keys: run again")

// serverRunID reads the Redis server's run_id, which a server draws anew
// at every start: "" where the server does not give one (a Redis-compatible
// service that hides it), and the check it serves is then not made.
func (s *Redis) serverRunID(ctx context.Context) (string, error) {
	info, err := s.client.Info(ctx, "server").Result()
	if err != nil {
		if strings.Contains(err.Error(), "unknown command") || strings.HasPrefix(err.Error(), "NOPERM") {
			return "", nil
		}
		return "", fmt.Errorf("reconcile: read the Redis server's run_id: %w", err)
	}
	for line := range strings.Lines(info) {
		if id, ok := strings.CutPrefix(strings.TrimSpace(line), "run_id:"); ok {
			return id, nil
		}
	}
	return "", nil
}

// redisLeaseSQL says whether a Redis store holds a lease in the archive's
// database: a bounded ttl_ms = 0 row. An unbounded one stands for keys
// stored before writers recorded bounds (migration 004), in any service's
// archive.
const redisLeaseSQL = "SELECT EXISTS (SELECT FROM idempotency_writers WHERE ttl_ms = 0 AND bounded)"

// withoutExpiry returns those of keys that have no expiry, asking for all
// of them in one round trip.
func (s *Redis) withoutExpiry(ctx context.Context, keys []string) ([]string, error) {
	if len(keys) == 0 {
		return nil, nil
	}
	cmds := make([]*redis.DurationCmd, len(keys))
	_, err := s.client.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, k := range keys {
			cmds[i] = p.PTTL(ctx, k)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("reconcile: read expiries: %w", err)
	}
	var out []string
	for i, c := range cmds {
		if c.Val() == -1 { // no expiry; -2: gone since the scan (go-redis passes both on as is)
			out = append(out, keys[i])
		}
	}
	return out, nil
}

// reconcileOne archives the completed hash h, kept without expiry at
// hashKey, and gives it its expiry back. It reports whether this run gave
// the expiry back (in a dry run, whether it would): false, without error,
// when the hash no longer needed it (see ReconcileResult.Already). A dry
// run makes every check the run makes before it writes.
func (s *Redis) reconcileOne(ctx context.Context, hashKey string, h map[string]string, dryRun bool) (bool, error) {
	key, err := s.archivedKey(hashKey, h)
	if err != nil {
		return false, err
	}
	created, errC := strconv.ParseInt(h["created"], 10, 64)
	expires, errE := strconv.ParseInt(h["expires"], 10, 64)
	status, errS := strconv.Atoi(h["status"])
	switch {
	case errC != nil || errE != nil || errS != nil:
		return false, errors.New("a completed hash without its registration's times or its status: left alone")
	case status < 100 || status > 599 || h["status"] != strconv.Itoa(status):
		return false, fmt.Errorf("a completed hash with status %q, which no completion writes: left alone", h["status"])
	case len(h["fp"]) != sha256.Size:
		return false, fmt.Errorf("a completed hash whose fingerprint is %d bytes, not SHA-256: left alone", len(h["fp"]))
	case created <= 0 || expires <= created || expires-created > MaxRedisTTL.Milliseconds():
		// In milliseconds, as stored: created > 0 and expires > created keep
		// the difference from overflowing, and a window of centuries from
		// wrapping to a negative time.Duration that passes the check.
		return false, fmt.Errorf("a completed hash whose window (created %d, expires %d, Unix ms) no registration gives: left alone", created, expires)
	case h["has_rid"] == "1" && !hasField(h, "rid"):
		return false, errors.New("a completed hash that says it has a resource id and holds none: left alone")
	case !storableText(key):
		// PostgreSQL's text holds neither: the row could not be written,
		// and a dry run must not count as archived what the run fails.
		return false, fmt.Errorf("a completed hash whose key %q is not UTF-8 or holds a NUL byte, which the archive cannot store: left alone", key)
	case h["has_rid"] == "1" && !storableText(h["rid"]):
		return false, fmt.Errorf("a completed hash whose resource id %q is not UTF-8 or holds a NUL byte, which the archive cannot store: left alone", h["rid"])
	}
	e := entryFromHash(h)
	if dryRun {
		// Written and rolled back: a row the run could not write (its
		// month's partition gone) fails the dry run as it fails the run.
		err := pgx.BeginFunc(ctx, s.archive, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, redisArchiveSQL, key, e.Fingerprint, status, e.ResourceID, e.CreatedAt, e.ExpiresAt); err != nil {
				return err
			}
			return errDryRun
		})
		if !errors.Is(err, errDryRun) {
			return false, fmt.Errorf("write its archive row under %q (expired %s): %w", key, e.ExpiresAt.Format(time.RFC3339), err)
		}
		return true, nil
	}
	if _, err := s.archive.Exec(ctx, redisArchiveSQL, key, e.Fingerprint, status, e.ResourceID, e.CreatedAt, e.ExpiresAt); err != nil {
		return false, fmt.Errorf("write its archive row under %q (expired %s): %w", key, e.ExpiresAt.Format(time.RFC3339), err)
	}
	// The script answers how many hashes it gave an expiry, under the
	// key's own name or aside (a registration may have taken the hash up
	// since it was read): 0 where another run, or the request's later
	// attempt, gave it back first, or the hash changed since it was read.
	set, err := redisExpireArchived.Run(ctx, s.client, s.both(key), h["reg"], s.remaining(e.ExpiresAt)).Int()
	if err != nil && !errors.Is(err, redis.Nil) {
		return false, fmt.Errorf("archived under %q; give its hash back its expiry: %w", key, err)
	}
	if set > 0 {
		return true, nil
	}
	// Not set: given back by another, gone, or changed since it was read.
	// Changed and still without expiry, it is a key left as it was, which
	// the run must not report as done.
	if ttl, err := s.client.PTTL(ctx, hashKey).Result(); err == nil && ttl == -1 {
		return false, fmt.Errorf("archived under %q, but the hash changed since it was read and still has no expiry: run redis-reconcile again", key)
	}
	return false, nil
}

// errDryRun rolls back a dry run's archive row.
var errDryRun = errors.New("dry run")

// storableText says whether PostgreSQL's text (UTF-8 server encoding) can
// hold s: valid UTF-8 without a NUL byte.
func storableText(s string) bool {
	return utf8.ValidString(s) && strings.IndexByte(s, 0) < 0
}

// archivedKey returns the scoped key the hash at hashKey is archived
// under: the one it records, which its name must end with; for a hash of
// an older writer, which records none, its name less the prefix, when that
// is a key the middleware scopes.
func (s *Redis) archivedKey(hashKey string, h map[string]string) (string, error) {
	if key, ok := h["key"]; ok {
		// A request's outcome kept aside (keepLost) is archived as the
		// key's own hash is.
		if s.prefix+key != hashKey && s.aside(key) != hashKey {
			return "", fmt.Errorf("a hash that records the key %q, which is not its name less the prefix %q: left alone (is the prefix the store's own?)", key, s.prefix)
		}
		return key, nil
	}
	key := strings.TrimPrefix(hashKey, s.prefix)
	if !strings.HasPrefix(key, "idem:v1:") && !strings.HasPrefix(key, "idem:v1t:") {
		return "", fmt.Errorf("a hash of an older writer whose name less the prefix %q is not a scoped key (idem:v1: or idem:v1t:): left alone (is the prefix the store's own?)", s.prefix)
	}
	return key, nil
}

func hasField(h map[string]string, f string) bool {
	_, ok := h[f]
	return ok
}

// escapeGlob escapes the characters SCAN's MATCH pattern gives a meaning.
func escapeGlob(s string) string {
	return strings.NewReplacer(`\`, `\\`, `*`, `\*`, `?`, `\?`, `[`, `\[`, `]`, `\]`).Replace(s)
}
