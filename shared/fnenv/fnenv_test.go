package fnenv_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemarchive/idemarchive/shared/dbtest"
	"github.com/idemarchive/idemarchive/shared/fnenv"
)

func lookupIn(vars map[string]string) func(string) string {
	return func(k string) string { return vars[k] }
}

func TestAWSConfigIsTheLambdaRuntimes(t *testing.T) {
	t.Parallel()
	lambda := map[string]string{
		"AWS_REGION": "eu-west-1", "AWS_DEFAULT_REGION": "us-east-1",
		"AWS_ACCESS_KEY_ID": "ASIAEXAMPLE", "AWS_SECRET_ACCESS_KEY": "wJalrXUtnFEMI-example", "AWS_SESSION_TOKEN": "token-example",
	}
	c, err := fnenv.AWSConfig(lookupIn(lambda))
	require.NoError(t, err)
	require.Equal(t, "eu-west-1", c.Region)
	require.Nil(t, c.BaseEndpoint)
	creds, err := c.Credentials.Retrieve(context.Background())
	require.NoError(t, err)
	require.Equal(t, "ASIAEXAMPLE", creds.AccessKeyID)
	require.Equal(t, "wJalrXUtnFEMI-example", creds.SecretAccessKey)
	require.Equal(t, "token-example", creds.SessionToken)

	// sam local invoke and LocalStack: the default region, an endpoint.
	local := map[string]string{"AWS_DEFAULT_REGION": "us-east-1", "AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test", "AWS_ENDPOINT_URL": "http://localhost.localstack.cloud:4566"}
	c, err = fnenv.AWSConfig(lookupIn(local))
	require.NoError(t, err)
	require.Equal(t, "us-east-1", c.Region)
	require.Equal(t, "http://localhost.localstack.cloud:4566", *c.BaseEndpoint)

	for name, drop := range map[string]string{"no region": "AWS_REGION AWS_DEFAULT_REGION", "no key id": "AWS_ACCESS_KEY_ID", "no secret key": "AWS_SECRET_ACCESS_KEY"} {
		vars := map[string]string{}
		for k, v := range lambda {
			vars[k] = v
		}
		for _, k := range strings.Fields(drop) {
			delete(vars, k)
		}
		_, err := fnenv.AWSConfig(lookupIn(vars))
		require.Error(t, err, name)
		require.NotContains(t, err.Error(), "wJalrXUtnFEMI", name)
		require.NotContains(t, err.Error(), "token-example", name)
	}
}

// A function whose credentials are in Secrets Manager connects with the
// configuration AWSConfig builds, at the endpoint AWS_ENDPOINT_URL names.
func TestLoadConnectsThroughASecretAtTheConfiguredEndpoint(t *testing.T) {
	t.Parallel()
	db := dbtest.New(t)
	cc, err := pgx.ParseConfig(db.URL)
	require.NoError(t, err)
	const arn = "arn:aws:secretsmanager:eu-west-1:123456789012:secret:archive-db"
	var signed atomic.Value // the Authorization header of the last call
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var in struct{ SecretId string }
		if r.Header.Get("X-Amz-Target") != "secretsmanager.GetSecretValue" || json.NewDecoder(r.Body).Decode(&in) != nil || in.SecretId != arn {
			http.Error(w, "unexpected request", http.StatusBadRequest)
			return
		}
		signed.Store(r.Header.Get("Authorization"))
		secret, _ := json.Marshal(map[string]any{"username": cc.User, "password": "from-the-secret", "host": cc.Host, "port": cc.Port, "dbname": cc.Database})
		w.Header().Set("Content-Type", "application/x-amz-json-1.1")
		_ = json.NewEncoder(w).Encode(map[string]any{"ARN": arn, "SecretString": string(secret)})
	}))
	defer srv.Close()

	env, err := fnenv.Load(context.Background(), lookupIn(map[string]string{
		"DATABASE_SECRET_ARN": arn, "AWS_REGION": "eu-west-1",
		"AWS_ACCESS_KEY_ID": "ASIAEXAMPLE", "AWS_SECRET_ACCESS_KEY": "secret-example", "AWS_ENDPOINT_URL": srv.URL,
	}), io.Discard, io.Discard)
	require.NoError(t, err)
	defer env.Close()
	pool, err := env.DB.Get(context.Background())
	require.NoError(t, err)
	var one int
	require.NoError(t, pool.QueryRow(context.Background(), "SELECT 1").Scan(&one))
	require.Equal(t, 1, one)
	require.Contains(t, signed.Load(), "Credential=ASIAEXAMPLE/", "signed with the role's key")
	require.Contains(t, signed.Load(), "/eu-west-1/secretsmanager/")

	// Without credentials, the function's init fails with a clear line.
	_, err = fnenv.Load(context.Background(), lookupIn(map[string]string{"DATABASE_SECRET_ARN": arn, "AWS_REGION": "eu-west-1"}), io.Discard, io.Discard)
	require.ErrorContains(t, err, "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY must both be set")
}

// The AWS variables are read as settings reads every variable: trimmed, and
// refused when set to blanks alone, naming the variable and never a value.
func TestAWSVariablesAreTrimmedAndBlanksRefused(t *testing.T) {
	t.Parallel()
	c, err := fnenv.AWSConfig(lookupIn(map[string]string{
		"AWS_REGION": "eu-west-1 ", "AWS_ACCESS_KEY_ID": " ASIAEXAMPLE", "AWS_SECRET_ACCESS_KEY": "wJalrXUtnFEMI-example\n",
		"AWS_SESSION_TOKEN": "\ttoken-example", "AWS_ENDPOINT_URL": " http://localhost:4566 ",
	}))
	require.NoError(t, err)
	require.Equal(t, "eu-west-1", c.Region)
	require.Equal(t, "http://localhost:4566", *c.BaseEndpoint)
	creds, err := c.Credentials.Retrieve(context.Background())
	require.NoError(t, err)
	require.Equal(t, "ASIAEXAMPLE", creds.AccessKeyID)
	require.Equal(t, "wJalrXUtnFEMI-example", creds.SecretAccessKey)
	require.Equal(t, "token-example", creds.SessionToken)

	good := map[string]string{
		"AWS_REGION": "eu-west-1", "AWS_DEFAULT_REGION": "us-east-1", "AWS_ACCESS_KEY_ID": "ASIAEXAMPLE",
		"AWS_SECRET_ACCESS_KEY": "wJalrXUtnFEMI-example", "AWS_SESSION_TOKEN": "token-example",
	}
	for _, name := range []string{"AWS_REGION", "AWS_DEFAULT_REGION", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL"} {
		vars := map[string]string{}
		for k, v := range good {
			vars[k] = v
		}
		vars[name] = " \t"
		if name == "AWS_DEFAULT_REGION" {
			delete(vars, "AWS_REGION")
		}
		_, err := fnenv.AWSConfig(lookupIn(vars))
		require.ErrorContains(t, err, name+" is set to blanks only", name)
		require.NotContains(t, err.Error(), "wJalrXUtnFEMI", name)
		require.NotContains(t, err.Error(), "token-example", name)
	}
}

// A function's init error goes to CloudWatch Logs: a DATABASE_URL whose
// password holds an unescaped '@' is refused without a word of the password,
// which pgx would otherwise read partly as the host.
func TestTheInitErrorNeverCarriesThePassword(t *testing.T) {
	t.Parallel()
	_, err := fnenv.Load(context.Background(), lookupIn(map[string]string{
		"DATABASE_URL": "postgres://sweeper:Xy@9kLmNpQ@10.0.0.5:5432/archive",
	}), io.Discard, io.Discard)
	require.ErrorContains(t, err, "DATABASE_URL")
	require.ErrorContains(t, err, "percent-encode")
	require.NotContains(t, err.Error(), "9kLmNpQ")
}

// A URL's pool_min_conns is checked against the pool a function runs with
// (DefaultMaxConns, 2), not the database package's default (4): checked
// against 4, pool_min_conns=3 passed the init and failed every invocation.
func TestPoolSettingsAreCheckedAgainstTheFunctionsPool(t *testing.T) {
	t.Parallel()
	load := func(query, maxConns string) (*fnenv.Env, error) {
		return fnenv.Load(context.Background(), func(k string) string {
			switch k {
			case "DATABASE_URL":
				return "postgres://u:pw@127.0.0.1:1/db?" + query
			case "DATABASE_MAX_CONNS":
				return maxConns
			}
			return ""
		}, io.Discard, io.Discard)
	}
	for _, q := range []string{"pool_min_conns=3", "pool_min_idle_conns=4"} {
		_, err := load(q, "")
		require.ErrorContains(t, err, "DATABASE_URL", q)
		require.ErrorContains(t, err, "DATABASE_MAX_CONNS, 2)", q)
		require.NotContains(t, err.Error(), "pw", q)
	}
	env, err := load("pool_min_conns=2", "")
	require.NoError(t, err)
	require.EqualValues(t, fnenv.DefaultMaxConns, env.Settings.Database.MaxConns)
	// A pool size that is set is the one checked against, and kept.
	env, err = load("pool_min_conns=3", "3")
	require.NoError(t, err)
	require.EqualValues(t, 3, env.Settings.Database.MaxConns)
}
