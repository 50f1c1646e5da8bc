package sweep_test

import (
	"context"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemarchive/idemarchive/shared/dbtest"
	"github.com/idemarchive/idemarchive/shared/idempotency"
	"github.com/idemarchive/idemarchive/shared/sweep"
)

// The archive keeps a resource id forever, and answers carry it (a lookup
// through the lookup function's 6 MB response included): the middleware
// keeps none longer than idempotency.MaxResourceIDBytes. Rows of other
// writers (an id at the JSON path of their jsonb response, or in the
// resource_id column) are held to the same bound by the sweeper, in bytes
// as the middleware counts them: a longer id is archived as NULL, like a
// missing one, and the row still moves.
func TestAResourceIDTooLongForTheArchiveIsNotKept(t *testing.T) {
	t.Parallel()
	require.Equal(t, idempotency.MaxResourceIDBytes, sweep.MaxResourceIDBytes, "the sweeper and the middleware keep the same ids")
	b := setup(t)
	ctx := context.Background()
	atLimit := strings.Repeat("x", sweep.MaxResourceIDBytes)
	multibyteAtLimit := strings.Repeat("€", sweep.MaxResourceIDBytes/3) // 3 bytes a character
	for _, tc := range []struct {
		key, response string
		column        *string
	}{
		{key: "idem:v1:json-at-limit", response: `{"id":"` + atLimit + `"}`},
		{key: "idem:v1:json-multibyte-at-limit", response: `{"id":"` + multibyteAtLimit + `"}`},
		{key: "idem:v1:json-over", response: `{"id":"` + atLimit + `y"}`},
		{key: "idem:v1:json-multibyte-over", response: `{"id":"` + multibyteAtLimit + `€"}`},
		{key: "idem:v1:json-8mib", response: `{"id":"` + strings.Repeat("z", 8<<20) + `"}`},
		{key: "idem:v1:column-at-limit", column: ptr(atLimit)},
		{key: "idem:v1:column-over", column: ptr(atLimit + "y"), response: `{"id":"ch_short"}`},
	} {
		var response *string
		if tc.response != "" {
			response = &tc.response
		}
		_, err := b.db.Pool.Exec(ctx, `INSERT INTO idempotency_keys (scoped_key, fingerprint, state, status_code, response, resource_id, created_at, expires_at)
			VALUES ($1, $2, 'completed', 201, $3::jsonb, $4, now() - interval '25 hours', now() - interval '1 hour')`,
			tc.key, dbtest.Fingerprint(tc.key), response, tc.column)
		require.NoError(t, err, tc.key)
	}

	res, err := newSweeper(t, b.sweeper, sweep.Config{}, nil, nil).Run(ctx)

	require.NoError(t, err)
	require.EqualValues(t, 7, res.Moved, "every row moves, whatever its id")
	require.EqualValues(t, 7, res.Archived)
	require.Equal(t, ptr(atLimit), archiveRow(t, b.db.Pool, "idem:v1:json-at-limit").ResourceID)
	require.Equal(t, ptr(multibyteAtLimit), archiveRow(t, b.db.Pool, "idem:v1:json-multibyte-at-limit").ResourceID)
	require.Equal(t, ptr(atLimit), archiveRow(t, b.db.Pool, "idem:v1:column-at-limit").ResourceID)
	for _, key := range []string{"idem:v1:json-over", "idem:v1:json-multibyte-over", "idem:v1:json-8mib", "idem:v1:column-over"} {
		require.Nil(t, archiveRow(t, b.db.Pool, key).ResourceID, "%s: an id longer than the middleware keeps is not archived", key)
	}
}
