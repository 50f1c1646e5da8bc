// Package lookupapi is the archive's query API, independent of how requests
// arrive: the lookup Lambda adapts API Gateway events (HTTP API payload 2.0 and
// REST proxy 1.0) into a Request, and direct lambda:Invoke payloads into a
// DirectRequest.
//
// Routes (any path prefix, such as an API Gateway stage, is ignored):
//
//	GET .../v1/archive/keys/{scoped key, URL-encoded}?fingerprint=HEX
//	GET .../v1/archive/lookup?scoped_key=KEY&fingerprint=HEX
//	GET .../v1/archive/keys?scope_prefix=P&created_from=T&created_to=T&limit=N&cursor=C
//
// A query parameter a route does not take is refused (400), as is a direct
// payload's member of the other action.
//
// Answers are JSON; errors are application/problem+json (RFC 9457) with a
// stable machine code. Every error kind maps to its status in one table
// (problems); anything else is a 500 whose body says nothing about the cause,
// logged with the request id.
package lookupapi

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/idemarchive/idemarchive/shared/archive"
	"github.com/idemarchive/idemarchive/shared/problem"
)

// Reader is what the API needs from the archive; *archive.Reader is one.
type Reader interface {
	Lookup(ctx context.Context, scopedKey string, fingerprint []byte) (archive.Record, error)
	Investigate(ctx context.Context, q archive.Query) (archive.Page, error)
}

var _ Reader = (*archive.Reader)(nil)

// Errors of the API itself; archive errors are mapped beside them.
var (
	ErrRouteNotFound    = errors.New("no such route")
	ErrMethodNotAllowed = errors.New("method not allowed")
	ErrBadRequest       = errors.New("bad request")
)

// Problem is an RFC 9457 problem details object with a stable code.
type Problem = problem.Problem

// problems maps error kinds to status and code: the one table.
var problems = []struct {
	err    error
	status int
	code   string
}{
	{archive.ErrNotFound, http.StatusNotFound, "key_not_found"},
	{archive.ErrInvalidKey, http.StatusBadRequest, "invalid_key"},
	{archive.ErrInvalidQuery, http.StatusBadRequest, "invalid_query"},
	{archive.ErrInvalidCursor, http.StatusBadRequest, "invalid_cursor"},
	{ErrBadRequest, http.StatusBadRequest, "bad_request"},
	{ErrRouteNotFound, http.StatusNotFound, "route_not_found"},
	{ErrMethodNotAllowed, http.StatusMethodNotAllowed, "method_not_allowed"},
	{archive.ErrTimeout, http.StatusServiceUnavailable, "timeout"},
	{context.DeadlineExceeded, http.StatusServiceUnavailable, "timeout"},
	{archive.ErrUnavailable, http.StatusServiceUnavailable, "unavailable"},
}

// ProblemFor maps err to a Problem. Known kinds keep their message as the
// detail (they describe the client's input); unknown errors are logged and
// answered with a generic 500.
func (a *API) ProblemFor(ctx context.Context, err error, requestID string) Problem {
	for _, p := range problems {
		if errors.Is(err, p.err) {
			detail := err.Error()
			if p.status >= 500 {
				// Not the client's doing: the operator needs to see it.
				a.logger.WarnContext(ctx, "lookup answered "+p.code, "request_id", requestID, "status", p.status, "error", err)
				detail = ""
			}
			return newProblem(p.status, p.code, detail, requestID)
		}
	}
	a.logger.ErrorContext(ctx, "lookup failed", "request_id", requestID, "error", err)
	return newProblem(http.StatusInternalServerError, "internal_error", "", requestID)
}

func newProblem(status int, code, detail, requestID string) Problem {
	p := problem.New(status, code, truncate(strings.TrimPrefix(detail, "archive: "), maxDetailBytes))
	p.RequestID = requestID
	return p
}

// maxDetailBytes bounds a problem's detail. A detail may quote the client's
// input (an unknown field's name in a 6 MB direct payload), and JSON may
// write a byte of it in six ('<' is \u003c): unbounded, the answer could
// outgrow what Lambda returns from a synchronous invocation (6 MB), and the
// caller would get a function error instead of its 400.
const maxDetailBytes = 512

// truncate cuts s to at most n bytes, on a character boundary, marking the
// cut with an ellipsis.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	cut := n - len("…")
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "…"
}

// API answers archive queries.
type API struct {
	reader Reader
	logger *slog.Logger
}

// New returns an API over reader. Errors that are not the client's fault are
// logged on logger.
func New(reader Reader, logger *slog.Logger) *API {
	return &API{reader: reader, logger: logger}
}

// Request is an HTTP request reduced to what the routes read.
type Request struct {
	Method string
	// Path is the decoded request path (percent-escapes already resolved).
	Path      string
	Query     map[string]string
	RequestID string
}

// Response is an HTTP response.
type Response struct {
	Status  int
	Headers map[string]string
	Body    []byte
}

const (
	keysRoute   = "/v1/archive/keys"
	lookupRoute = "/v1/archive/lookup"
)

// Serve routes one HTTP request.
func (a *API) Serve(ctx context.Context, r Request) Response {
	v, err := a.route(ctx, r)
	if err != nil {
		return a.ErrorResponse(ctx, err, r.RequestID)
	}
	return a.encode(ctx, r.RequestID, http.StatusOK, "application/json", v)
}

// ErrorResponse answers err as an application/problem+json response.
func (a *API) ErrorResponse(ctx context.Context, err error, requestID string) Response {
	p := a.ProblemFor(ctx, err, requestID)
	resp := a.encode(ctx, requestID, p.Status, problem.ContentType, p)
	if errors.Is(err, ErrMethodNotAllowed) {
		resp.Headers["Allow"] = "GET, HEAD"
	}
	return resp
}

func (a *API) route(ctx context.Context, r Request) (any, error) {
	i := strings.Index(r.Path, "/v1/archive/")
	if i < 0 {
		return nil, ErrRouteNotFound
	}
	rest := r.Path[i:]
	var handler func() (any, error)
	var params []string
	var keyErr error
	switch {
	case strings.HasPrefix(rest, keysRoute+"/"):
		key := strings.TrimPrefix(rest, keysRoute+"/")
		handler = func() (any, error) { return a.lookup(ctx, key, r.Query["fingerprint"]) }
		params = []string{"fingerprint"}
		// The path's key is checked before the parameters: "keys/" with
		// the investigation's parameters lacks a key, its parameters are
		// not unknown.
		keyErr = archive.ValidateKey(key)
	case rest == keysRoute:
		handler = func() (any, error) { return a.investigate(ctx, r.Query) }
		params = queryParams
	case rest == lookupRoute:
		handler = func() (any, error) { return a.lookup(ctx, r.Query["scoped_key"], r.Query["fingerprint"]) }
		params = []string{"scoped_key", "fingerprint"}
	default:
		return nil, ErrRouteNotFound
	}
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		return nil, ErrMethodNotAllowed
	}
	if keyErr != nil {
		return nil, keyErr
	}
	if err := onlyParams(r.Query, params); err != nil {
		return nil, err
	}
	return handler()
}

// queryParams are the investigation's query parameters.
var queryParams = []string{"scope_prefix", "created_from", "created_to", "limit", "cursor"}

// onlyParams refuses a query parameter the route does not take, in any
// letter case: dropped, a misspelt "Cursor" would answer page one again,
// for ever, a "Limit" a page of the default size, and a "Fingerprint" an
// answer that says nothing of the fingerprint, each as if asked for.
func onlyParams(q map[string]string, params []string) error {
	var unknown []string
	for name := range q {
		if !slices.Contains(params, name) {
			unknown = append(unknown, name)
		}
	}
	if len(unknown) == 0 {
		return nil
	}
	slices.Sort(unknown)
	return badRequest(fmt.Sprintf("unknown query parameter %q: this route takes %s", unknown[0], strings.Join(params, ", ")))
}

func (a *API) lookup(ctx context.Context, key, fingerprintHex string) (archive.Record, error) {
	if err := archive.ValidateKey(key); err != nil {
		return archive.Record{}, err
	}
	var fp []byte
	if fingerprintHex != "" {
		var err error
		fp, err = hex.DecodeString(fingerprintHex)
		if err != nil || len(fp) > 64 {
			return archive.Record{}, badRequest("fingerprint must be hex (a SHA-256 is 64 hex digits)")
		}
	}
	return a.reader.Lookup(ctx, key, fp)
}

func (a *API) investigate(ctx context.Context, q map[string]string) (archive.Page, error) {
	query := archive.Query{ScopePrefix: q["scope_prefix"], Cursor: q["cursor"]}
	var err error
	if query.CreatedFrom, err = parseTime("created_from", q["created_from"]); err != nil {
		return archive.Page{}, err
	}
	if query.CreatedTo, err = parseTime("created_to", q["created_to"]); err != nil {
		return archive.Page{}, err
	}
	if l := q["limit"]; l != "" {
		if query.Limit, err = strconv.Atoi(l); err != nil || query.Limit < 1 {
			return archive.Page{}, badRequest("limit must be a positive whole number")
		}
	}
	page, err := a.reader.Investigate(ctx, query)
	if err != nil {
		return page, err
	}
	return page, fitPage(&page)
}

// MaxPageBytes bounds an investigation page's JSON. Lambda returns at most
// 6 MB from a synchronous invocation, and an answer over it reaches the
// caller as a function error (a 5xx through API Gateway) every time the
// query is asked. A page's JSON is at most doubled once it is the body
// string of an API Gateway answer (only '"' and '\' are escaped again, to
// two bytes each), so a page of at most MaxPageBytes answers within the
// limit in every event shape. Pages are bounded in rows, but a row is not
// bounded in bytes the same way: keys of up to 2,000 bytes, which JSON may
// write in six bytes each ('<' is \u003c).
const MaxPageBytes = 3_000_000

// fitPage cuts page until its JSON is at most MaxPageBytes, keeping at least
// one record: the client reads the rest through NextCursor, as if it had
// asked for a smaller limit.
func fitPage(page *archive.Page) error {
	for {
		body, err := json.Marshal(page)
		if err != nil {
			return fmt.Errorf("encode investigation page: %w", err)
		}
		n := len(page.Records)
		if len(body) <= MaxPageBytes || n <= 1 {
			return nil
		}
		// Records are about the same size: cut to the share that fits,
		// then measure again.
		page.Cut(min(max(n*MaxPageBytes/len(body), 1), n-1))
		if len(page.Records) == n {
			// Not a page of archive.Reader's (no cursor to continue it
			// with): answered whole, Lambda would fail the invocation.
			return fmt.Errorf("an investigation page of %d bytes cannot be cut (it has no query to continue)", len(body))
		}
	}
}

func parseTime(name, v string) (time.Time, error) {
	if v == "" {
		return time.Time{}, badRequest(name + " is required (RFC 3339, such as 2026-12-01T00:00:00Z)")
	}
	t, err := time.Parse(time.RFC3339Nano, v)
	if err != nil || !asWritten(v) {
		return time.Time{}, badRequest(name + " is not an RFC 3339 time such as 2026-12-01T00:00:00Z")
	}
	return t, nil
}

// asWritten reports whether time.Parse, having read v, read it as written:
// it also takes a ',' before the fraction, more than nine fractional
// digits (cut to nanoseconds, so a window's end written a fraction of a
// nanosecond after a key's creation would leave the key out) and offsets
// of 24 hours or 60 minutes, none of them RFC 3339.
func asWritten(v string) bool {
	const dateTime = len("2006-01-02T15:04:05")
	if len(v) <= dateTime {
		return false
	}
	rest := v[dateTime:]
	if rest[0] == '.' {
		digits := len(rest[1:]) - len(strings.TrimLeft(rest[1:], "0123456789"))
		if digits < 1 || digits > 9 {
			return false
		}
		rest = rest[1+digits:]
	}
	if rest == "Z" {
		return true
	}
	if len(rest) != len("+07:00") || (rest[0] != '+' && rest[0] != '-') || rest[3] != ':' {
		return false
	}
	hours, errH := strconv.Atoi(rest[1:3])
	minutes, errM := strconv.Atoi(rest[4:6])
	return errH == nil && errM == nil && hours <= 23 && minutes <= 59
}

type requestError struct{ msg string }

func (e requestError) Error() string        { return e.msg }
func (e requestError) Is(target error) bool { return target == ErrBadRequest }

func badRequest(msg string) error { return requestError{msg} }

// encode answers v as JSON, or, should v not encode, logs why and answers
// a 500 problem.
func (a *API) encode(ctx context.Context, requestID string, status int, contentType string, v any) Response {
	body, err := json.Marshal(v)
	if err != nil {
		a.logger.ErrorContext(ctx, "lookup answer failed to encode", "request_id", requestID, "error", err)
		status, contentType = http.StatusInternalServerError, problem.ContentType
		body, _ = json.Marshal(newProblem(status, "internal_error", "", requestID))
	}
	// No answer may be kept by a cache: a "not found" replayed after the
	// key was archived would let its late retry run again.
	return Response{Status: status, Headers: map[string]string{"Content-Type": contentType, "Cache-Control": "no-store"}, Body: body}
}

// DirectRequest is the payload of a synchronous lambda:Invoke. A request
// with Action "query" runs the investigation query; otherwise it looks up
// ScopedKey.
type DirectRequest struct {
	Action      string `json:"action,omitempty"`
	ScopedKey   string `json:"scoped_key,omitempty"`
	Fingerprint string `json:"fingerprint,omitempty"`
	ScopePrefix string `json:"scope_prefix,omitempty"`
	CreatedFrom string `json:"created_from,omitempty"`
	CreatedTo   string `json:"created_to,omitempty"`
	// Limit is the page size: absent for the default, else 1 to the
	// reader's MaxPageSize (0 is refused).
	Limit  *int   `json:"limit,omitempty"`
	Cursor string `json:"cursor,omitempty"`
}

// DirectResponse answers a DirectRequest: Status as HTTP would, then exactly
// one of Record, Page or Problem.
type DirectResponse struct {
	Status  int             `json:"status"`
	Record  *archive.Record `json:"record,omitempty"`
	Page    *archive.Page   `json:"page,omitempty"`
	Problem *Problem        `json:"problem,omitempty"`
}

// Direct answers a direct invocation.
func (a *API) Direct(ctx context.Context, r DirectRequest, requestID string) DirectResponse {
	var err error
	switch r.Action {
	case "", "lookup":
		if m := r.queryMember(); m != "" {
			err = badRequest(m + ` belongs to "action": "query"; a lookup takes scoped_key and fingerprint`)
			break
		}
		var rec archive.Record
		if rec, err = a.lookup(ctx, r.ScopedKey, r.Fingerprint); err == nil {
			return DirectResponse{Status: http.StatusOK, Record: &rec}
		}
	case "query":
		if r.ScopedKey != "" || r.Fingerprint != "" {
			err = badRequest(`scoped_key and fingerprint belong to a lookup; "action": "query" takes ` + strings.Join(queryParams, ", "))
			break
		}
		q := map[string]string{"scope_prefix": r.ScopePrefix, "created_from": r.CreatedFrom, "created_to": r.CreatedTo, "cursor": r.Cursor}
		if r.Limit != nil {
			q["limit"] = strconv.Itoa(*r.Limit)
		}
		var page archive.Page
		if page, err = a.investigate(ctx, q); err == nil {
			return DirectResponse{Status: http.StatusOK, Page: &page}
		}
	default:
		err = badRequest(`action must be "lookup" or "query"`)
	}
	return a.DirectProblem(ctx, err, requestID)
}

// queryMember names a member of the investigation's the request sets, or
// returns "": a lookup that carries one was most likely meant as a query
// (its "action" forgotten), and is refused rather than answered without it.
func (r DirectRequest) queryMember() string {
	switch {
	case r.ScopePrefix != "":
		return "scope_prefix"
	case r.CreatedFrom != "":
		return "created_from"
	case r.CreatedTo != "":
		return "created_to"
	case r.Limit != nil:
		return "limit"
	case r.Cursor != "":
		return "cursor"
	}
	return ""
}

// DirectProblem answers a direct invocation with the problem err maps to.
func (a *API) DirectProblem(ctx context.Context, err error, requestID string) DirectResponse {
	p := a.ProblemFor(ctx, err, requestID)
	return DirectResponse{Status: p.Status, Problem: &p}
}
