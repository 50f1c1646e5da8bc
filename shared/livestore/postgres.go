// Package livestore holds the live stores behind the idempotency middleware:
// Postgres (the idempotency_keys table that the sweeper archives from) and
// Redis (which archives at completion, because Redis cannot be swept).
package livestore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemarchive/idemarchive/shared/idempotency"
)

// ErrNotInFlight means Complete found no in-flight entry with that fingerprint
// (it expired, or was released).
var ErrNotInFlight = errors.New("livestore: key is not in flight")

// Postgres keeps live keys in idempotency_keys.
type Postgres struct {
	pool *pgxpool.Pool
}

var _ idempotency.Store = (*Postgres)(nil)

// NewPostgres returns a store over pool.
func NewPostgres(pool *pgxpool.Pool) *Postgres { return &Postgres{pool: pool} }

const (
	pgRegisterSQL = `
INSERT INTO idempotency_keys (scoped_key, fingerprint, expires_at)
VALUES ($1, $2, now() + $3 * interval '1 millisecond')
ON CONFLICT (scoped_key) DO NOTHING
RETURNING created_at, expires_at`

	pgGetSQL = `
SELECT fingerprint, state, coalesce(status_code, 0), coalesce(response_raw, convert_to(response::text, 'UTF8')),
       coalesce(content_type, ''), resource_id, created_at, expires_at
  FROM idempotency_keys
 WHERE scoped_key = $1`

	pgCompleteSQL = `
UPDATE idempotency_keys
   SET state = 'completed', status_code = $3, response = $4::text::jsonb, response_raw = $5,
       content_type = $6, resource_id = $7
 WHERE scoped_key = $1 AND fingerprint = $2 AND state = 'in_flight'`

	pgReleaseSQL = `DELETE FROM idempotency_keys WHERE scoped_key = $1 AND fingerprint = $2 AND state = 'in_flight'`
)

// Register inserts an in-flight row, or returns the existing one. The insert
// and the read are separate statements: under READ COMMITTED the read then
// sees a row that a concurrent request committed while the insert waited.
func (p *Postgres) Register(ctx context.Context, key string, fp []byte, ttl time.Duration) (idempotency.Entry, bool, error) {
	for range 5 {
		e := idempotency.Entry{Fingerprint: fp, State: idempotency.InFlight}
		err := p.pool.QueryRow(ctx, pgRegisterSQL, key, fp, ttl.Milliseconds()).Scan(&e.CreatedAt, &e.ExpiresAt)
		if err == nil {
			return e, true, nil
		}
		if !errors.Is(err, pgx.ErrNoRows) {
			return e, false, fmt.Errorf("register idempotency key: %w", err)
		}
		e, err = p.get(ctx, key)
		if errors.Is(err, pgx.ErrNoRows) {
			continue // released between the two statements: try again
		}
		return e, false, err
	}
	return idempotency.Entry{}, false, errors.New("register idempotency key: the key keeps being released concurrently")
}

func (p *Postgres) get(ctx context.Context, key string) (idempotency.Entry, error) {
	var e idempotency.Entry
	var state string
	var status int16
	var response []byte
	err := p.pool.QueryRow(ctx, pgGetSQL, key).Scan(&e.Fingerprint, &state, &status, &response, &e.ContentType, &e.ResourceID, &e.CreatedAt, &e.ExpiresAt)
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
	tag, err := p.pool.Exec(ctx, pgCompleteSQL, key, c.Fingerprint, c.Status, asJSON, raw, c.ContentType, c.ResourceID)
	if err != nil {
		return fmt.Errorf("complete idempotency key: %w", err)
	}
	if tag.RowsAffected() == 0 {
		return ErrNotInFlight
	}
	return nil
}

// Release deletes the in-flight row this request registered.
func (p *Postgres) Release(ctx context.Context, key string, fp []byte) error {
	if _, err := p.pool.Exec(ctx, pgReleaseSQL, key, fp); err != nil {
		return fmt.Errorf("release idempotency key: %w", err)
	}
	return nil
}
