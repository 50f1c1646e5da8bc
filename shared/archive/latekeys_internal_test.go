package archive

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemarchive/idemarchive/shared/dbtest"
	"github.com/idemarchive/idemarchive/shared/keytime"
)

// The database judges every key keytime reads exactly as keytime does
// (false, never NULL: either would make the lookup read every partition),
// and every key keytime does not read as having no timestamp, in every exec
// mode and after the plan cache has settled.
func TestTheDatabaseJudgesKeysAsKeytimeDoes(t *testing.T) {
	t.Parallel()
	db := dbtest.New(t)
	ctx := context.Background()
	ts := time.Date(2026, 2, 28, 23, 59, 59, 999e6, time.UTC)
	timestamped := []string{
		"idem:v1:" + dbtest.ULID(ts, ""),
		"idem:v1:" + strings.ToLower(dbtest.ULID(ts, "")),
		"idem:v1:" + dbtest.UUIDv7(ts, 1),
		"idem:v1:" + strings.ToUpper(dbtest.UUIDv7(ts, 1)),
		"t=acme:x:" + dbtest.ULID(time.UnixMilli(0), ""),
		dbtest.ULID(time.UnixMilli(1<<48-1), ""),
		dbtest.UUIDv7(time.UnixMilli(1<<48-1), 5),
		dbtest.UUIDv7(time.UnixMilli(0), 5),
		"ffffffff-ffff-7fff-bfff-ffffffffffff",
		"00000000-0000-7000-8000-000000000000",
		"7zzzzzzzzzzzzzzzzzzzzzzzzz",
		"é:" + dbtest.ULID(time.Date(1999, 12, 31, 23, 59, 59, 999e6, time.UTC), ""),
		strings.Repeat("x", MaxScopedKeyBytes-27) + ":" + dbtest.ULID(ts, ""),
	}
	plain := []string{"idem:v1:probe", "idem:v1:" + dbtest.ULID(ts, "")[:25], "8ZZZZZZZZZZZZZZZZZZZZZZZZZ"}
	for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeCacheStatement, pgx.QueryExecModeCacheDescribe, pgx.QueryExecModeDescribeExec, pgx.QueryExecModeExec, pgx.QueryExecModeSimpleProtocol} {
		pool := db.NewPool(t, func(c *pgxpool.Config) { c.MaxConns = 1; c.ConnConfig.DefaultQueryExecMode = mode })
		for rep := 0; rep < 7; rep++ { // past the plan cache's five custom plans
			for _, key := range timestamped {
				kt, ok := keytime.FromKey(key)
				require.True(t, ok, key)
				var lo, hi pgtype.Timestamptz
				var otherwise pgtype.Bool
				require.NoError(t, pool.QueryRow(ctx, lateKeySQL, key, PromptSpan, kt).Scan(&lo, &hi, &otherwise), "%v %s", mode, key)
				require.Equal(t, pgtype.Bool{Bool: false, Valid: true}, otherwise, "%v: %s (%s)", mode, key, kt)
			}
			for _, key := range plain {
				_, ok := keytime.FromKey(key)
				require.False(t, ok, key)
				var lo, hi pgtype.Timestamptz
				var hasTime pgtype.Bool
				require.NoError(t, pool.QueryRow(ctx, plainKeySQL, key).Scan(&lo, &hi, &hasTime), "%v %s", mode, key)
				require.Equal(t, pgtype.Bool{Bool: false, Valid: true}, hasTime, "%v: %s", mode, key)
			}
		}
	}
}
