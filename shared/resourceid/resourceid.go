// Package resourceid reads the dotted JSON path that names a response's
// resource id ("id", "data.charge.id"): the middleware records the id it
// names at completion, and the sweeper archives it.
package resourceid

import (
	"fmt"
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
