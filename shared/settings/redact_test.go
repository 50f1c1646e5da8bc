package settings_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/idemarchive/idemarchive/shared/settings"
)

// A connection string pasted into the wrong variable is echoed by that
// variable's error; the init line a function prints (fnenv.MustLoad) goes
// through Redact, which hides its password, in the URL and key=value forms.
func TestRedactHidesAConnectionStringPastedIntoAnotherVariable(t *testing.T) {
	t.Parallel()
	for name, value := range map[string]string{
		"DATABASE_EXEC_MODE":      "postgres://u:S3cr%40t pw@h/db",
		"METRICS_NAMESPACE":       "postgresql://u:S3cr%40t@h/db?sslmode=require",
		"SWEEP_MISSING_PARTITION": "host=h user=u password='S3cr%40t pw'",
		"CLOCK_SKEW":              "host=h PASSWORD = S3cr%40t",
	} {
		_, err := settings.FromEnv(func(k string) string {
			switch k {
			case "DATABASE_URL":
				return "postgres://127.0.0.1:1/db"
			case name:
				return value
			}
			return ""
		})
		require.Error(t, err, name)
		require.Contains(t, err.Error(), name)
		line := settings.Redact(err.Error())
		require.NotContains(t, strings.ToLower(line), "s3cr", name)
		require.Contains(t, line, name, "the line still names the variable")
	}
	require.Equal(t, "unknown mode \"x\"", settings.Redact("unknown mode \"x\""))
}

// The RDS-generated secret (the JSON DATABASE_SECRET_ARN names) pasted into
// a variable in place of its ARN: the init line does not carry its
// password, and DATABASE_SECRET_ARN itself refuses it without echoing it.
func TestRedactHidesASecretsJSONPastedIntoAVariable(t *testing.T) {
	t.Parallel()
	secret := `{"username":"admin","password":"S3cretPw42","engine":"postgres","host":"db.example.com","port":5432,"dbname":"app"}`
	for _, name := range []string{"DATABASE_SECRET_ARN", "DATABASE_URL", "DATABASE_EXEC_MODE", "METRICS_NAMESPACE", "SWEEP_MISSING_PARTITION"} {
		_, err := settings.FromEnv(func(k string) string {
			switch k {
			case name:
				return secret
			case "DATABASE_URL":
				return "postgres://127.0.0.1:1/db"
			}
			return ""
		})
		require.Error(t, err, name)
		require.Contains(t, err.Error(), name)
		line := settings.Redact(err.Error())
		require.NotContains(t, line, "S3cretPw42", name)
		require.Contains(t, line, name, "the line still names the variable")
	}
	_, err := settings.FromEnv(func(k string) string {
		return map[string]string{"DATABASE_SECRET_ARN": secret, "DATABASE_URL": "postgres://127.0.0.1:1/db"}[k]
	})
	require.NotContains(t, err.Error(), "S3cretPw42", "refused without being echoed, before any redaction")
	for _, id := range []string{"arn:aws:secretsmanager:eu-west-1:123456789012:secret:rds!db-1a2b-AbCdEf", "prod/idemarchive/db"} {
		_, err := settings.FromEnv(func(k string) string {
			return map[string]string{"DATABASE_SECRET_ARN": id, "DATABASE_URL": "postgres://127.0.0.1/app"}[k]
		})
		require.NoError(t, err, "%s: %v", id, err)
	}
	for _, line := range []string{`x: "password": "S3cretPw42"}`, `x: {\"Password\":\"S3cretPw42\"}`, `"masterPassword" :"S3cretPw42"`,
		`x: {'username': 'admin', 'password': 'S3cretPw42'}`, `x: password: S3cretPw42`, `x: {password: "S3cretPw42"}`} {
		require.NotContains(t, settings.Redact(line), "S3cretPw42", line)
	}
}

// pgx decodes a URL query's keys (pass%77ord is password), so a password
// given under a percent-encoded key is hidden as ?password= is: any query
// key written with a percent-escape has its value hidden.
func TestRedactHidesAValueUnderAPercentEncodedKey(t *testing.T) {
	t.Parallel()
	const pw = "Sup3rS3cretPw"
	for _, line := range []string{
		`SWEEP_MISSING_PARTITION: want create or fail, got "postgres://db.example.com/app?pass%77ord=` + pw + `"`,
		`SWEEP_MISSING_PARTITION: want create or fail, got "postgres://db.example.com/app?sslmode=verify-full&%70assword=` + pw + `"`,
		`DATABASE_MAX_CONNS: not a whole number: "postgres://app@db.example.com/app?pass%77ord=` + pw + `&sslmode=verify-full"`,
	} {
		require.NotContains(t, settings.Redact(line), pw, line)
	}
	require.Equal(t, "a value with 100% in it", settings.Redact("a value with 100% in it"), "no query key, nothing hidden")
}

// libpq and pgx trim space, \t, \n, \r, \v and \f around a key, so
// "password<TAB>=pw" is a password; an echo with %q writes the blank as
// `\t`, which must not get the password past Redact, in the key=value form
// or a secret's JSON, echoed once or twice.
func TestRedactHidesAPasswordAfterAnEscapedBlank(t *testing.T) {
	t.Parallel()
	const pw = "S3cretPw42"
	for _, blank := range []string{"\t", "\n", "\v", "\r", "\f", " \t "} {
		conn := "host=db.example.com user=app password" + blank + "=" + pw + " dbname=app"
		cfg, err := pgconn.ParseConfig(conn)
		require.NoError(t, err)
		require.Equal(t, pw, cfg.Password, "pgx reads %q as a password", conn)
		for _, name := range []string{"SWEEP_MISSING_PARTITION", "CLOCK_SKEW", "DATABASE_MAX_CONNS", "METRICS_NAMESPACE"} {
			_, err := settings.FromEnv(func(k string) string {
				switch k {
				case "DATABASE_URL":
					return "postgres://127.0.0.1:1/db"
				case name:
					return conn
				}
				return ""
			})
			require.Error(t, err, name)
			line := settings.Redact(err.Error())
			require.NotContains(t, line, pw, "%s with blank %q: %s", name, blank, line)
			require.Contains(t, line, name, "the line still names the variable")
			twice := settings.Redact(fmt.Sprintf("%q", err.Error()))
			require.NotContains(t, twice, pw, "echoed twice: %s", twice)
		}
		json := `{"username":"app","password"` + blank + `:"` + pw + `"}`
		require.NotContains(t, settings.Redact(fmt.Sprintf("x: %q", json)), pw, json)
		require.NotContains(t, settings.Redact(json), pw, json)
	}
	require.Equal(t, `mode "password_hint"`, settings.Redact(`mode "password_hint"`), "a word that only starts like the key")
}
