package database_test

import (
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/idemarchive/idemarchive/shared/database"
)

// WithSearchPath sets search_path without re-encoding the rest: a password
// pgx reads but Go's net/url does not (archivebench re-encoded the URL with
// net/url, whose error quoted the whole URL, password included, on stderr)
// stays as it was, and an error never carries the string.
func TestWithSearchPathKeepsTheRestAndNeverEchoesIt(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ conn, password string }{
		{"postgres://u:Secret^pw42@127.0.0.1:5432/db", "Secret^pw42"},
		{"postgres://u:S{e}c|r`et[1]@127.0.0.1:5432/db?sslmode=disable", "S{e}c|r`et[1]"},
		{"postgresql://u:pw%40x@127.0.0.1/db?", "pw@x"},
		{"postgres://u:pw@127.0.0.1/db?search_path=theirs&sslmode=disable", "pw"},
		{"host=127.0.0.1 user=u password='a b\\'c' dbname=db", "a b'c"},
		{"host=127.0.0.1 user=u password=pw search_path=theirs", "pw"},
	} {
		for _, sp := range []string{"bench_01ab_sweep", `"Odd ""S.c", public`, `back\slash`} {
			out, err := database.WithSearchPath(tc.conn, sp)
			require.NoError(t, err, "%s / %s", tc.conn, sp)
			cfg, err := pgconn.ParseConfig(out)
			require.NoError(t, err)
			require.Equal(t, sp, cfg.RuntimeParams["search_path"], tc.conn)
			require.Equal(t, tc.password, cfg.Password, tc.conn)
			require.Equal(t, "127.0.0.1", cfg.Host, tc.conn)
		}
	}
	for _, bad := range []string{
		"postgres://u:Secret42@127.0.0.1:notaport/db",
		"host=127.0.0.1 password=Secret42 sslmode=sometimes",
	} {
		_, err := database.WithSearchPath(bad, "s")
		require.Error(t, err, bad)
		require.NotContains(t, err.Error(), "ret42", bad)
	}
}
