package sweep

import (
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"
)

// A batch's failure to route a row to a partition is recognized by the
// fields PostgreSQL sets (SQLSTATE 23514, the archive's table name, no
// constraint), not by its English text: a server whose lc_messages is
// another language says it otherwise. A CHECK constraint's violation names
// its constraint and is not one.
func TestANoPartitionErrorIsRecognizedInAnyLanguage(t *testing.T) {
	t.Parallel()
	for name, tc := range map[string]struct {
		err  error
		want bool
	}{
		"English":            {&pgconn.PgError{Code: "23514", Message: `no partition of relation "idempotency_key_archive" found for row`, TableName: "idempotency_key_archive"}, true},
		"German":             {&pgconn.PgError{Code: "23514", Message: `keine Partition von Relation »idempotency_key_archive« für Zeile gefunden`, TableName: "idempotency_key_archive"}, true},
		"wrapped":            {fmt.Errorf("sweep batch: %w", &pgconn.PgError{Code: "23514", Message: "…", TableName: "idempotency_key_archive"}), true},
		"a CHECK constraint": {&pgconn.PgError{Code: "23514", Message: "violates check constraint", TableName: "idempotency_key_archive", ConstraintName: "status_check"}, false},
		"another table":      {&pgconn.PgError{Code: "23514", Message: "…", TableName: "idempotency_keys"}, false},
		"another SQLSTATE":   {&pgconn.PgError{Code: "23505", Message: `no partition of relation "x"`, TableName: "idempotency_key_archive"}, false},
	} {
		require.Equal(t, tc.want, isNoPartition(tc.err), name)
	}
}
