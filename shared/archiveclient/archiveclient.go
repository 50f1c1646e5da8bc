// Package archiveclient reaches the archive through the lookup Lambda
// function, for API services that have no database route to the archive: it
// invokes the function synchronously (RequestResponse) with the direct payload
// and maps the answer back to archive.Record or archive.ErrNotFound.
//
//	client := archiveclient.Lambda{Client: lambda.NewFromConfig(awsCfg), FunctionName: "idemarchive-lookup"}
//	mw, _ := idempotency.New(idempotency.Config{Store: store, Archive: client})
//
// Each call is bounded by Timeout (and by the middleware's ArchiveTimeout,
// through its context).
package archiveclient

import (
	"cmp"
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/lambda"
	"github.com/aws/aws-sdk-go-v2/service/lambda/types"
	"github.com/aws/smithy-go"
	smithyhttp "github.com/aws/smithy-go/transport/http"

	"github.com/idemarchive/idemarchive/shared/archive"
	"github.com/idemarchive/idemarchive/shared/lookupapi"
	"github.com/idemarchive/idemarchive/shared/problem"
	"github.com/idemarchive/idemarchive/shared/strictjson"
)

// Invoker is the part of the Lambda client this package uses.
type Invoker interface {
	Invoke(ctx context.Context, in *lambda.InvokeInput, opts ...func(*lambda.Options)) (*lambda.InvokeOutput, error)
}

var _ Invoker = (*lambda.Client)(nil)

// ErrUnavailable wraps every failure to get an answer from the function.
var ErrUnavailable = errors.New("archive lookup function unavailable")

// maxErrorPayload bounds how much of a function error's payload an error
// carries.
const maxErrorPayload = 1024

// Lambda looks keys up through the lookup function.
type Lambda struct {
	Client       Invoker
	FunctionName string
	// Timeout bounds one invocation, retries included. Default 2s (when
	// zero); one under archive.MinLookupTimeout (a negative one included)
	// is refused by Validate (which idempotency.New calls) and on every
	// lookup, with archive.ErrMisconfigured (never failed open on). The
	// caller's context may cut it shorter.
	Timeout time.Duration
}

// Validate reports a client that can never look a key up: no Client, no
// FunctionName, a Timeout under archive.MinLookupTimeout, or a
// *lambda.Client that every Invoke would fail before sending anything (one
// never made with lambda.New or NewFromConfig, one with no region and no
// endpoint, or a region or endpoint settings the SDK cannot resolve, empty
// static credentials). idempotency.New calls it, so that a middleware is
// never built on one (under FailOpen, every lookup failing would run every
// key, those the archive holds included).
func (l Lambda) Validate() error {
	switch {
	case l.Client == nil || nilPointer(l.Client):
		return errors.New("archiveclient: Client is not set")
	case l.FunctionName == "":
		return errors.New("archiveclient: FunctionName is not set")
	case l.Timeout != 0 && l.Timeout < archive.MinLookupTimeout:
		return fmt.Errorf("archiveclient: Timeout must be at least %s (or zero for 2s), got %s: no invocation fits in less", archive.MinLookupTimeout, l.Timeout)
	}
	// The SDK's client alone: a decorator's own Invoke decides what each
	// call uses (a region of its own, an answer of its own), so the
	// options of a client it embeds say nothing. What such a client fails
	// with before sending is still never failed open on (misconfigured).
	if c, ok := l.Client.(*lambda.Client); ok {
		return checkSDKClient(c)
	}
	return nil
}

// defaultResolver is the type of the SDK's own endpoint rules.
var defaultResolver = reflect.TypeOf(lambda.NewDefaultEndpointResolverV2())

// checkSDKClient refuses an SDK client whose every Invoke would fail before
// a request is sent. Those failures are no Lambda error code, so a lookup
// could not tell them from an outage, and FailOpen would run every key.
func checkSDKClient(c *lambda.Client) error {
	o := c.Options()
	if o.EndpointResolverV2 == nil {
		// lambda.New sets a resolver; a zero Client has none, and
		// panics on Invoke.
		return errors.New("archiveclient: Client was not made with lambda.New or lambda.NewFromConfig")
	}
	// The SDK's own endpoint rules, as Invoke applies them. A resolver of
	// one's own (EndpointResolverV2, or the legacy EndpointResolver that
	// names its signing region) may need no region: it is trusted.
	if o.EndpointResolver == nil && reflect.TypeOf(o.EndpointResolverV2) == defaultResolver {
		if o.Region == "" && o.BaseEndpoint == nil {
			return errors.New("archiveclient: Client has no AWS region (set AWS_REGION or config.WithRegion): every invocation would fail")
		}
		if o.Region != "" && !validRegion(o.Region) {
			return fmt.Errorf("archiveclient: Client's AWS region %q is not a host name label: every invocation would fail", o.Region)
		}
		params := lambda.EndpointParameters{
			Endpoint:     o.BaseEndpoint,
			UseDualStack: aws.Bool(o.EndpointOptions.UseDualStackEndpoint == aws.DualStackEndpointStateEnabled),
			UseFIPS:      aws.Bool(o.EndpointOptions.UseFIPSEndpoint == aws.FIPSEndpointStateEnabled),
		}
		if o.Region != "" {
			params.Region = aws.String(o.Region)
		}
		ep, err := o.EndpointResolverV2.ResolveEndpoint(context.Background(), params)
		if err != nil {
			return fmt.Errorf("archiveclient: Client's endpoint cannot be resolved: %w: every invocation would fail", err)
		}
		if err := sendable(ep.URI); err != nil {
			return fmt.Errorf("archiveclient: Client's endpoint %s: %w: every invocation would fail", ep.URI.Redacted(), err)
		}
	}
	// Static credentials never change: empty ones fail every call. (Other
	// providers are not called here: they may reach the network, and what
	// they fail with may pass.)
	if o.Credentials != nil && aws.IsCredentialsProvider(o.Credentials, credentials.StaticCredentialsProvider{}) {
		if _, err := o.Credentials.Retrieve(context.Background()); err != nil {
			return fmt.Errorf("archiveclient: Client's static credentials: %w: every invocation would fail", err)
		}
	}
	return nil
}

// sendable refuses an endpoint URL net/http cannot send a request to,
// which the SDK's rules let through: no http or https scheme
// (localhost:3001 reads as the scheme "localhost"), no host, a port that
// is no port.
func sendable(u url.URL) error {
	if u.Scheme != "http" && u.Scheme != "https" {
		return fmt.Errorf("the scheme is %q, not http or https", u.Scheme)
	}
	if u.Hostname() == "" {
		return errors.New("no host")
	}
	if p := u.Port(); p != "" {
		if n, err := strconv.Atoi(p); err != nil || n < 1 || n > 65535 {
			return fmt.Errorf("port %q is not 1-65535", p)
		}
	}
	return nil
}

// validRegion reports whether region is what the SDK binds as one: RFC
// 1123 host labels, none starting or ending with a hyphen, joined by dots.
func validRegion(region string) bool {
	for _, label := range strings.Split(region, ".") {
		if !smithyhttp.ValidHostLabel(label) || label[0] == '-' || label[len(label)-1] == '-' {
			return false
		}
	}
	return true
}

// Lookup invokes the function for scopedKey. A key no lookup accepts is
// archive.ErrInvalidKey, without an invocation; an answer that is not about
// scopedKey is ErrUnavailable.
func (l Lambda) Lookup(ctx context.Context, scopedKey string, fingerprint []byte) (archive.Record, error) {
	// Refused here as archive.Reader refuses it: JSON would send a key
	// that is not UTF-8 with U+FFFD for its bad bytes, and the answer
	// would be about another key.
	if err := archive.ValidateKey(scopedKey); err != nil {
		return archive.Record{ScopedKey: scopedKey}, err
	}
	if err := l.Validate(); err != nil {
		// A configuration error, said as one (archive.ErrMisconfigured),
		// and not an archive that never answers: the middleware never
		// fails open on it (a wrapper of this client can hide Validate
		// from idempotency.New), and an archive error would let FailOpen
		// run every key, those the archive holds included. Nothing is
		// invoked (no Client would panic; no FunctionName would reach
		// .../functions//invocations).
		return archive.Record{}, fmt.Errorf("%w: %w", archive.ErrMisconfigured, err)
	}
	ctx, cancel := context.WithTimeout(ctx, cmp.Or(l.Timeout, 2*time.Second))
	defer cancel()
	req := lookupapi.DirectRequest{ScopedKey: scopedKey}
	if fingerprint != nil {
		req.Fingerprint = hex.EncodeToString(fingerprint)
	}
	payload, err := json.Marshal(req)
	if err != nil {
		return archive.Record{}, err
	}
	out, err := l.Client.Invoke(ctx, &lambda.InvokeInput{
		FunctionName:   aws.String(l.FunctionName),
		InvocationType: types.InvocationTypeRequestResponse,
		Payload:        payload,
	})
	switch {
	case err != nil && misconfigured(err):
		return archive.Record{}, fmt.Errorf("%w: %w", archive.ErrMisconfigured, err)
	case err != nil:
		return archive.Record{}, fmt.Errorf("%w: %w", ErrUnavailable, err)
	case out == nil:
		// An Invoker that wraps the SDK's (a recorder, a cache) and
		// returned neither an answer nor an error.
		return archive.Record{}, fmt.Errorf("%w: the invoker returned no answer and no error", ErrUnavailable)
	case out.FunctionError != nil:
		// The payload (a message and stack trace, up to 6 MB) is cut
		// short: the middleware logs this error on every request while
		// the function fails.
		return archive.Record{}, fmt.Errorf("%w: function error %s: %s", ErrUnavailable, clip(*out.FunctionError), clip(string(out.Payload)))
	case out.StatusCode != 0 && out.StatusCode != http.StatusOK:
		// A RequestResponse invocation the function answered is a 200. A
		// 202 (queued, not run) or 204 (a dry run) carries no answer of
		// the function's, whatever its payload says. (Zero is let
		// through: an Invoker written by hand may not set it.)
		return archive.Record{}, fmt.Errorf("%w: the invocation's status is %d, not 200: the function did not answer", ErrUnavailable, out.StatusCode)
	}
	rec, err := readAnswer(out.Payload, scopedKey)
	if fingerprint == nil {
		// Nothing was compared: a match the answer claims (another
		// version's, a stub's) proves nothing.
		rec.FingerprintMatch = nil
	}
	return rec, err
}

// misconfiguredCodes are the Invoke errors that every later call gets too,
// until someone changes the configuration: no function of that name, a role
// that may not invoke it, a name or payload Lambda refuses, a function whose
// key, package, runtime or network settings are broken. They are
// archive.ErrMisconfigured, which the middleware never fails open on: under
// FailOpen, taken for an outage, they would run every late retry again.
// Errors a later call may not get (throttling, a function being updated,
// the service's own, credentials that expired or a clock that is off) stay
// ErrUnavailable, for OnArchiveError to decide.
var misconfiguredCodes = []string{
	"ResourceNotFoundException",
	"AccessDeniedException",
	"InvalidParameterValueException",
	"InvalidRequestContentException",
	"KMSAccessDeniedException",
	"KMSDisabledException",
	"KMSInvalidStateException",
	"KMSNotFoundException",
	"EC2AccessDeniedException",
	"UnsupportedMediaTypeException",
	"InvalidRuntimeException",
	"InvalidZipFileException",
	"InvalidSubnetIDException",
	"InvalidSecurityGroupIDException",
}

func misconfigured(err error) bool {
	var apiErr smithy.APIError
	if errors.As(err, &apiErr) && slices.Contains(misconfiguredCodes, apiErr.ErrorCode()) {
		return true
	}
	// What the SDK fails with before sending anything, on every call, when
	// its configuration is wrong (and Validate could not see it, behind an
	// Invoker that wraps the client): empty static credentials, and an
	// endpoint its own binding and rules cannot make (sdkConfigPhrases),
	// the rules being a function of the configuration alone. A resolver of
	// one's own may fail for a moment (a discovery service down): its
	// errors carry none of those phrases, and stay ErrUnavailable.
	var empty *credentials.StaticCredentialsEmptyError
	if errors.As(err, &empty) {
		return true
	}
	// Only of an error no answer came with: the phrases could be in what
	// the service or a proxy said (a ServiceException's message).
	var respErr *smithyhttp.ResponseError
	if errors.As(err, &apiErr) || errors.As(err, &respErr) && respErr.Response != nil && respErr.Response.StatusCode != 0 {
		return false
	}
	// A port that is no port is the dialer's own word (net.AddrError): the
	// phrase could as well be in a redirect's Location header the client
	// failed to parse, which a server wrote.
	var addrErr *net.AddrError
	if errors.As(err, &addrErr) && addrErr.Err == "invalid port" {
		return true
	}
	// Port 0 dials, and is refused, on every call (sendable refuses it).
	var opErr *net.OpError
	if errors.As(err, &opErr) && opErr.Op == "dial" && opErr.Addr != nil {
		if _, port, err := net.SplitHostPort(opErr.Addr.String()); err == nil && port == "0" {
			return true
		}
	}
	msg := err.Error()
	for _, quoted := range []string{"Location header", "proxyconnect", "transport connection broken", "malformed"} {
		if strings.Contains(msg, quoted) {
			return false // what a server or a proxy said, quoted
		}
	}
	return slices.ContainsFunc(sdkConfigPhrases, func(p string) bool { return strings.Contains(msg, p) })
}

// sdkConfigPhrases are what the Lambda client's own endpoint binding and
// rules say when they cannot make an endpoint of the configuration: a
// region they cannot bind, a rule the settings fail (no region, FIPS with
// a custom endpoint), an endpoint URL they cannot parse (a BaseEndpoint
// read from a file with its newline).
var sdkConfigPhrases = []string{"failed to bind endpoint params", "endpoint rule error", "Failed to parse uri",
	// And what net/http says, before dialing, of an endpoint URL it can
	// never send to (see sendable).
	"unsupported protocol scheme", "no Host in request URL"}

// clip cuts what an answer says to maxErrorPayload bytes for an error line,
// at a character's boundary, with what it cut said.
func clip(s string) string {
	if len(s) <= maxErrorPayload {
		return s
	}
	cut := s[:maxErrorPayload]
	// Back off a character cut in two: the start of the last one, if what
	// follows it is not whole. Bytes that are no character anyway stay.
	for i := len(cut) - 1; i >= 0 && i >= len(cut)-utf8.UTFMax; i-- {
		if utf8.RuneStart(cut[i]) {
			if !utf8.FullRuneInString(cut[i:]) {
				cut = cut[:i]
			}
			break
		}
	}
	return fmt.Sprintf("%s... (%d more bytes)", cut, len(s)-len(cut))
}

// answer is a lookupapi.DirectResponse as this client reads it: each part
// kept raw until the status says which one it must be.
type answer struct {
	Status  *int            `json:"status"`
	Record  json.RawMessage `json:"record"`
	Page    json.RawMessage `json:"page"`
	Problem json.RawMessage `json:"problem"`
}

// notFoundType is the problem type of the lookup function's not-found
// answer.
var notFoundType = problem.New(http.StatusNotFound, "key_not_found", "").Type

// recordMembers are the members every archive.Record answer carries (its
// times and resource id may be null, never absent).
var recordMembers = []string{"scoped_key", "original_status", "resource_id", "created_at", "expired_at"}

// readAnswer maps the function's answer for scopedKey to a record,
// archive.ErrNotFound, a rejection, or ErrUnavailable. Only an answer that
// can mean one thing is taken: a found record is a 409 that the client
// trusts, a not found runs the request, so an answer that a different
// version of the function, a proxy or a hand-written stub could have made
// ambiguous (a status and a record that disagree, a member given twice or in
// another letter case, a record without its status) is ErrUnavailable,
// which the middleware's OnArchiveError policy decides on, as on any archive
// it cannot reach. Members this client does not know are let through, so
// that a newer function may add them.
func readAnswer(payload []byte, scopedKey string) (archive.Record, error) {
	var a answer
	if err := strictjson.Decode(payload, &a, false); err != nil {
		return archive.Record{}, fmt.Errorf("%w: unreadable answer: %w", ErrUnavailable, err)
	}
	if a.Status == nil {
		return archive.Record{}, fmt.Errorf("%w: an answer without a status", ErrUnavailable)
	}
	parts := 0
	for _, p := range []json.RawMessage{a.Record, a.Page, a.Problem} {
		if given(p) {
			parts++
		}
	}
	if parts != 1 {
		return archive.Record{}, fmt.Errorf("%w: status %d with %d of record, page and problem (one expected)", ErrUnavailable, *a.Status, parts)
	}
	switch {
	case *a.Status == http.StatusOK && given(a.Record):
		return readRecord(a.Record, scopedKey)
	case given(a.Problem):
		var p lookupapi.Problem
		if err := strictjson.Decode(a.Problem, &p, false); err != nil {
			return archive.Record{}, fmt.Errorf("%w: unreadable problem: %w", ErrUnavailable, err)
		}
		switch {
		case *a.Status == http.StatusNotFound && p.Code == "key_not_found" &&
			(p.Status == 0 || p.Status == http.StatusNotFound) && (p.Type == "" || p.Type == notFoundType):
			// Not found only where every part of the answer says so: one
			// whose problem says another status or type (a proxy's, a
			// stub's) is no answer to run the request on.
			return archive.Record{}, archive.ErrNotFound
		case *a.Status >= 400 && *a.Status < 500 && p.Code != "key_not_found":
			// The key was checked as the function checks it before it was
			// sent (archive.ValidateKey): a function that refuses it is
			// one this client does not fit (another version, another
			// route), and refuses the next key too. FailOpen would run
			// every one of them.
			return archive.Record{}, fmt.Errorf("%w: archive lookup rejected the key: status %d: %s: %s", archive.ErrMisconfigured, *a.Status, clip(p.Code), clip(p.Detail))
		}
		return archive.Record{}, fmt.Errorf("%w: status %d, problem %q", ErrUnavailable, *a.Status, clip(p.Code))
	}
	return archive.Record{}, fmt.Errorf("%w: status %d", ErrUnavailable, *a.Status)
}

// readRecord reads a found record, which must be about scopedKey and whole.
func readRecord(raw json.RawMessage, scopedKey string) (archive.Record, error) {
	var rec archive.Record
	if err := strictjson.Decode(raw, &rec, false); err != nil {
		return archive.Record{}, fmt.Errorf("%w: unreadable record: %w", ErrUnavailable, err)
	}
	names, _ := strictjson.Members(raw) // refused above if ambiguous
	for _, m := range recordMembers {
		if !slices.Contains(names, m) {
			// Without original_status, the record would say the key
			// expired before it completed (status 0), which a client
			// may read as "never charged" and charge again.
			return archive.Record{}, fmt.Errorf("%w: a record without %s", ErrUnavailable, m)
		}
	}
	var members map[string]json.RawMessage
	if err := json.Unmarshal(raw, &members); err != nil {
		return archive.Record{}, fmt.Errorf("%w: unreadable record: %w", ErrUnavailable, err)
	}
	for _, m := range []string{"scoped_key", "original_status"} {
		if !given(members[m]) {
			// A null original_status would decode as 0, "expired before
			// it completed", read as above.
			return archive.Record{}, fmt.Errorf("%w: a record whose %s is null", ErrUnavailable, m)
		}
	}
	switch {
	case rec.ScopedKey != scopedKey:
		// Not an answer for this key (another deployment's function, a
		// proxy in between): taken for one, a key that never ran would
		// be answered as archived, or a charge as another's.
		return archive.Record{}, fmt.Errorf("%w: the answer is for another key", ErrUnavailable)
	case rec.Status != archive.InFlightStatus && (rec.Status < 100 || rec.Status > 599):
		return archive.Record{}, fmt.Errorf("%w: a record with original_status %d", ErrUnavailable, rec.Status)
	}
	return rec, nil
}

// given reports whether a member was present with a value other than null.
func given(raw json.RawMessage) bool {
	return len(raw) > 0 && string(raw) != "null"
}

// nilPointer reports whether v is a nil pointer in a non-nil interface (a
// *lambda.Client declared and never made), which would panic on Invoke.
func nilPointer(v any) bool {
	rv := reflect.ValueOf(v)
	return rv.Kind() == reflect.Pointer && rv.IsNil()
}
