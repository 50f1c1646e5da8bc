package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// invoke -seed-probe connects before anything else; its errors never echo
// DATABASE_URL's password, in any of the spellings libpq reads (pgx's own
// parse errors hide only password=value), nor one folded into the user
// name.
func TestTheSeedProbeNeverEchoesThePassword(t *testing.T) {
	ev := filepath.Join(t.TempDir(), "ev.json")
	require.NoError(t, os.WriteFile(ev, []byte(`{}`), 0o644))
	for _, dsn := range []string{
		"host=/nonexistent port=abc password = hunter2secret",
		"host=/nonexistent port=abc password= hunter2secret",
		`host=/nonexistent port=abc password=hunter2\ secret`,
		"postgres://app%3Ahunter2secret@127.0.0.1:1/db",
		"host=127.0.0.1 port=1 connect_timeout=1 password = hunter2secret",
	} {
		t.Setenv("DATABASE_URL", dsn)
		var out, errb bytes.Buffer
		err := run(context.Background(), []string{"invoke", "-bootstrap", "/nonexistent", "-event", ev, "-seed-probe"}, &out, &errb)
		require.ErrorContains(t, err, "seed probe: ", dsn)
		require.NotContains(t, err.Error(), "secret", dsn)
		require.NotContains(t, out.String()+errb.String(), "secret", dsn)
	}
}
