package archive

import "context"

// Exported for the plan tests in archive_test.

const (
	LookupSQL = lookupSQL
	QuerySQL  = querySQL
)

func EarliestExpiry(r *Reader, key string) any {
	t, err := r.earliestExpiry(context.Background(), key)
	if err != nil {
		panic(err)
	}
	return t
}

func QueryArgs(r *Reader, q Query) []any {
	args, _, err := r.queryArgs(q)
	if err != nil {
		panic(err)
	}
	return args
}
