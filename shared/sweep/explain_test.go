package sweep

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemarchive/idemarchive/shared/database"
	"github.com/idemarchive/idemarchive/shared/dbtest"
)

// planNode is the part of EXPLAIN (FORMAT JSON) this test reads.
type planNode struct {
	NodeType     string     `json:"Node Type"`
	RelationName string     `json:"Relation Name"`
	IndexName    string     `json:"Index Name"`
	Plans        []planNode `json:"Plans"`
}

func (n planNode) walk(visit func(planNode)) {
	visit(n)
	for _, c := range n.Plans {
		c.walk(visit)
	}
}

// The batch statement must stay index-driven on a large live table at every
// batch size: a sequential scan of idempotency_keys means every batch reads
// the whole table.
func TestBatchPlanIsIndexDrivenOnALargeLiveTable(t *testing.T) {
	t.Parallel()
	db := dbtest.New(t)
	ctx := context.Background()
	db.Partition(t, 0)

	// GIVEN a million live rows, a third of them expired, in random expiry
	// order (the worst case for the planner: no physical correlation)
	_, err := db.Pool.Exec(ctx, `
		INSERT INTO idempotency_keys (scoped_key, fingerprint, state, status_code, response, created_at, expires_at)
		SELECT 'idem:v1:' || md5(g::text),
		       sha256(g::text::bytea),
		       'completed', 201,
		       jsonb_build_object('id', 'ch_' || g),
		       now() - interval '2 days',
		       now() - interval '8 hours' + random() * interval '24 hours'
		  FROM generate_series(1, 1000000) g`)
	require.NoError(t, err)
	_, err = db.Pool.Exec(ctx, "ANALYZE idempotency_keys")
	require.NoError(t, err)

	for _, size := range []int{1, 100, 10_000, 25_000, 50_000} {
		t.Run(fmt.Sprintf("batch %d", size), func(t *testing.T) {
			// WHEN the real batch statement is planned with the sweeper's settings
			var plan []struct {
				Plan planNode `json:"Plan"`
			}
			settings := map[string]string{"plan_cache_mode": "force_custom_plan"}
			err := database.InTx(ctx, db.Pool, settings, func(tx pgx.Tx) error {
				var raw []byte
				if err := tx.QueryRow(ctx, "EXPLAIN (FORMAT JSON) "+batchSQL, size, []string{"id"}, 0, MaxResourceIDBytes).Scan(&raw); err != nil {
					return err
				}
				return json.Unmarshal(raw, &plan)
			})
			require.NoError(t, err)

			// THEN no node scans the live table sequentially: the claim reads
			// the expiry index, and the DELETE goes straight to the claimed
			// tuples (a TID scan, no index probe and no join)
			var indexes, scans []string
			plan[0].Plan.walk(func(n planNode) {
				if n.RelationName == "idempotency_keys" {
					require.NotEqual(t, "Seq Scan", n.NodeType, "batch of %d scans the live table sequentially", size)
					require.NotEqual(t, "Bitmap Heap Scan", n.NodeType, "batch of %d reads the live table through a bitmap", size)
					indexes = append(indexes, n.IndexName)
					scans = append(scans, n.NodeType)
				}
			})
			require.Contains(t, indexes, "idempotency_keys_expires_at_idx")
			require.Contains(t, scans, "Tid Scan", "batch of %d does not delete by ctid", size)
		})
	}

	// AND a real batch of 50,000 moves 50,000 rows
	s, err := New(db.Pool, Config{BatchSize: 50_000, MaxDuration: time.Nanosecond}, nil, nil)
	require.NoError(t, err)
	res, err := s.Run(ctx)
	require.NoError(t, err)
	require.Equal(t, int64(50_000), res.Moved)
}
