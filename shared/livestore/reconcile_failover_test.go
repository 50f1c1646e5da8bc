package livestore

import (
	"context"
	"os"
	"sync/atomic"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/idemarchive/idemarchive/shared/dbtest"
	"github.com/idemarchive/idemarchive/shared/testenv"
)

// failover makes the server look replaced (a new run_id) from the second
// INFO on: a replica promoted behind the same endpoint during the scan.
type failover struct{ infos atomic.Int32 }

func (*failover) DialHook(next redis.DialHook) redis.DialHook { return next }
func (*failover) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

func (f *failover) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if err := next(ctx, cmd); err != nil || cmd.Name() != "info" {
			return err
		}
		if f.infos.Add(1) > 1 {
			cmd.(*redis.StringCmd).SetVal("# Server\r\nredis_version:7.0.15\r\nrun_id:0000000000000000000000000000000000000000\r\n")
		}
		return nil
	}
}

// A scan that a failover or a restart cut in two may have skipped keys: the
// run says so instead of ending as if complete. Without the change, it is
// the same server, and the run ends well.
func TestReconcileAcrossAFailoverSaysSo(t *testing.T) {
	t.Parallel()
	db := dbtest.New(t)
	db.Partition(t, 0)
	_, prefix := testenv.Redis(t)
	opts, err := redis.ParseURL(os.Getenv("REDIS_URL"))
	require.NoError(t, err)
	client := redis.NewClient(opts)
	t.Cleanup(func() { _ = client.Close() })
	s := NewRedis(client, db.Pool, prefix)
	_, err = db.Pool.Exec(context.Background(), "INSERT INTO idempotency_writers (ttl_ms, skew_ms, bounded, first_used, used_until) VALUES (0, 0, true, now(), now())")
	require.NoError(t, err)

	_, err = s.Reconcile(context.Background(), false, func(string, error) {})
	require.NoError(t, err, "the same server throughout")

	client.AddHook(&failover{})
	_, err = s.Reconcile(context.Background(), false, func(string, error) {})
	require.ErrorIs(t, err, ErrServerChanged)
}
