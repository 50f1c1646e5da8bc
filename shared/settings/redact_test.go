package settings_test

import (
	"strings"
	"testing"

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
