package livestore

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"
)

// ReconcileResult says what Redis.Reconcile found and did.
type ReconcileResult struct {
	// Scanned counts the hashes under the store's prefix.
	Scanned int `json:"scanned"`
	// Kept counts the completed hashes kept without expiry: outcomes whose
	// archive row could not be written at completion.
	Kept int `json:"kept"`
	// Archived counts those now archived and given their expiry back (in a
	// dry run, those that would be).
	Archived int `json:"archived"`
	// Failed counts the hashes without expiry left as they were, each
	// reported with its reason.
	Failed int `json:"failed"`
}

// reconcileScanCount is how many keys each SCAN step asks for: Redis answers
// each step in a bounded time, beside live traffic.
const reconcileScanCount = 500

// Reconcile finds the completed hashes kept without expiry, whose archive
// row no completion attempt could write (see Complete: the key then replays
// from Redis alone, and would run again were the hash lost to an eviction
// or a failover), writes each one's archive row from the hash, and gives it
// its expiry back: the end of its window, or a second when that has passed.
// With dryRun it counts them and writes nothing. report is called for each
// hash without expiry it leaves as it was, with the reason; the error it
// returns is for the scan itself.
//
// It is safe beside live traffic and beside another Reconcile: the row is
// inserted with ON CONFLICT DO NOTHING (the same key and expiry, the same
// row a completion writes), and the expiry is given back by the script a
// completion uses, only to a hash still completed by the same registration
// and still without expiry. The expiry is given back only after the row is
// committed, so no hash is forgotten before its outcome is archived.
func (s *Redis) Reconcile(ctx context.Context, dryRun bool, report func(key string, err error)) (ReconcileResult, error) {
	var res ReconcileResult
	iter := s.client.Scan(ctx, 0, escapeGlob(s.prefix)+"*", reconcileScanCount).Iterator()
	for iter.Next(ctx) {
		res.Scanned++
		hashKey := iter.Val()
		ttl, err := s.client.PTTL(ctx, hashKey).Result()
		if err != nil {
			return res, fmt.Errorf("reconcile: read the expiry of %s: %w", hashKey, err)
		}
		if ttl != -1 { // -1: no expiry; -2: gone since the scan (go-redis passes both on as is)
			continue
		}
		h, err := s.client.HGetAll(ctx, hashKey).Result()
		switch {
		case err != nil && strings.HasPrefix(err.Error(), "WRONGTYPE"):
			continue // not a hash: not this store's
		case err != nil:
			return res, fmt.Errorf("reconcile: read %s: %w", hashKey, err)
		case h["state"] == "":
			continue // gone since the scan, or not this store's
		case h["state"] != "completed":
			res.Failed++
			report(hashKey, errors.New("a hash without expiry that is not completed: left alone (it answers 409 in flight until deleted by hand)"))
			continue
		}
		res.Kept++
		if err := s.reconcileOne(ctx, hashKey, h, dryRun); err != nil {
			res.Failed++
			report(hashKey, err)
			continue
		}
		res.Archived++
	}
	if err := iter.Err(); err != nil {
		return res, fmt.Errorf("reconcile: scan %s*: %w", s.prefix, err)
	}
	return res, nil
}

// reconcileOne archives the completed hash h, kept without expiry at
// hashKey, and gives it its expiry back.
func (s *Redis) reconcileOne(ctx context.Context, hashKey string, h map[string]string, dryRun bool) error {
	created, errC := strconv.ParseInt(h["created"], 10, 64)
	expires, errE := strconv.ParseInt(h["expires"], 10, 64)
	status, errS := strconv.Atoi(h["status"])
	if errC != nil || errE != nil || errS != nil || h["fp"] == "" {
		return errors.New("a completed hash without its registration's times, status or fingerprint: left alone")
	}
	if dryRun {
		return nil
	}
	e := entryFromHash(h)
	if _, err := s.archive.Exec(ctx, redisArchiveSQL, strings.TrimPrefix(hashKey, s.prefix), e.Fingerprint, status, e.ResourceID, e.CreatedAt, e.ExpiresAt); err != nil {
		return fmt.Errorf("write its archive row (created %d, expires %d): %w", created, expires, err)
	}
	if err := redisExpireArchived.Run(ctx, s.client, []string{hashKey}, h["reg"], s.remaining(e.ExpiresAt)).Err(); err != nil && !errors.Is(err, redis.Nil) {
		return fmt.Errorf("archived; give its hash back its expiry: %w", err)
	}
	return nil
}

// escapeGlob escapes the characters SCAN's MATCH pattern gives a meaning.
func escapeGlob(s string) string {
	return strings.NewReplacer(`\`, `\\`, `*`, `\*`, `?`, `\?`, `[`, `\[`, `]`, `\]`).Replace(s)
}
