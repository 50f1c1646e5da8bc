package database_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemarchive/idemarchive/shared/database"
	"github.com/idemarchive/idemarchive/shared/dbtest"
)

func TestTLSIsVerifiedFullOutsideLocalUse(t *testing.T) {
	t.Parallel()
	cases := []struct {
		cfg database.Config
		ok  bool
	}{
		{database.Config{URL: "postgres://u@db.example.com/app"}, false},
		{database.Config{URL: "postgres://u@db.example.com/app?sslmode=require"}, false},
		{database.Config{URL: "postgres://u@db.example.com/app?sslmode=verify-ca"}, false},
		{database.Config{URL: "postgres://u@db.example.com/app?sslmode=verify-full"}, true},
		{database.Config{URL: "postgres://u@db.example.com/app", InsecureTLS: true}, true},
		{database.Config{URL: "postgres://u@127.0.0.1/app?sslmode=disable"}, true},
		{database.Config{URL: "postgres://u@localhost/app"}, true},
		{database.Config{URL: "host=/var/run/postgresql user=u"}, true},
		{database.Config{SecretARN: "arn:aws:secretsmanager:eu-west-1:1:secret:db"}, true},
		{database.Config{SecretARN: "arn:x", IAMAuth: true, URL: "postgres://u@localhost/app"}, false},
		{database.Config{IAMAuth: true}, false},
		{database.Config{}, false},
		{database.Config{URL: "postgres://u@localhost/app", ExecMode: "turbo"}, false},
	}
	for _, tc := range cases {
		_, err := tc.cfg.PoolConfig()
		require.Equal(t, tc.ok, err == nil, "%+v: %v", tc.cfg, err)
		if err != nil {
			require.NotContains(t, err.Error(), "postgres://", "errors never echo the connection string")
		}
	}
}

func TestExecModes(t *testing.T) {
	t.Parallel()
	db := dbtest.New(t)
	for _, mode := range []string{"cache_statement", "exec", "simple_protocol"} {
		pool, err := database.Open(context.Background(), database.Config{URL: db.URL, ExecMode: mode, MaxConns: 2}, nil)
		require.NoError(t, err)
		var n int
		require.NoError(t, pool.QueryRow(context.Background(), "SELECT $1::int + 1", 41).Scan(&n), mode)
		require.Equal(t, 42, n)
		require.EqualValues(t, 2, pool.Config().MaxConns)
		pool.Close()
	}
}

// fakeSecretsManager answers GetSecretValue as the AWS JSON 1.1 protocol does.
func fakeSecretsManager(t *testing.T, secret map[string]any, calls *atomic.Int32) *httptest.Server {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		if r.Header.Get("X-Amz-Target") != "secretsmanager.GetSecretValue" {
			http.Error(w, "unexpected target", http.StatusBadRequest)
			return
		}
		var in struct{ SecretId string }
		_ = json.NewDecoder(r.Body).Decode(&in)
		if in.SecretId != "arn:aws:secretsmanager:eu-west-1:123456789012:secret:archive-db" {
			w.WriteHeader(http.StatusBadRequest)
			fmt.Fprint(w, `{"__type":"ResourceNotFoundException","message":"no such secret"}`)
			return
		}
		s, _ := json.Marshal(secret)
		w.Header().Set("Content-Type", "application/x-amz-json-1.1")
		_ = json.NewEncoder(w).Encode(map[string]any{"ARN": in.SecretId, "Name": "archive-db", "SecretString": string(s)})
	}))
	t.Cleanup(srv.Close)
	return srv
}

func awsConfig(endpoint string) *aws.Config {
	return &aws.Config{
		Region:       "eu-west-1",
		Credentials:  credentials.NewStaticCredentialsProvider("AKIDEXAMPLE", "secret", ""),
		BaseEndpoint: aws.String(endpoint),
	}
}

func TestCredentialsFromASecret(t *testing.T) {
	t.Parallel()
	db := dbtest.New(t)
	cc, err := pgx.ParseConfig(db.URL)
	require.NoError(t, err)
	var calls atomic.Int32
	// The RDS-generated shape, with the port as a number.
	srv := fakeSecretsManager(t, map[string]any{
		"username": cc.User, "password": "from-the-secret", "engine": "postgres",
		"host": cc.Host, "port": cc.Port, "dbname": cc.Database,
	}, &calls)

	pool, err := database.Open(context.Background(), database.Config{
		SecretARN: "arn:aws:secretsmanager:eu-west-1:123456789012:secret:archive-db", MaxConns: 3,
	}, awsConfig(srv.URL))
	require.NoError(t, err)
	defer pool.Close()
	var conns []*pgxpool.Conn // three connections at once, one fetch
	for range 3 {
		c, err := pool.Acquire(context.Background())
		require.NoError(t, err)
		conns = append(conns, c)
	}
	for _, c := range conns {
		c.Release()
	}
	var user string
	require.NoError(t, pool.QueryRow(context.Background(), "SELECT current_user").Scan(&user))
	require.Equal(t, cc.User, user)
	require.EqualValues(t, 1, calls.Load(), "the secret is fetched once and cached")

	// A secret that does not exist fails the connection with a clear error.
	bad, err := database.Open(context.Background(), database.Config{SecretARN: "arn:aws:secretsmanager:eu-west-1:123456789012:secret:other"}, awsConfig(srv.URL))
	require.NoError(t, err)
	defer bad.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err = bad.Acquire(ctx)
	require.ErrorContains(t, err, "fetch database secret")
}

func TestIAMTokensAreMintedPerConnection(t *testing.T) {
	t.Parallel()
	db := dbtest.New(t)
	pool, err := database.Open(context.Background(), database.Config{URL: db.URL, IAMAuth: true}, awsConfig("http://unused.invalid"))
	require.NoError(t, err)
	defer pool.Close()

	// The token is a presigned rds-db:connect URL for the user and endpoint.
	cc := pool.Config().ConnConfig.Copy()
	require.NoError(t, pool.Config().BeforeConnect(context.Background(), cc))
	require.Contains(t, cc.Password, fmt.Sprintf("%s:%d?Action=connect", cc.Host, cc.Port))
	require.Contains(t, cc.Password, "DBUser="+cc.User)
	require.Contains(t, cc.Password, "X-Amz-Signature=")
	// The local test server trusts every password, so the pool connects.
	require.NoError(t, pool.Ping(context.Background()))
}

func TestLazyOpensOnceAndRetriesAfterFailure(t *testing.T) {
	t.Parallel()
	db := dbtest.New(t)
	var opens atomic.Int32
	fail := true
	lazy := database.NewLazy(func(ctx context.Context) (*pgxpool.Pool, error) {
		opens.Add(1)
		if fail {
			return nil, errors.New("boom")
		}
		return database.Open(ctx, database.Config{URL: db.URL}, nil)
	}, (*pgxpool.Pool).Close)
	_, err := lazy.Get(context.Background())
	require.ErrorContains(t, err, "boom")
	fail = false
	p1, err := lazy.Get(context.Background())
	require.NoError(t, err)
	p2, err := lazy.Get(context.Background())
	require.NoError(t, err)
	require.Same(t, p1, p2)
	require.EqualValues(t, 2, opens.Load())
	lazy.Close()
	lazy.Close()
	require.Error(t, p1.Ping(context.Background()), "closed")
}
