package archiveclient_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/lambda"
	"github.com/stretchr/testify/require"

	"github.com/idemarchive/idemarchive/shared/archive"
	"github.com/idemarchive/idemarchive/shared/archiveclient"
	"github.com/idemarchive/idemarchive/shared/lookupapi"
)

// function is a lookup function that answers every invocation with out,
// recording what it was asked.
type function struct {
	asked []lookupapi.DirectRequest
	out   func(req lookupapi.DirectRequest) *lambda.InvokeOutput
}

func (f *function) Invoke(_ context.Context, in *lambda.InvokeInput, _ ...func(*lambda.Options)) (*lambda.InvokeOutput, error) {
	var req lookupapi.DirectRequest
	if err := json.Unmarshal(in.Payload, &req); err != nil {
		return nil, err
	}
	f.asked = append(f.asked, req)
	return f.out(req), nil
}

// archived answers as the lookup function does for a key the archive holds.
func archived(req lookupapi.DirectRequest) *lambda.InvokeOutput {
	b, _ := json.Marshal(lookupapi.DirectResponse{Status: 200, Record: &archive.Record{ScopedKey: req.ScopedKey, Status: 201}})
	return &lambda.InvokeOutput{StatusCode: 200, Payload: b}
}

// A key that is not UTF-8 is refused as archive.Reader refuses it, and
// never sent: JSON would carry it with U+FFFD in place of its bad bytes,
// and the answer would be about another key, one the archive may hold.
func TestAKeyThatIsNotUTF8IsNotLookedUpAsAnother(t *testing.T) {
	t.Parallel()
	f := &function{out: archived}
	c := archiveclient.Lambda{Client: f, FunctionName: "lookup"}
	rec, err := c.Lookup(context.Background(), "idem:v1:\xff", nil)
	require.ErrorIs(t, err, archive.ErrInvalidKey, "answered %+v for %q", rec, f.asked)
	require.Empty(t, f.asked)
}

// An answer about another key than the one asked (a function of another
// deployment, a proxy in between) is not an answer for this key.
func TestARecordOfAnotherKeyIsNotAnAnswer(t *testing.T) {
	t.Parallel()
	f := &function{out: func(lookupapi.DirectRequest) *lambda.InvokeOutput {
		return archived(lookupapi.DirectRequest{ScopedKey: "idem:v1:someone-else"})
	}}
	c := archiveclient.Lambda{Client: f, FunctionName: "lookup"}
	_, err := c.Lookup(context.Background(), "idem:v1:mine", nil)
	require.ErrorIs(t, err, archiveclient.ErrUnavailable)
}

// A function error's payload (a stack trace, up to Lambda's 6 MB) is not
// copied whole into the error, which the middleware logs on every request
// while the function fails.
func TestAFunctionErrorIsNotCopiedWhole(t *testing.T) {
	t.Parallel()
	huge := strings.Repeat("x", 6<<20)
	f := &function{out: func(lookupapi.DirectRequest) *lambda.InvokeOutput {
		fe := "Unhandled"
		b, _ := json.Marshal(map[string]string{"errorMessage": huge, "errorType": "runtime.Error"})
		return &lambda.InvokeOutput{StatusCode: 200, FunctionError: &fe, Payload: b}
	}}
	c := archiveclient.Lambda{Client: f, FunctionName: "lookup"}
	_, err := c.Lookup(context.Background(), "idem:v1:k", nil)
	require.ErrorIs(t, err, archiveclient.ErrUnavailable)
	require.Less(t, len(err.Error()), 4096)
	require.False(t, errors.Is(err, archive.ErrNotFound))
}

// A negative Timeout is a configuration error, said as one, and nothing is
// invoked: not an archive that looks unreachable on every request.
func TestANegativeTimeoutIsRefused(t *testing.T) {
	t.Parallel()
	f := &function{out: archived}
	c := archiveclient.Lambda{Client: f, FunctionName: "lookup", Timeout: -time.Second}
	_, err := c.Lookup(context.Background(), "idem:v1:k", nil)
	require.ErrorContains(t, err, "Timeout must be at least 10ms")
	require.NotErrorIs(t, err, archiveclient.ErrUnavailable)
	require.Empty(t, f.asked)
}

// answering answers every invocation with payload, as written.
func answering(payload string) *function {
	return &function{out: func(lookupapi.DirectRequest) *lambda.InvokeOutput {
		return &lambda.InvokeOutput{StatusCode: 200, Payload: []byte(payload)}
	}}
}

// Only an answer that can mean one thing is read as found or not found. A
// record without its original_status would be a 409 saying the request
// never completed (status 0); a record beside a 404, or a status given
// twice in two letter cases, would be read as not found, and the request
// would run, and so would a 404 whose problem says another status or type;
// a null original_status would be read as 0: each is an answer the
// function never gives (another version,
// a proxy, a stub), so the archive is unavailable, never trusted either way.
func TestAnswersThatCouldMeanTwoThingsAreNotTrusted(t *testing.T) {
	t.Parallel()
	const whole = `{"scoped_key":"idem:v1:k","original_status":201,"resource_id":"ch_1","created_at":null,"expired_at":"2026-12-01T00:00:00Z"}`
	for _, payload := range []string{
		`{"status":200,"record":{"scoped_key":"idem:v1:k"}}`,
		`{"status":200,"record":{"scoped_key":"idem:v1:k","status_code":201,"resource_id":"ch_1","created_at":null,"expired_at":null}}`,
		`{"status":200,"record":{"scoped_key":"idem:v1:k","original_status":201,"resource_id":"ch_1","created_at":null}}`,
		`{"status":200,"record":{"scoped_key":"idem:v1:k","original_status":999,"resource_id":"ch_1","created_at":null,"expired_at":null}}`,
		`{"status":200,"record":{"scoped_key":"idem:v1:k","original_status":-5,"resource_id":"ch_1","created_at":null,"expired_at":null}}`,
		`{"status":200,"record":{"scoped_key":"idem:v1:k","original_status":201,"ORIGINAL_STATUS":0,"resource_id":"ch_1","created_at":null,"expired_at":null}}`,
		`{"status":200,"record":{"Scoped_Key":"idem:v1:k","original_status":201,"resource_id":"ch_1","created_at":null,"expired_at":null}}`,
		`{"status":404,"problem":{"code":"key_not_found"},"record":` + whole + `}`,
		`{"status":200,"record":` + whole + `,"STATUS":404,"Problem":{"code":"key_not_found"}}`,
		`{"status":200,"record":` + whole + `,"status":404}`,
		`{"Status":404,"problem":{"code":"key_not_found"}}`,
		`{"status":404,"problem":{"code":"key_not_found","CODE":"invalid_key"}}`,
		`{"problem":{"code":"key_not_found"}}`,
		`{"status":404}`,
		`{"status":404,"problem":null}`,
		`{"status":500,"problem":{"code":"key_not_found"}}`,
		`{"status":200,"problem":{"code":"key_not_found"}}`,
		`{"status":200,"page":{"records":[]}}`,
		`{"status":404,"problem":{"type":"urn:idemarchive:problem:unavailable","status":503,"code":"key_not_found"}}`,
		`{"status":404,"problem":{"status":503,"code":"key_not_found"}}`,
		`{"status":404,"problem":{"status":200,"code":"key_not_found"}}`,
		`{"status":404,"problem":{"type":"about:blank","code":"key_not_found"}}`,
		`{"status":200,"record":{"scoped_key":"idem:v1:k","original_status":null,"resource_id":"ch_1","created_at":null,"expired_at":null}}`,
		`{"status":200,"record":{"scoped_key":null,"original_status":201,"resource_id":"ch_1","created_at":null,"expired_at":null}}`,
		`{"status":200,"record":` + whole + `} trailing`,
		`{"status":200,"record":{"scoped_key":"idem:v1:\ud800","original_status":201,"resource_id":"ch_1","created_at":null,"expired_at":null}}`,
	} {
		f := answering(payload)
		rec, err := archiveclient.Lambda{Client: f, FunctionName: "lookup"}.Lookup(context.Background(), "idem:v1:k", nil)
		require.ErrorIs(t, err, archiveclient.ErrUnavailable, "%s: read as %+v", payload, rec)
	}

	// The answers the function gives are read as they were, members a
	// newer function may add let through.
	rec, err := archiveclient.Lambda{Client: answering(`{"status":200,"record":` + whole + `,"served_by":"v2"}`), FunctionName: "lookup"}.Lookup(context.Background(), "idem:v1:k", nil)
	require.NoError(t, err)
	require.Equal(t, 201, rec.Status)
	require.Equal(t, "ch_1", *rec.ResourceID)
	require.True(t, rec.CreatedAt.IsZero())
	_, err = archiveclient.Lambda{Client: answering(`{"status":404,"problem":{"type":"urn:idemarchive:problem:key_not_found","status":404,"code":"key_not_found","request_id":"r"}}`), FunctionName: "lookup"}.Lookup(context.Background(), "idem:v1:k", nil)
	require.ErrorIs(t, err, archive.ErrNotFound)
	rec, err = archiveclient.Lambda{Client: answering(`{"status":200,"record":` + whole[:len(whole)-1] + `,"fingerprint_match":false}}`), FunctionName: "lookup"}.Lookup(context.Background(), "idem:v1:k", nil)
	require.NoError(t, err)
	require.Nil(t, rec.FingerprintMatch, "no fingerprint was sent: a match claimed proves nothing")
	rec, err = archiveclient.Lambda{Client: answering(`{"status":200,"record":{"scoped_key":"idem:v1:k","original_status":0,"resource_id":null,"created_at":null,"expired_at":null}}`), FunctionName: "lookup"}.Lookup(context.Background(), "idem:v1:k", nil)
	require.NoError(t, err)
	require.True(t, rec.InFlight())
	_, err = archiveclient.Lambda{Client: answering(`{"status":400,"problem":{"code":"invalid_key","detail":"too long"}}`), FunctionName: "lookup"}.Lookup(context.Background(), "idem:v1:k", nil)
	require.ErrorContains(t, err, "rejected the key: status 400: invalid_key: too long")
	require.ErrorIs(t, err, archive.ErrMisconfigured)
	require.NotErrorIs(t, err, archiveclient.ErrUnavailable)
}
