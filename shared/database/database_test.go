package database_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/binary"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
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
		// Every host of a multi-host string is checked, not just the first.
		{database.Config{URL: "postgres://u:pw@127.0.0.1,db.prod.example.com/db"}, false},
		{database.Config{URL: "postgres://u:pw@127.0.0.1,db.prod.example.com/db?sslmode=require"}, false},
		{database.Config{URL: "postgres://u:pw@db.prod.example.com,db2.prod.example.com/db?sslmode=verify-full"}, true},
		{database.Config{URL: "host=localhost,db.prod.example.com user=u"}, false},
		{database.Config{URL: "postgres://u@localhost,127.0.0.1/app"}, true},
		{database.Config{URL: "postgres://u@localhost/app", MaxConns: database.MaxMaxConns}, true},
		{database.Config{URL: "postgres://u@localhost/app", MaxConns: database.MaxMaxConns + 1}, false},
		{database.Config{URL: "postgres://u@localhost/app", MaxConns: -1}, false},
	}
	for _, tc := range cases {
		_, err := tc.cfg.PoolConfig()
		require.Equal(t, tc.ok, err == nil, "%+v: %v", tc.cfg, err)
		if err != nil {
			require.NotContains(t, err.Error(), "postgres://", "errors never echo the connection string")
		}
	}
}

func TestTheErrorNamesTheUnverifiedFallbackHost(t *testing.T) {
	t.Parallel()
	_, err := database.Config{URL: "postgres://u:pw@127.0.0.1,db.prod.example.com/db"}.PoolConfig()
	require.ErrorContains(t, err, "db.prod.example.com")
	require.NotContains(t, err.Error(), "pw")
}

// caBundle writes a PEM file holding one self-signed CA certificate.
func caBundle(t *testing.T, name string) (string, *x509.Certificate) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test RDS CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	require.NoError(t, err)
	cert, err := x509.ParseCertificate(der)
	require.NoError(t, err)
	path := filepath.Join(t.TempDir(), name)
	require.NoError(t, os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600))
	return path, cert
}

func TestSSLRootCertVerifiesEveryHostAgainstTheBundle(t *testing.T) {
	t.Parallel()
	path, cert := caBundle(t, "rds 'global' bundle.pem") // a quote and a space survive both forms
	want := x509.NewCertPool()
	want.AddCert(cert)

	for _, c := range []database.Config{
		{SecretARN: "arn:aws:secretsmanager:eu-west-1:1:secret:db", SSLRootCert: path},
		{URL: "postgres://u@db.example.com,db2.example.com/app", SSLRootCert: path},
		{URL: "postgres://u@db.example.com/app?sslmode=require", SSLRootCert: path},
		{URL: "postgres://u@db.example.com/app?sslmode=prefer", SSLRootCert: path},
		{URL: "host=db.example.com user=u sslmode=disable", SSLRootCert: path},
	} {
		cfg, err := c.PoolConfig()
		require.NoError(t, err, "%+v", c)
		cc := cfg.ConnConfig
		attempts := append([]*pgconn.FallbackConfig{{Host: cc.Host, TLSConfig: cc.TLSConfig}}, cc.Fallbacks...)
		for _, a := range attempts {
			require.NotNil(t, a.TLSConfig, "%s: a plaintext attempt", a.Host)
			require.False(t, a.TLSConfig.InsecureSkipVerify, a.Host)
			require.Equal(t, a.Host, a.TLSConfig.ServerName, "verify-full checks the name")
			require.True(t, want.Equal(a.TLSConfig.RootCAs), "%s: not the bundle's roots", a.Host)
		}
	}

	// Two bundles are one too many: neither silently wins.
	_, err := database.Config{URL: "postgres://u@db.example.com/app?sslrootcert=/elsewhere.pem", SSLRootCert: path}.PoolConfig()
	require.ErrorContains(t, err, "keep one")

	_, err = database.Config{SecretARN: "arn:x", SSLRootCert: filepath.Join(t.TempDir(), "missing.pem")}.PoolConfig()
	require.ErrorContains(t, err, "missing.pem")
	notPEM := filepath.Join(t.TempDir(), "bundle.pem")
	require.NoError(t, os.WriteFile(notPEM, []byte("not a certificate"), 0o600))
	_, err = database.Config{SecretARN: "arn:x", SSLRootCert: notPEM}.PoolConfig()
	require.ErrorContains(t, err, "holds no PEM certificate")
}

// A server that refuses TLS (it answers the client's SSLRequest "N") is
// refused in turn: the client never sends its startup message, the user's
// name and the database's, in plaintext.
func TestSSLRootCertNeverFallsBackToPlaintext(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { _ = ln.Close() })
	var plaintext atomic.Bool
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				_ = c.SetDeadline(time.Now().Add(10 * time.Second))
				req := make([]byte, 8)
				if _, err := io.ReadFull(c, req); err != nil {
					return
				}
				if binary.BigEndian.Uint32(req[4:]) != 80877103 { // not an SSLRequest: a plaintext startup
					plaintext.Store(true)
					return
				}
				_, _ = c.Write([]byte{'N'})
				if n, _ := c.Read(make([]byte, 1)); n > 0 {
					plaintext.Store(true) // it went on without TLS
				}
			}()
		}
	}()
	path, _ := caBundle(t, "ca.pem")
	url := fmt.Sprintf("postgres://app@%s/app", ln.Addr())
	pool, err := database.Open(context.Background(), database.Config{URL: url, SSLRootCert: path}, nil)
	require.NoError(t, err)
	defer pool.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err = pool.Ping(ctx)
	require.ErrorContains(t, err, "refused TLS")
	require.False(t, plaintext.Load(), "the client fell back to plaintext")
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

// A pool size in the URL is refused with a message that names the setting
// to use: DATABASE_MAX_CONNS would silently override it.
func TestAPoolSizeInTheURLIsRefused(t *testing.T) {
	t.Parallel()
	for _, u := range []string{
		"postgres://u:secret@127.0.0.1/db?pool_max_conns=10",
		"postgres://u:secret@127.0.0.1/db?pool%5Fmax%5Fconns=10",
		"host=127.0.0.1 user=u password=secret pool_max_conns=10",
	} {
		_, err := database.Config{URL: u}.PoolConfig()
		require.ErrorContains(t, err, "DATABASE_MAX_CONNS", u)
		require.NotContains(t, err.Error(), "secret")
	}
	// The text elsewhere is no pool size.
	for _, u := range []string{
		"postgres://u:secret@127.0.0.1/db?pool_min_conns=1",
		"postgres://u:pool_max_conns@127.0.0.1/db?application_name=pool_max_conns",
	} {
		_, err := database.Config{URL: u}.PoolConfig()
		require.NoError(t, err, u)
	}
}

// An execution mode in the URL other than DATABASE_EXEC_MODE's is refused:
// the variable silently replaced the URL's. Either alone is honoured.
func TestAnExecModeInTheURLAndTheVariableIsRefused(t *testing.T) {
	t.Parallel()
	for _, u := range []string{
		"postgres://u:secret@127.0.0.1/db?default_query_exec_mode=simple_protocol",
		"host=127.0.0.1 user=u password=secret default_query_exec_mode=exec",
	} {
		_, err := database.Config{URL: u, ExecMode: "cache_statement"}.PoolConfig()
		require.ErrorContains(t, err, "DATABASE_EXEC_MODE", u)
		require.NotContains(t, err.Error(), "secret")
		cfg, err := database.Config{URL: u}.PoolConfig()
		require.NoError(t, err, u)
		require.NotEqual(t, pgx.QueryExecModeCacheStatement, cfg.ConnConfig.DefaultQueryExecMode, u)
	}
	cfg, err := database.Config{URL: "postgres://u@127.0.0.1/db", ExecMode: "exec"}.PoolConfig()
	require.NoError(t, err)
	require.Equal(t, pgx.QueryExecModeExec, cfg.ConnConfig.DefaultQueryExecMode)
	// The same mode in both says one thing.
	cfg, err = database.Config{URL: "postgres://u@127.0.0.1/db?default_query_exec_mode=exec", ExecMode: "exec"}.PoolConfig()
	require.NoError(t, err)
	require.Equal(t, pgx.QueryExecModeExec, cfg.ConnConfig.DefaultQueryExecMode)
}

// fakeSecret is the value a fake Secrets Manager serves; set rotates it.
type fakeSecret struct {
	mu sync.Mutex
	v  map[string]any
}

func (f *fakeSecret) set(k string, v any) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.v[k] = v
}

func (f *fakeSecret) json() []byte {
	f.mu.Lock()
	defer f.mu.Unlock()
	b, _ := json.Marshal(f.v)
	return b
}

// fakeSecretsManager answers GetSecretValue as the AWS JSON 1.1 protocol does.
func fakeSecretsManager(t *testing.T, secret map[string]any, calls *atomic.Int32) *httptest.Server {
	return fakeRotatingSecretsManager(t, &fakeSecret{v: secret}, calls)
}

func fakeRotatingSecretsManager(t *testing.T, secret *fakeSecret, calls *atomic.Int32) *httptest.Server {
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
		s := secret.json()
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

// InTx runs READ COMMITTED whatever the session's default: the sweep batch's
// safety rests on it.
func TestInTxIsReadCommittedWhateverTheDefault(t *testing.T) {
	t.Parallel()
	db := dbtest.New(t)
	for _, iso := range []string{"repeatable read", "serializable"} {
		pool := db.NewPool(t, dbtest.WithParam("default_transaction_isolation", iso))
		var got string
		err := database.InTx(context.Background(), pool, nil, func(tx pgx.Tx) error {
			return tx.QueryRow(context.Background(), "SHOW transaction_isolation").Scan(&got)
		})
		require.NoError(t, err)
		require.Equal(t, "read committed", got, iso)
	}
}
