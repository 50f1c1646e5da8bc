package archive

// Exported for the plan tests in archive_test.

const (
	LookupSQL = lookupSQL
	QuerySQL  = querySQL
)

func EarliestExpiry(r *Reader, key string) any { return r.earliestExpiry(key) }

func QueryArgs(r *Reader, q Query) []any {
	args, _, err := r.queryArgs(q)
	if err != nil {
		panic(err)
	}
	return args
}
