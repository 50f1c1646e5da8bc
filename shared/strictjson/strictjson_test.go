package strictjson_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemarchive/idemarchive/shared/strictjson"
)

func TestLosslessRefusesWhatJSONWouldReplace(t *testing.T) {
	t.Parallel()
	for _, doc := range []string{
		"\"\xff\"",
		"\"\xe2\x82\"",
		"\"\xed\xa0\x80\"", // a surrogate written in UTF-8
		`"\ud800"`,
		`"\uDBFF"`,
		`"\udc00"`,
		`"\ud83d\u0041"`,
		`"\ud83d\ud83d\ude00"`,
		`"\ud83d"`,
		`"\ud83d\`,
		`"\\\ud800"`,
	} {
		require.ErrorIs(t, strictjson.Lossless([]byte(doc)), strictjson.ErrLossy, doc)
	}
	for _, doc := range []string{
		`"plain"`,
		`"\ud83d\ude00"`,
		`"\uD83D\uDE00"`,
		`"\\ud800"`, // an escaped backslash, then "ud800"
		`"\\\\ud800"`,
		`"\ufffd"`,
		"\"\uFFFD\"",
		`"\u00e9\"\\"`,
		`"\u12"`, // malformed: left to the decoding, which refuses it
	} {
		require.NoError(t, strictjson.Lossless([]byte(doc)), doc)
	}
}

// Whatever passes Lossless decodes with no more U+FFFD than it wrote.
func FuzzLossless(f *testing.F) {
	for _, seed := range []string{`"\ud800"`, `"\ud83d\ude00"`, "\"\xff\"", `"\\\ud800"`, `"\ufffd"`, `"a\\"`} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, doc []byte) {
		var s string
		if strictjson.Lossless(doc) != nil || json.Unmarshal(doc, &s) != nil {
			return
		}
		written := strings.Count(string(doc), "\uFFFD") + strings.Count(strings.ToLower(string(doc)), `\ufffd`)
		if got := strings.Count(s, "\uFFFD"); got > written {
			t.Fatalf("%q passed and decoded to %q, with %d U+FFFD for %d written", doc, s, got, written)
		}
	})
}

type options struct {
	Key    string `json:"scoped_key"`
	Action string `json:"action,omitempty"`
	Skip   string `json:"-"`
	Plain  int
}

func TestDecodeRefusesMembersThatCouldBeReadTwoWays(t *testing.T) {
	t.Parallel()
	for doc, want := range map[string]string{
		`{"scoped_key":"a","scoped_key":"b"}`:              `"scoped_key" and "scoped_key" name the same member`,
		`{"scoped_key":"a","SCOPED_KEY":"b"}`:              `"scoped_key" and "SCOPED_KEY" name the same member`,
		"{\"scoped_key\":\"a\",\"\u017fcoped_key\":\"b\"}": "name the same member", // ſ folds to s
		`{"Scoped_Key":"a"}`:                               `member "Scoped_Key" is spelt "scoped_key"`,
		`{"plain":1}`:                                      `member "plain" is spelt "Plain"`,
		`{"scoped_key":"a","other":1}`:                     `unknown field "other"`,
		`{"scoped_key":"a"} {"scoped_key":"b"}`:            "data after the JSON object",
		`{"scoped_key":"a"}]`:                              "data after the JSON object",
		`{"scoped_key":"\udfff"}`:                          "unpaired surrogate",
		`null`:                                             "null is not a JSON object",
		" \n null \t":                                      "null is not a JSON object",
		`[]`:                                               "cannot unmarshal array",
		`"x"`:                                              "cannot unmarshal string",
		`1`:                                                "cannot unmarshal number",
	} {
		var v options
		err := strictjson.Decode([]byte(doc), &v, true)
		require.ErrorContains(t, err, want, doc)
	}
	var dup *strictjson.DuplicateError
	require.True(t, errors.As(strictjson.Decode([]byte(`{"action":"x","Action":"y"}`), &options{}, false), &dup))
	require.Equal(t, strictjson.DuplicateError{First: "action", Second: "Action"}, *dup)

	var v options
	require.NoError(t, strictjson.Decode([]byte(` {"scoped_key":"a","Plain":2,"extra":[1,{"scoped_key":1}]} `), &v, false))
	require.Equal(t, options{Key: "a", Plain: 2}, v)
	// A member named "-" is not the skipped field's.
	require.ErrorContains(t, strictjson.Decode([]byte(`{"-":"x"}`), &v, true), "unknown field")
}

// Members checks a payload of many members in one pass (a 6 MB direct
// payload holds about a million), and still finds two names alike only
// regardless of case, the Kelvin sign's K included.
func TestMembersOfALargeObjectAreCheckedInOnePass(t *testing.T) {
	t.Parallel()
	var b strings.Builder
	b.WriteString("{")
	for i := range 200_000 {
		fmt.Fprintf(&b, `"a%d":0,`, i)
	}
	b.WriteString(`"\u212a":1,"k":2}`)
	_, err := strictjson.Members([]byte(b.String()))
	var dup *strictjson.DuplicateError
	require.ErrorAs(t, err, &dup)
	require.Equal(t, strictjson.DuplicateError{First: "\u212a", Second: "k"}, *dup)
}
