package archive

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5/pgtype"
)

// Exported for the plan tests in archive_test.

const (
	LookupSQL       = lookupSQL
	LookupWindowSQL = lookupWindowSQL
	QuerySQL        = querySQL
	MaxWindowMonths = maxWindowMonths
)

// LookupStatement returns the statement Lookup runs against the archive for
// key (when the writers' proof holds); "" when the key is known to have no
// archive row.
func LookupStatement(r *Reader, key string) (string, []any) {
	e, err := r.settledRange(context.Background(), key)
	if err != nil {
		panic(err)
	}
	if !e.earliest.Valid {
		return "", nil
	}
	st := lookupStatement(key, e.earliest, e.latest, r.cfg.Now())
	return st.SQL, st.Args
}

// WindowStatement is lookupStatement, for its boundary tests.
func WindowStatement(key string, earliest, latest pgtype.Timestamptz, now time.Time) (string, []any) {
	st := lookupStatement(key, earliest, latest, now)
	return st.SQL, st.Args
}

// ExpiryRange returns the bounds Lookup passes to LookupSQL for key; nil
// when the key is known to have no archive row.
func ExpiryRange(r *Reader, key string) []any {
	e, err := r.settledRange(context.Background(), key)
	if err != nil {
		panic(err)
	}
	if !e.earliest.Valid {
		return nil
	}
	return []any{e.earliest, e.latest}
}

func QueryArgs(r *Reader, q Query) []any {
	inv, err := r.investigation(q)
	if err != nil {
		panic(err)
	}
	return inv.args(r.cfg.MaxLiveTTL)
}

// DecodeCursor and EncodeCursor are exported for the cursor fuzz test.
func DecodeCursor(s string) (key string, expired time.Time, err error) {
	c, err := decodeCursor(s)
	return c.Key, c.ExpiredAt, err
}

// EncodeCursor encodes a cursor of some query (a query id of the length
// queryID gives); EncodeCursorOf names the query id.
func EncodeCursor(key string, expired time.Time) string {
	return EncodeCursorOf(key, expired, "0123456789abcdef")
}

func EncodeCursorOf(key string, expired time.Time, query string) string {
	return encodeCursor(cursor{Key: key, ExpiredAt: expired, Query: query})
}
