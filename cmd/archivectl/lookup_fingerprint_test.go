package main

import (
	"encoding/hex"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemarchive/idemarchive/shared/dbtest"
)

// lookup --fingerprint compares SHA-256 digests; the archive also holds
// fingerprints that are not (the runbook's probe stores '\x00'), compared
// when equal, so other lengths are taken as the lookup API takes them (hex,
// at most 64 bytes). An answer without fingerprint_match then says why on
// stderr: a truncated paste (62 hex digits) used to give a silent answer
// that read as "no comparison asked for". An empty --fingerprint (an unset
// shell variable) and one longer than 64 bytes are refused.
func TestLookupSaysWhyItMadeNoFingerprintComparison(t *testing.T) {
	t.Parallel()
	db := dbtest.New(t)
	db.Partition(t, 0)
	dbtest.InsertArchive(t, db.Pool,
		dbtest.ArchiveRow{Key: "idem:v1:k", Status: 201, ExpiredAt: time.Now().Add(-time.Hour)},
		dbtest.ArchiveRow{Key: "idem:v1:probe", Status: 201, ExpiredAt: time.Now().Add(-time.Hour), Fingerprint: []byte{0}},
	)
	full := hex.EncodeToString(dbtest.Fingerprint("idem:v1:k"))

	// A SHA-256 compares, and no note is printed.
	r := cli(t, db, nil, "lookup", "idem:v1:k", "--fingerprint", full)
	require.Equal(t, exitOK, r.code, r.stderr)
	require.Contains(t, r.stdout, `"fingerprint_match": true`)
	require.Empty(t, r.stderr)

	// A truncated one is no digest: the record, and a line saying why it
	// carries no fingerprint_match.
	r = cli(t, db, nil, "lookup", "idem:v1:k", "--fingerprint", full[:62])
	require.Equal(t, exitOK, r.code, r.stderr)
	require.Contains(t, r.stdout, `"original_status": 201`)
	require.NotContains(t, r.stdout, "fingerprint_match")
	require.Equal(t, "archivectl lookup: no fingerprint_match: --fingerprint is 62 hex digits, not a SHA-256 digest (64), and differs from the archived one\n", r.stderr)

	// The probe's '\x00' is matched by 00, and a digest cannot be compared
	// with it: the line says that the archived one is no digest.
	r = cli(t, db, nil, "lookup", "idem:v1:probe", "--fingerprint", "00")
	require.Equal(t, exitOK, r.code, r.stderr)
	require.Contains(t, r.stdout, `"fingerprint_match": true`)
	require.Empty(t, r.stderr)
	r = cli(t, db, nil, "lookup", "idem:v1:probe", "--fingerprint", full)
	require.Equal(t, exitOK, r.code, r.stderr)
	require.NotContains(t, r.stdout, "fingerprint_match")
	require.Equal(t, "archivectl lookup: no fingerprint_match: the archived fingerprint is not a SHA-256 digest, and differs from --fingerprint\n", r.stderr)

	// Refused, one line, exit 2.
	requireOneLineError(t, cli(t, db, nil, "lookup", "idem:v1:k", "--fingerprint", ""), "--fingerprint is empty: give a hex SHA-256, or leave the flag out")
	requireOneLineError(t, cli(t, db, nil, "lookup", "idem:v1:k", "--fingerprint="), "--fingerprint is empty")
	requireOneLineError(t, cli(t, db, nil, "lookup", "idem:v1:k", "--fingerprint", strings.Repeat("ab", 65)), "--fingerprint is 65 bytes, more than 64 (a SHA-256 is 64 hex digits)")
	// Without the flag, nothing is compared and nothing said.
	r = cli(t, db, nil, "lookup", "idem:v1:k")
	require.Equal(t, exitOK, r.code, r.stderr)
	require.NotContains(t, r.stdout, "fingerprint_match")
	require.Empty(t, r.stderr)
}
