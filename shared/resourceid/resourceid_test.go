package resourceid_test

import (
	"context"
	"strings"
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
		"id\xff":    "is not UTF-8 text without NUL bytes",
		"data.\xc3": "is not UTF-8 text without NUL bytes",
		"id\x00":    "is not UTF-8 text without NUL bytes",
		"a\x00b.id": "is not UTF-8 text without NUL bytes",
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
		`{"id": "first", "data": {"id": "x"}, "id": {"id": "last"}}`,
		`{"data": [{"id": "a"}, {"id": "b"}, {"id": "c"}], "data": [{"id": "z"}]}`,
		`{"id": "n", "x": 1e1000}`,
		`{"data": [1, [2, {"id": "skip"}], {"id": "third"}]}`,
		// Deeper than encoding/json decodes (10,000 levels); jsonb holds it.
		`{"id": "deep", "x": ` + strings.Repeat("[", 10001) + strings.Repeat("]", 10001) + `}`,
		`[` + strings.Repeat(`{"a":`, 10001) + `1` + strings.Repeat("}", 10001) + `, {"id": "after"}]`,
	}
	paths := [][]string{
		{"id"}, {"data", "0", "id"}, {"data", "1", "id"}, {"data", "-1", "id"}, {"data", "-2", "id"},
		{"data", "-3", "id"}, {"data", "2", "id"}, {"data", "+1", "id"}, {"data", "01", "id"},
		{"data", "1e0", "id"}, {"data", "0x1", "id"}, {"data", "2147483648", "id"}, {"data", "-2147483649", "id"},
		{"0", "id"}, {"-1", "id"}, {"data", "0", "0", "id"}, {"data", "-1", "-1", "id"}, {"1"}, {"data", "1"},
		{"data", "-1"}, {"id", "x"}, {"", "id"},
	}
	for _, doc := range docs {
		for _, path := range paths {
			var want *string
			err := db.Pool.QueryRow(context.Background(),
				`SELECT CASE WHEN jsonb_typeof($1::jsonb #> $2::text[]) = 'string' THEN $1::jsonb #>> $2::text[] END`, doc, path).Scan(&want)
			require.NoError(t, err, "%.80s %q", doc, path)
			got, ok := resourceid.Find([]byte(doc), path)
			if want == nil {
				require.False(t, ok, "%.80s %q: found %q, jsonb finds nothing", doc, path, got)
				continue
			}
			require.True(t, ok, "%.80s %q: jsonb finds %q", doc, path, *want)
			require.Equal(t, *want, got, "%.80s %q", doc, path)
		}
	}
}

// A body whose first JSON value does not parse has no id, even where the
// path's member comes before the fault; what follows a whole first value
// is not read.
func TestFindOnBrokenDocuments(t *testing.T) {
	t.Parallel()
	for doc, want := range map[string]bool{
		`{"id": "ch_1", "x": }`:        false,
		`{"id": "ch_1", "x": [1, 2}`:   false,
		`{"id": "ch_1"`:                false,
		`{"id": "ch_1", "x": "\q"}`:    false,
		`{"id": "ch_1"} trailing {`:    true,
		`{"id": "ch_1"}{"id": "ch_2"}`: true,
		`{"id": "ch_1", "id"}`:         false,
		``:                             false,
		`"ch_1"`:                       false,
	} {
		got, ok := resourceid.Find([]byte(doc), []string{"id"})
		require.Equal(t, want, ok, "%q", doc)
		if want {
			require.Equal(t, "ch_1", got, "%q", doc)
		}
	}
}
