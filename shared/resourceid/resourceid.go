// Package resourceid reads the dotted JSON path that names a response's
// resource id ("id", "data.charge.id"): the middleware records the id it
// names at completion, and the sweeper archives it.
package resourceid

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"
)

// SplitPath returns path's segments, refusing a path that names no key of
// any response: an empty segment ("data..id", "id.", "") or a segment with
// spaces around it ("data. id", a trailing newline from an env file), or
// one PostgreSQL text cannot hold (invalid UTF-8, a NUL byte). Such
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
		case !utf8.ValidString(seg) || strings.IndexByte(seg, 0) >= 0:
			// PostgreSQL text cannot hold it: every sweep batch would
			// fail on the path.
			return nil, fmt.Errorf("resource id path %q is not UTF-8 text without NUL bytes", path)
		}
	}
	return segs, nil
}

// Find returns the string at path in the JSON document body, as
// PostgreSQL's jsonb #>> reads the one the sweeper archives: a segment names
// an object's member (the last of duplicates, as jsonb keeps it), or an
// array's element by its index (negative from the end, "+1" and "01" as 1);
// a path that leads nowhere, or to anything but a string, finds nothing, as
// does a body whose first JSON value does not parse. Before the sweep and
// after it, a retry is answered with the same id.
//
// The document is read token by token, never decoded whole:
// encoding/json refuses a value nested over 10,000 levels deep, which jsonb
// holds, and only the members on the path are kept. Numbers are read as
// text, so one no float can hold (1e1000000) does not hide the id.
func Find(body []byte, path []string) (string, bool) {
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	s, ok, err := find(dec, path)
	if err != nil {
		return "", false
	}
	return s, ok
}

// find reads the next value from dec, whole (a syntax error anywhere in it
// is an error), and returns the string at path in it.
func find(dec *json.Decoder, path []string) (string, bool, error) {
	tok, err := dec.Token()
	if err != nil {
		return "", false, err
	}
	open, isOpen := tok.(json.Delim)
	if !isOpen {
		s, isString := tok.(string)
		return s, isString && len(path) == 0, nil
	}
	if len(path) == 0 {
		return "", false, skip(dec, 1)
	}
	seg, rest := path[0], path[1:]
	var s string
	var ok bool
	switch open {
	case '{':
		for dec.More() {
			key, err := dec.Token()
			if err != nil {
				return "", false, err
			}
			if key == seg {
				// A later duplicate replaces what an earlier one found.
				if s, ok, err = find(dec, rest); err != nil {
					return "", false, err
				}
			} else if err := skip(dec, 0); err != nil {
				return "", false, err
			}
		}
	case '[':
		// PostgreSQL reads the index with strtol, base 10, as a 32-bit
		// integer; SplitPath has refused blanks around it.
		i, perr := strconv.ParseInt(seg, 10, 32)
		var found []result // every element's, for an index from the end
		for n := int64(0); dec.More(); n++ {
			switch {
			case perr == nil && (i < 0 || n == i):
				s, ok, err := find(dec, rest)
				if err != nil {
					return "", false, err
				}
				if i >= 0 {
					return s, ok, skip(dec, 1)
				}
				found = append(found, result{s, ok})
			default:
				if err := skip(dec, 0); err != nil {
					return "", false, err
				}
			}
		}
		if j := int64(len(found)) + i; perr == nil && i < 0 && j >= 0 {
			s, ok = found[j].s, found[j].ok
		}
	}
	_, err = dec.Token() // the closing delimiter
	return s, ok, err
}

type result struct {
	s  string
	ok bool
}

// skip reads from dec to the end of the value it is in depth levels deep
// (0: the whole next value).
func skip(dec *json.Decoder, depth int) error {
	for {
		tok, err := dec.Token()
		if err != nil {
			return err
		}
		switch tok {
		case json.Delim('{'), json.Delim('['):
			depth++
		case json.Delim('}'), json.Delim(']'):
			depth--
		}
		if depth == 0 {
			return nil
		}
	}
}
