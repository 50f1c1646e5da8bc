package provision

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemarchive/idemarchive/shared/dbtest"
)

// The deploy's migrations and partition run sign in as the owner user. Where that user
// cannot sign in, it falls back to the migrating user, with a warning, only
// off RDS (no rds_iam: such a user was made without a way to sign in); on
// RDS the run fails rather than run the owner's code with the migrating
// user's privileges.
func TestPartitionPoolSignsInAsTheOwnerUser(t *testing.T) {
	ownerSignInPause = time.Millisecond // the only test of the waits
	ctx := context.Background()
	db := dbtest.New(t)
	suffix := randomName(t)
	login, nologin := "owner_login_"+suffix, "owner_nologin_"+suffix
	for _, stmt := range []string{"CREATE ROLE " + login + " LOGIN IN ROLE idempotency_owner", "CREATE ROLE " + nologin + " NOLOGIN"} {
		_, err := db.Pool.Exec(ctx, stmt)
		require.NoError(t, err)
	}
	t.Cleanup(func() {
		for _, r := range []string{login, nologin} {
			_, _ = db.Pool.Exec(context.Background(), "DROP ROLE IF EXISTS "+r)
		}
	})
	var logs bytes.Buffer
	logger := slog.New(slog.NewTextHandler(&logs, nil))
	sessionUser := func(t *testing.T, iam bool, owner string) (string, error) {
		p, err := ownerPool(ctx, db.Pool, owner, iam, logger)
		if err != nil {
			return "", err
		}
		if p != db.Pool {
			defer p.Close()
		}
		var who, acting string
		require.NoError(t, p.QueryRow(ctx, "SELECT session_user, current_user").Scan(&who, &acting))
		if p != db.Pool {
			require.Equal(t, "idempotency_owner", acting, "what the owner user creates is the owner role's")
		}
		return who, nil
	}
	var me string
	require.NoError(t, db.Pool.QueryRow(ctx, "SELECT session_user").Scan(&me))

	who, err := sessionUser(t, true, login)
	require.NoError(t, err)
	require.Equal(t, login, who)
	require.Empty(t, logs.String())

	who, err = sessionUser(t, false, "")
	require.NoError(t, err)
	require.Equal(t, me, who, "no owner user named: the connecting user")

	who, err = sessionUser(t, false, nologin)
	require.NoError(t, err)
	require.Equal(t, me, who, "off RDS, a user that cannot sign in falls back")
	require.Contains(t, logs.String(), "the migrating user runs the owner role's code")

	_, err = ownerPool(ctx, db.Pool, nologin, true, logger)
	require.ErrorIs(t, err, errSignIn, "on RDS the run never falls back to the migrating user")
	require.ErrorContains(t, err, "sign in as "+nologin)
}

func randomName(t *testing.T) string {
	t.Helper()
	var b [6]byte
	_, err := rand.Read(b[:])
	require.NoError(t, err)
	return hex.EncodeToString(b[:])
}
