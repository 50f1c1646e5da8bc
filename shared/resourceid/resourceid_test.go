package resourceid_test

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemarchive/idemarchive/shared/dbtest"
	"github.com/idemarchive/idemarchive/shared/resourceid"
)

func TestSplitPath(t *testing.T) {
	for path, want := range map[string][]string{
		"id":               {"id"},
		"data.charge.id":   {"data", "charge", "id"},
		"a b.c":            {"a b", "c"}, // a key may hold spaces inside
		"données.identité": {"données", "identité"},
	} {
		got, err := resourceid.SplitPath(path)
		require.NoError(t, err, path)
		require.Equal(t, want, got, path)
	}
	for path, want := range map[string]string{
		"":          "has an empty segment",
		".":         "has an empty segment",
		"data..id":  "has an empty segment",
		"id.":       "has an empty segment",
		".id":       "has an empty segment",
		" id":       "has a segment with spaces around it",
		"id\n":      "has a segment with spaces around it",
		"data. id":  "has a segment with spaces around it",
		"data.id\t": "has a segment with spaces around it",
	} {
		_, err := resourceid.SplitPath(path)
		require.ErrorContains(t, err, want, "%q", path)
	}
}

// Find reads a path as PostgreSQL's jsonb #> and #>> read it (the sweeper's
// archive statement), on the server itself: objects by member, arrays by
// index (negative from the end, signs and leading zeros, out of range),
// scalars and nulls on the way, duplicate members (the last wins), and
// only a string found.
func TestFindReadsAsJSONBDoes(t *testing.T) {
	t.Parallel()
	db := dbtest.New(t)
	docs := []string{
		`{"id": "ch_1"}`,
		`{"id": 12}`,
		`{"id": null}`,
		`{"id": {"x": "y"}}`,
		`{"id": "a", "id": "b"}`,
		`{"data": [{"id": "first"}, {"id": "second"}]}`,
		`{"data": {"0": {"id": "member"}}}`,
		`[{"id": "top"}]`,
		`"id"`,
		`{"data": [[{"id": "deep"}]], "1": "one"}`,
		`{"": {"id": "empty member"}}`,
		`{"data": ["s0", "s1"]}`,
	}
	paths := [][]string{
		{"id"}, {"data", "0", "id"}, {"data", "1", "id"}, {"data", "-1", "id"}, {"data", "-2", "id"},
		{"data", "-3", "id"}, {"data", "2", "id"}, {"data", "+1", "id"}, {"data", "01", "id"},
		{"data", "1e0", "id"}, {"data", "0x1", "id"}, {"data", "2147483648", "id"}, {"data", "-2147483649", "id"},
		{"0", "id"}, {"-1", "id"}, {"data", "0", "0", "id"}, {"data", "-1", "-1", "id"}, {"1"}, {"data", "1"},
		{"data", "-1"}, {"id", "x"}, {"", "id"},
	}
	for _, doc := range docs {
		var v any
		require.NoError(t, json.Unmarshal([]byte(doc), &v), doc)
		for _, path := range paths {
			var want *string
			err := db.Pool.QueryRow(context.Background(),
				`SELECT CASE WHEN jsonb_typeof($1::jsonb #> $2::text[]) = 'string' THEN $1::jsonb #>> $2::text[] END`, doc, path).Scan(&want)
			require.NoError(t, err, "%s %q", doc, path)
			got, ok := resourceid.Find(v, path)
			if want == nil {
				require.False(t, ok, "%s %q: found %q, jsonb finds nothing", doc, path, got)
				continue
			}
			require.True(t, ok, "%s %q: jsonb finds %q", doc, path, *want)
			require.Equal(t, *want, got, "%s %q", doc, path)
		}
	}
}
