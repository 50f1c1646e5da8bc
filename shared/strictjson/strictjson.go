// Package strictjson reads JSON objects that must mean exactly what their
// sender wrote. encoding/json is lenient in three ways that can turn one
// request into another:
//   - it replaces bytes that are not UTF-8, and escapes of unpaired UTF-16
//     surrogates ("\ud800"), with U+FFFD, so two different keys can decode
//     to the same string;
//   - it keeps the last of a member given twice;
//   - it matches member names regardless of case, so {"scoped_key": "a",
//     "SCOPED_KEY": "b"} is read as "b".
//
// Decode refuses all three; Members refuses the last two.
package strictjson

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"reflect"
	"strings"
	"unicode"
	"unicode/utf16"
	"unicode/utf8"
)

// ErrLossy is returned for a document encoding/json would not read as
// written: bytes that are not UTF-8, or an unpaired surrogate escape.
var ErrLossy = errors.New("JSON that is not valid UTF-8 or has an unpaired surrogate escape")

// DuplicateError is a member given twice, in spellings encoding/json takes
// for one.
type DuplicateError struct{ First, Second string }

func (e *DuplicateError) Error() string {
	return fmt.Sprintf("%q and %q name the same member: give it once", e.First, e.Second)
}

// Lossless reports ErrLossy (wrapped with where) for data that
// encoding/json would change while decoding it.
func Lossless(data []byte) error {
	if !utf8.Valid(data) {
		return fmt.Errorf("%w: it has bytes that are not UTF-8", ErrLossy)
	}
	for i := 0; i < len(data); i++ {
		if data[i] != '\\' {
			continue
		}
		// Outside strings a backslash is not JSON at all, which the
		// decoding refuses anyway; inside one, it starts an escape, whose
		// next byte is never read as the start of another.
		i++
		if i >= len(data) || data[i] != 'u' {
			continue
		}
		r, ok := hex4(data[i+1:])
		if !ok {
			continue // a malformed escape: the decoding refuses it
		}
		i += 4
		switch {
		case utf16.IsSurrogate(r) && r < 0xdc00:
			// A high surrogate stands only before a low one.
			if len(data) > i+2 && data[i+1] == '\\' && data[i+2] == 'u' {
				if lo, ok := hex4(data[i+3:]); ok && lo >= 0xdc00 && lo <= 0xdfff {
					i += 6
					continue
				}
			}
			return fmt.Errorf("%w: \\u%04x is not followed by a low surrogate", ErrLossy, r)
		case utf16.IsSurrogate(r):
			return fmt.Errorf("%w: \\u%04x follows no high surrogate", ErrLossy, r)
		}
	}
	return nil
}

func hex4(b []byte) (rune, bool) {
	if len(b) < 4 {
		return 0, false
	}
	var r rune
	for _, c := range b[:4] {
		switch {
		case '0' <= c && c <= '9':
			c -= '0'
		case 'a' <= c && c <= 'f':
			c = c - 'a' + 10
		case 'A' <= c && c <= 'F':
			c = c - 'A' + 10
		default:
			return 0, false
		}
		r = r<<4 | rune(c)
	}
	return r, true
}

// Members returns the names of a JSON object's members, refusing a name
// given twice, in the same spelling or in two that encoding/json matches
// alike (regardless of case) with a *DuplicateError. A value that is not an
// object gives no names and no error: the decoding that follows refuses it.
func Members(object []byte) ([]string, error) {
	dec := json.NewDecoder(bytes.NewReader(object))
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return nil, nil
	}
	var names []string
	// By folded name: a payload of a million members is checked in one
	// pass, not a million times a million comparisons.
	seen := map[string]string{}
	for dec.More() {
		t, err := dec.Token()
		if err != nil {
			return nil, fmt.Errorf("not a JSON object: %w", err)
		}
		name, _ := t.(string)
		folded := fold(name)
		if first, ok := seen[folded]; ok {
			return nil, &DuplicateError{first, name}
		}
		seen[folded] = name
		names = append(names, name)
		var skip json.RawMessage
		if err := dec.Decode(&skip); err != nil {
			return nil, fmt.Errorf("not a JSON object: %w", err)
		}
	}
	return names, nil
}

// Decode decodes the JSON object data into the struct v points to. It
// refuses a value that is not an object (null included), what Lossless and
// Members refuse, a member whose name matches one
// of v's fields only regardless of case, and, when known is true, a member
// that names none of v's fields. Only the object's own members are checked,
// not those of objects nested in it: decode those from json.RawMessage
// fields with Decode again.
func Decode(data []byte, v any, known bool) error {
	if err := Lossless(data); err != nil {
		return err
	}
	names, err := Members(data)
	if err != nil {
		return err
	}
	fields := FieldNames(v)
	for _, n := range names {
		for _, f := range fields {
			if n != f && strings.EqualFold(n, f) {
				return fmt.Errorf("member %q is spelt %q", n, f)
			}
		}
	}
	// encoding/json decodes a null into a struct as nothing at all: the
	// zero value, and no error. Not an object, so refused as [] or 1 are.
	if bytes.Equal(bytes.TrimSpace(data), []byte("null")) {
		return errors.New("null is not a JSON object")
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	if known {
		dec.DisallowUnknownFields()
	}
	if err := dec.Decode(v); err != nil {
		return err
	}
	if _, err := dec.Token(); err != io.EOF {
		return errors.New("data after the JSON object")
	}
	return nil
}

// FieldNames returns the JSON names of the fields of the struct v points
// to (or is).
func FieldNames(v any) []string {
	t := reflect.TypeOf(v)
	for t != nil && t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t == nil || t.Kind() != reflect.Struct {
		return nil
	}
	var names []string
	for f := range t.Fields() {
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		switch {
		case name == "-" || !f.IsExported():
			continue
		case name == "":
			name = f.Name
		}
		names = append(names, name)
	}
	return names
}

// fold maps s to one spelling of every string strings.EqualFold takes for
// it: each rune to the smallest of its simple case folding orbit ('K', 'k'
// and the Kelvin sign to 'K'; 'S', 's' and 'ſ' to 'S').
func fold(s string) string {
	var b strings.Builder
	b.Grow(len(s))
	for _, r := range s {
		least := r
		for f := unicode.SimpleFold(r); f != r; f = unicode.SimpleFold(f) {
			least = min(least, f)
		}
		b.WriteRune(least)
	}
	return b.String()
}

// Kind names, in JSON's terms, the value a Go type decodes from: for
// messages about a json.UnmarshalTypeError that must not name Go's types.
// A whole number must be written in digits: encoding/json refuses 1e2 and
// 100.0 for an integer.
func Kind(t reflect.Type) string {
	if t == nil {
		return "another value"
	}
	switch t.Kind() {
	case reflect.String:
		return "a string"
	case reflect.Bool:
		return "a boolean"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "a whole number in range, in digits"
	case reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.Slice, reflect.Array:
		return "an array"
	case reflect.Map, reflect.Struct:
		return "an object"
	case reflect.Pointer:
		return Kind(t.Elem())
	}
	return "another value"
}
