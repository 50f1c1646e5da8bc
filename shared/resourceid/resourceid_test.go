package resourceid_test

import (
	"testing"

	"github.com/stretchr/testify/require"

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
