package livestore

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemarchive/idemarchive/shared/database"
)

// lease is a (TTL, skew) pair a writer records in idempotency_writers before
// it stores keys under it (see package keytime for why).
type lease struct{ ttlMS, skewMS int64 }

// Lease timing: a lease lasts leaseFor of database time and is renewed once
// renewAfter of local time has passed since the last renewal, by the
// monotonic clock or by the wall clock (a frozen process, such as a Lambda
// execution environment between invocations, may not see the pause on its
// monotonic clock, and a wall clock that stepped back renews too), so it
// never runs out under a live writer whose clock is sane. If it does run out,
// the Postgres store's registration finds no live lease, renews it and tries
// again: a key is never registered without one. The Redis store's
// registrations check no lease (they never touch PostgreSQL), so its leases
// are also stamped with its own clock (see pgLeaseSQL).
const (
	leaseFor   = 10 * time.Minute
	renewAfter = 4 * time.Minute
)

// pgLeaseSQL records that a writer stores keys under ($1 TTL, $2 skew) from
// now until $3 from now: by the database's clock, and by the writer's own
// ($4; NULL for a writer whose registrations the database bounds, the
// Postgres store's), whichever reaches further. The Redis store refuses keys
// ahead of its own clock, not the database's: were its clock ahead of the
// database's by more than leaseFor - renewAfter, a lease by the database's
// clock alone would end before the timestamps of keys it registers, and a
// Postgres store sharing the archive would prove those keys never archived.
// first_used only moves earlier and used_until only later, so a record never
// claims less use than happened (a database clock that ran fast when the
// lease was first taken is corrected by the next renewal).
const pgLeaseSQL = `
INSERT INTO idempotency_writers AS w (ttl_ms, skew_ms, bounded, first_used, used_until)
VALUES ($1, $2, true, least(now(), coalesce($4::timestamptz, now())),
        greatest(now(), coalesce($4::timestamptz, now())) + $3 * interval '1 millisecond')
ON CONFLICT (ttl_ms, skew_ms, bounded) DO UPDATE
   SET first_used = least(w.first_used, excluded.first_used),
       used_until = greatest(w.used_until, excluded.used_until)`

// leases renews a process's leases.
type leases struct {
	pool *pgxpool.Pool
	// clock is the writer's own clock, recorded with each lease; nil for a
	// writer whose registrations the database's clock bounds. Also the
	// wall clock renewals are timed by (time.Now when nil).
	clock func() time.Time
	// timeout bounds a renewal's statement (see record): registerTimeout.
	timeout time.Duration
	mu      sync.Mutex
	renewed map[lease]renewal
}

// renewal is when a lease was last renewed: the local time (with its
// monotonic reading), and the writer's clock then.
type renewal struct{ local, wall time.Time }

func newLeases(pool *pgxpool.Pool) *leases {
	return &leases{pool: pool, timeout: registerTimeout, renewed: map[lease]renewal{}}
}

func (ls *leases) wallNow() time.Time {
	if ls.clock != nil {
		return ls.clock().Round(0)
	}
	return time.Now().Round(0)
}

// due says whether a lease last renewed at r needs renewing: renewAfter has
// passed on the monotonic clock or on the wall clock, or the wall clock went
// back.
func (ls *leases) due(r renewal) bool {
	wall := ls.wallNow().Sub(r.wall)
	return time.Since(r.local) >= renewAfter || wall >= renewAfter || wall < 0
}

// renew extends the lease on l when it is due, or always when force.
func (ls *leases) renew(ctx context.Context, l lease, force bool) error {
	ls.mu.Lock()
	last, ok := ls.renewed[l]
	ls.mu.Unlock()
	if ok && !force && !ls.due(last) {
		return nil
	}
	start := renewal{local: time.Now(), wall: ls.wallNow()}
	var own *time.Time
	if ls.clock != nil {
		own = &start.wall
	}
	if err := ls.record(ctx, l, own); err != nil {
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

// leaseSettingsSQL sets the statement timeout of a renewal ($1, as
// '<n>ms'), local to its implicit transaction.
const leaseSettingsSQL = "SELECT set_config('statement_timeout', $1, true)"

// record runs pgLeaseSQL bounded as a registration is (ls.timeout, which is
// registerTimeout, or less when ctx's deadline comes sooner, and
// registerGrace more for the server's answer): a renewal waits for a lock on idempotency_writers (a
// migration altering it, an operator's transaction) no longer than the
// registration it precedes would, and holds its pool connection no longer.
// A renewal cut short is safe either way: one that commits after its caller
// gave up records more use than happened, never less.
func (ls *leases) record(ctx context.Context, l lease, own *time.Time) error {
	timeout := ls.timeout
	if deadline, ok := ctx.Deadline(); ok {
		timeout = min(timeout, time.Until(deadline))
	}
	if timeout < time.Millisecond {
		// Never '0ms': PostgreSQL reads it as no timeout at all.
		return context.DeadlineExceeded
	}
	ctx, cancel := context.WithTimeout(ctx, timeout+registerGrace)
	defer cancel()
	// Under a default_transaction_isolation of REPEATABLE READ or
	// SERIALIZABLE, a renewal that waited for another process's renewal of
	// the same row fails so, writing nothing: again, with a new snapshot,
	// it updates the row that one left.
	return untilSerialized(ctx, func() error {
		b := &pgx.Batch{}
		b.Queue(leaseSettingsSQL, strconv.FormatInt(timeout.Milliseconds(), 10)+"ms")
		b.Queue(pgLeaseSQL, l.ttlMS, l.skewMS, leaseFor.Milliseconds(), own)
		return ls.pool.SendBatch(ctx, b).Close()
	})
}

// untilSerialized runs op, and again after a short random pause while it
// fails with a serialization failure (40001) and ctx lasts. Such a failure
// writes nothing; in a burst of writers of one row, each round lets one
// through, so every one gets through in turn.
func untilSerialized(ctx context.Context, op func() error) error {
	for {
		err := op()
		if database.SQLState(err) != database.CodeSerializationFailure {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(time.Duration(1+rand.IntN(5)) * time.Millisecond):
		}
	}
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
