// Package resourceid reads the dotted JSON path that names a response's
// resource id ("id", "data.charge.id"): the middleware records the id it
// names at completion, and the sweeper archives it.
package resourceid

import (
	"fmt"
	"strconv"
	"strings"
)

// SplitPath returns path's segments, refusing a path that names no key of
// any response: an empty segment ("data..id", "id.", "") or a segment with
// spaces around it ("data. id", a trailing newline from an env file). Such
// a path would otherwise leave every recorded and archived resource id
// null without a word, and late retries answered without it.
func SplitPath(path string) ([]string, error) {
	segs := strings.Split(path, ".")
	for _, seg := range segs {
		switch {
		case seg == "":
			return nil, fmt.Errorf("resource id path %q has an empty segment", path)
		case strings.TrimSpace(seg) != seg:
			return nil, fmt.Errorf("resource id path %q has a segment with spaces around it", path)
		}
	}
	return segs, nil
}

// Find returns the string at path in v (a JSON document decoded into any,
// objects as map[string]any), as PostgreSQL's jsonb #>> reads the one the
// sweeper archives: a segment names an object's member, or an array's
// element by its index (negative from the end, "+1" and "01" as 1); a path
// that leads nowhere, or to anything but a string, finds nothing. Before
// the sweep and after it, a retry is answered with the same id.
func Find(v any, path []string) (string, bool) {
	for _, seg := range path {
		switch x := v.(type) {
		case map[string]any:
			v = x[seg]
		case []any:
			// PostgreSQL reads the index with strtol, base 10, as a
			// 32-bit integer; SplitPath has refused blanks around it.
			i, err := strconv.ParseInt(seg, 10, 32)
			if err != nil {
				return "", false
			}
			if i < 0 {
				i += int64(len(x))
			}
			if i < 0 || i >= int64(len(x)) {
				return "", false
			}
			v = x[i]
		default:
			return "", false
		}
	}
	s, ok := v.(string)
	return s, ok
}
