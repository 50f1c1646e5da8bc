package schema_test

import (
	"context"
	"io"
	"log/slog"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemarchive/idemarchive/shared/dbtest"
	"github.com/idemarchive/idemarchive/shared/schema"
)

// A live table made by another tool whose constraint bears the name
// idempotency_keys_completed_has_status but states another rule (here the
// converse: a status only on completed rows) lets a completed row without a
// status in, which fails every sweep batch on the archive's NOT NULL. The
// shape check (Migrate's refusal, verify's intact check) reads the
// constraint's rule, not only its name.
func TestASameNamedStatusCheckWithAnotherRuleIsRefused(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	conn, _ := upgradedSchema(t, dbtest.New(t))
	_, err := conn.Exec(ctx, `CREATE TABLE idempotency_keys (
		scoped_key text COLLATE "C" PRIMARY KEY, fingerprint bytea NOT NULL, state text NOT NULL,
		status_code smallint, response jsonb, created_at timestamptz NOT NULL, expires_at timestamptz NOT NULL,
		CONSTRAINT idempotency_keys_completed_has_status CHECK (state = 'completed' OR status_code IS NULL))`)
	require.NoError(t, err)
	// The table lets through exactly the row the check exists to keep out.
	_, err = conn.Exec(ctx, `INSERT INTO idempotency_keys VALUES ('k', '\x00', 'completed', NULL, NULL, now(), now() + interval '1 hour')`)
	require.NoError(t, err)

	_, err = schema.Migrate(ctx, conn, slog.New(slog.NewTextHandler(io.Discard, nil)))
	require.ErrorIs(t, err, schema.ErrTableMismatch,
		"a same-named constraint with another rule was taken for migrate's; a completed row without a status now fails every sweep")
}
