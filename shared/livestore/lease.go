package livestore

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemarchive/idemarchive/shared/database"
)

// lease is a (TTL, skew) pair a writer records in idempotency_writers before
// it stores keys under it (see package keytime for why).
type lease struct{ ttlMS, skewMS int64 }

// Lease timing: a lease lasts leaseFor of database time and is renewed once
// renewAfter of local time has passed since the last renewal, so it never
// runs out under a live writer whose clock is sane. If it does run out (a
// paused process, a clock jump), the Postgres store's registration finds no
// live lease, renews it and tries again: a key is never registered without
// one.
const (
	leaseFor   = 10 * time.Minute
	renewAfter = 4 * time.Minute
)

// pgLeaseSQL records that a writer stores keys under ($1 TTL, $2 skew) from
// now until $3 from now. first_used only moves earlier and used_until only
// later, so a record never claims less use than happened (a database clock
// that ran fast when the lease was first taken is corrected by the next
// renewal).
const pgLeaseSQL = `
INSERT INTO idempotency_writers AS w (ttl_ms, skew_ms, bounded, first_used, used_until)
VALUES ($1, $2, true, now(), now() + $3 * interval '1 millisecond')
ON CONFLICT (ttl_ms, skew_ms, bounded) DO UPDATE
   SET first_used = least(w.first_used, excluded.first_used),
       used_until = greatest(w.used_until, excluded.used_until)`

// leases renews a process's leases.
type leases struct {
	pool    *pgxpool.Pool
	mu      sync.Mutex
	renewed map[lease]time.Time // local time each lease was last renewed
}

func newLeases(pool *pgxpool.Pool) *leases {
	return &leases{pool: pool, renewed: map[lease]time.Time{}}
}

// renew extends the lease on l when it is due, or always when force.
func (ls *leases) renew(ctx context.Context, l lease, force bool) error {
	ls.mu.Lock()
	last, ok := ls.renewed[l]
	ls.mu.Unlock()
	if ok && !force && time.Since(last) < renewAfter {
		return nil
	}
	start := time.Now()
	if _, err := ls.pool.Exec(ctx, pgLeaseSQL, l.ttlMS, l.skewMS, leaseFor.Milliseconds()); err != nil {
		hint := ""
		switch database.SQLState(err) {
		case "42P01":
			hint = " (run migrate: the schema predates idempotency_writers)"
		case database.CodeInsufficientPrivilege:
			hint = " (grant the store's login role idempotency_writer, or idempotency_sweeper for the Redis store's archive pool)"
		}
		return fmt.Errorf("record the writer's TTL and clock skew in idempotency_writers%s: %w", hint, err)
	}
	ls.mu.Lock()
	ls.renewed[l] = start
	ls.mu.Unlock()
	return nil
}

// durationMS rounds d up to whole milliseconds, so a recorded TTL or skew is
// never shorter than the one in force.
func durationMS(d time.Duration) int64 {
	ms := d.Milliseconds()
	if d%time.Millisecond > 0 {
		ms++
	}
	return ms
}
