package main

import (
	"strings"
	"testing"
	"unicode"

	"github.com/stretchr/testify/assert"
)

// An argument echoed in an error line has any connection string's user and
// password replaced by REDACTED, the unknown command's too: an operator who
// types `archivectl "$DATABASE_URL" migrate` must not find the password in
// the terminal or a CI log.
func TestTheUnknownCommandLineRedactsConnectionStrings(t *testing.T) {
	for _, arg := range []string{
		"postgres://app:s3cret@db.example:5432/app",
		"host=db password=s3cret",
		"redis://:s3cret@cache:6379/0",
	} {
		r := cli(t, nil, map[string]string{"DATABASE_URL": ""}, arg, "migrate")
		t.Logf("%q -> exit %d stderr %q", arg, r.code, r.stderr)
		assert.Equal(t, exitError, r.code)
		assert.NotContains(t, r.stderr, "s3cret", arg)
		assert.Contains(t, r.stderr, "REDACTED", arg)
	}
}

// The flag package echoes a mistyped flag unquoted: a terminal escape in it
// must not reach the operator's terminal or a CI log as one.
func TestFlagErrorsEscapeControlCharacters(t *testing.T) {
	for _, args := range [][]string{
		{"lookup", "--x\x1b[2Jy", "k"},
		{"lookup", "---\x1b]0;owned\x07", "k"},
		{"sweep", "-=\x1b[31m"},
		{"lookup", "--x\x9b2Jy", "k"},  // a lone C1 CSI byte, no UTF-8
		{"sweep", "-\u009b31m\x1b[0m"}, // C1 CSI as UTF-8, and ESC
	} {
		r := cli(t, nil, map[string]string{"DATABASE_URL": ""}, args...)
		t.Logf("%q -> exit %d stderr %q", args, r.code, r.stderr)
		assert.Equal(t, exitError, r.code)
		line := strings.TrimSuffix(r.stderr, "\n")
		assert.False(t, strings.ContainsFunc(line, unicode.IsControl), "raw control character in error line: %q", r.stderr)
		assert.True(t, strings.Contains(line, `\x1b`) || strings.Contains(line, `\x9b`) || strings.Contains(line, `\u009b`), "the escape is shown, escaped: %q", line)
		assert.NotContains(t, line, "\x9b", "a raw C1 byte")
		assert.NotContains(t, line, "\u009b", "a raw C1 character")
	}
}

// -h in every spelling the flag package reads (--help, --h, --help=true,
// -help) prints the usage and exits 0 before a command as after one.
func TestEveryHelpSpellingWorksBeforeACommand(t *testing.T) {
	for _, a := range []string{"-h", "--help", "help", "--h", "--help=true", "-help", "-h=1"} {
		r := cli(t, nil, map[string]string{"DATABASE_URL": ""}, a)
		t.Logf("%q -> exit %d stderr %q", a, r.code, r.stderr)
		assert.Equal(t, exitOK, r.code, a)
		assert.Contains(t, r.stderr, "usage: archivectl", a)
	}
}
