package database_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemarchive/idemarchive/shared/database"
	"github.com/idemarchive/idemarchive/shared/dbtest"
)

// passwordRole creates a login role that must present its password: the test
// server trusts everyone, so a pg_hba.conf line for this role alone is put
// first (written by the server itself, through COPY, as superuser) and the
// original file is restored when the test ends.
func passwordRole(t *testing.T, admin *pgxpool.Pool, password string) string {
	t.Helper()
	ctx := context.Background()
	var buf [4]byte
	_, _ = rand.Read(buf[:])
	role := "rotation_" + hex.EncodeToString(buf[:])
	_, err := admin.Exec(ctx, "CREATE ROLE "+pgx.Identifier{role}.Sanitize()+" LOGIN PASSWORD "+quote(password))
	require.NoError(t, err, "the database tests need a superuser DATABASE_URL")
	t.Cleanup(func() {
		_, _ = admin.Exec(context.Background(), "DROP ROLE IF EXISTS "+pgx.Identifier{role}.Sanitize())
	})

	var path, original string
	require.NoError(t, admin.QueryRow(ctx, "SELECT setting, pg_read_file(setting) FROM pg_settings WHERE name = 'hba_file'").Scan(&path, &original))
	writeHBA := func(content string) {
		// One row per line; CSV with delimiter and quote bytes that never
		// occur in the file, so no line is quoted or escaped.
		var stmt string
		require.NoError(t, admin.QueryRow(ctx, `SELECT format(
			'COPY (SELECT NULLIF(line, '''') FROM unnest(string_to_array(rtrim(%L, E''\n''), E''\n'')) WITH ORDINALITY AS l(line, n) ORDER BY n)
			 TO %L WITH (FORMAT csv, DELIMITER E''\x01'', QUOTE E''\x02'')', $1::text, $2::text)`, content, path).Scan(&stmt))
		_, err := admin.Exec(ctx, stmt)
		require.NoError(t, err)
		_, err = admin.Exec(ctx, "SELECT pg_reload_conf()")
		require.NoError(t, err)
	}
	// Over TCP and over a Unix socket (the test harness's cluster takes
	// connections on a socket only).
	writeHBA("local all " + role + " scram-sha-256\nhost all " + role + " all scram-sha-256\n" + original)
	t.Cleanup(func() { writeHBA(original) })

	// The reload is asynchronous: wait until a wrong password is refused.
	cc, err := pgx.ParseConfig(dbtest.URL(t))
	require.NoError(t, err)
	cc.User, cc.Password = role, "wrong"
	require.Eventually(t, func() bool {
		c, err := pgx.ConnectConfig(ctx, cc)
		if err == nil {
			_ = c.Close(ctx)
		}
		return database.SQLState(err) == database.CodeInvalidPassword
	}, 10*time.Second, 20*time.Millisecond, "pg_hba.conf reload did not take effect")
	return role
}

func quote(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

func TestASecretRotationNeedsNoWaitForTheCache(t *testing.T) {
	// Not parallel: it rewrites pg_hba.conf (for its own role only).
	db := dbtest.New(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	role := passwordRole(t, db.Pool, "first-password")
	alter := func(password string) {
		_, err := db.Pool.Exec(ctx, "ALTER ROLE "+pgx.Identifier{role}.Sanitize()+" PASSWORD "+quote(password))
		require.NoError(t, err)
	}

	cc, err := pgx.ParseConfig(db.URL)
	require.NoError(t, err)
	secret := &fakeSecret{v: map[string]any{
		"username": role, "password": "first-password", "host": cc.Host, "port": cc.Port, "dbname": cc.Database,
	}}
	var calls atomic.Int32
	srv := fakeRotatingSecretsManager(t, secret, &calls)
	const minRefetch = time.Second
	pool, err := database.Open(ctx, database.Config{
		SecretARN: "arn:aws:secretsmanager:eu-west-1:123456789012:secret:archive-db",
		MaxConns:  8, SecretMinRefetch: minRefetch, // SecretTTL: the default 5 minutes
	}, awsConfig(srv.URL))
	require.NoError(t, err)
	defer pool.Close()

	// newConn acquires a connection the pool must open now: every earlier
	// one is still held.
	var held []*pgxpool.Conn
	defer func() {
		for _, c := range held {
			c.Release()
		}
	}()
	newConn := func() error {
		c, err := pool.Acquire(ctx)
		if err != nil {
			return err
		}
		held = append(held, c)
		var user string
		require.NoError(t, c.QueryRow(ctx, "SELECT current_user").Scan(&user))
		require.Equal(t, role, user)
		return nil
	}

	require.NoError(t, newConn())
	require.EqualValues(t, 1, calls.Load())

	// GIVEN a rotation: PostgreSQL and the secret have the new password, the
	// cache still the old one, well inside its 5 minutes.
	alter("second-password")
	secret.set("password", "second-password")
	time.Sleep(minRefetch)
	// WHEN a new connection is made THEN it succeeds at once, after one refetch.
	require.NoError(t, newConn())
	require.EqualValues(t, 2, calls.Load())
	require.NoError(t, newConn(), "the refetched secret is cached")
	require.EqualValues(t, 2, calls.Load())

	// GIVEN PostgreSQL has a password the secret does not have yet (a
	// single-user rotation between its setSecret and finishSecret steps).
	alter("third-password")
	time.Sleep(minRefetch)
	// THEN a connection fails with 28P01 after one refetch, and every failure
	// within minRefetch of it fetches nothing.
	err = newConn()
	firstFailure := time.Now()
	require.Equal(t, database.CodeInvalidPassword, database.SQLState(err), "%v", err)
	require.EqualValues(t, 3, calls.Load())
	for range 5 {
		err = newConn()
		require.Equal(t, database.CodeInvalidPassword, database.SQLState(err), "%v", err)
	}
	// At most one more fetch per minRefetch that passed (on a loaded
	// machine five failed connections can outlast it): never one a failure.
	allowed := 3 + int(time.Since(firstFailure)/minRefetch)
	require.LessOrEqual(t, int(calls.Load()), min(allowed, 3+4), "refetches are rate limited")
	fetched := calls.Load()

	// WHEN the secret catches up THEN the next connection after minRefetch
	// picks it up.
	secret.set("password", "third-password")
	time.Sleep(minRefetch)
	require.NoError(t, newConn())
	require.EqualValues(t, fetched+1, calls.Load())
	// Connections opened before the rotation keep working.
	require.NoError(t, held[0].Ping(ctx))
}
