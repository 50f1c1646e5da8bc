package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/aws/aws-lambda-go/events"

	"github.com/idemarchive/idemarchive/shared/archive"
	"github.com/idemarchive/idemarchive/shared/database"
	"github.com/idemarchive/idemarchive/shared/fnenv"
	"github.com/idemarchive/idemarchive/shared/lookupapi"
	"github.com/idemarchive/idemarchive/shared/strictjson"
)

// handler adapts the three event shapes to lookupapi. It implements
// lambda.Handler so that it sees the raw payload: a payload that is not JSON
// is answered with a 400 problem, not a runtime error.
type handler struct {
	env *fnenv.Env
	api *lookupapi.API
}

func newHandler(env *fnenv.Env) *handler {
	return &handler{env: env, api: lookupapi.New(newLazyReader(env), env.Logger)}
}

// shape tells the event shapes apart: HTTP API 2.0 events carry version
// "2.0" and rawPath (so do function URL events, whose domain name is a
// lambda-url one), REST proxy events httpMethod and no version, HTTP API
// 1.0 events httpMethod and version "1.0", Application Load Balancer
// events httpMethod and requestContext.elb; anything else is a direct
// invocation.
type shape struct {
	Version        string `json:"version"`
	RawPath        string `json:"rawPath"`
	HTTPMethod     string `json:"httpMethod"`
	RequestContext struct {
		DomainName string          `json:"domainName"`
		ELB        json.RawMessage `json:"elb"`
	} `json:"requestContext"`
}

// functionURL reports a Lambda function URL's domain
// (<id>.lambda-url.<region>.on.aws).
func functionURL(domain string) bool {
	return strings.Contains(domain, ".lambda-url.") && strings.HasSuffix(domain, ".on.aws")
}

// errPayloadV1 refuses HTTP API events of payload format 1.0: their path
// arrives decoded where a REST API's arrives encoded, and the two cannot be
// told apart by the path alone, so a key with '%' in it would be read as
// another key.
var errPayloadV1 = errors.New("HTTP API payload format 1.0 is not supported: configure the integration with payload format 2.0")

// errALB refuses Application Load Balancer events: an ALB hands the function
// its query values still percent-encoded, in a REST event's fields, so
// /v1/archive/lookup?scoped_key=idem%3Av1%3Ak would look up the literal
// "idem%3Av1%3Ak" and answer a definite 404 for an archived key.
var errALB = errors.New("Application Load Balancer events are not supported: invoke the lookup through API Gateway, a function URL or lambda:Invoke")

// eventKind is the shape an event is answered in.
type eventKind int

const (
	directEvent eventKind = iota
	httpV2Event           // HTTP API payload 2.0 and function URLs
	httpV1Event           // HTTP API payload 1.0, refused
	restEvent             // REST API proxy integration
	albEvent              // Application Load Balancer, refused
)

// kindOf tells the event shapes apart from sh. A payload of version "2.0",
// or with a rawPath and no httpMethod, is answered as an HTTP API 2.0 event
// whatever else it holds: API Gateway reads an answer without a statusCode
// as a 200 whose body it is.
func kindOf(sh shape) eventKind {
	switch {
	case sh.Version == "2.0" || (sh.RawPath != "" && sh.HTTPMethod == ""):
		return httpV2Event
	case sh.HTTPMethod != "" && sh.Version == "1.0":
		return httpV1Event
	case sh.HTTPMethod != "" && len(sh.RequestContext.ELB) > 0 && string(sh.RequestContext.ELB) != "null":
		return albEvent
	case sh.HTTPMethod != "":
		return restEvent
	}
	return directEvent
}

// kindOfUnreadable guesses the shape of a payload whose fields are not of
// their types from the members it has, so that an API Gateway event is
// still answered in an event's shape.
func kindOfUnreadable(payload []byte) eventKind {
	var fields map[string]json.RawMessage
	if json.Unmarshal(payload, &fields) != nil {
		return directEvent
	}
	// Named in any letter case, as decoding matches them; any of several
	// spellings counts, so that one payload always gets one answer.
	members := func(m map[string]json.RawMessage, name string) (vs []json.RawMessage) {
		for k, v := range m {
			if strings.EqualFold(k, name) {
				vs = append(vs, v)
			}
		}
		return vs
	}
	for _, v := range members(fields, "version") {
		var version string
		if json.Unmarshal(v, &version) == nil && version == "2.0" {
			return httpV2Event
		}
	}
	if len(members(fields, "rawPath")) > 0 {
		return httpV2Event
	}
	if len(members(fields, "httpMethod")) == 0 {
		return directEvent
	}
	// A load balancer's answer needs its statusDescription too.
	for _, rc := range members(fields, "requestContext") {
		var ctx map[string]json.RawMessage
		if json.Unmarshal(rc, &ctx) != nil {
			continue
		}
		for _, elb := range members(ctx, "elb") {
			if string(elb) != "null" {
				return albEvent
			}
		}
	}
	return restEvent
}

// answerReserve is kept free before the invocation's deadline, on top of
// the archive.Reader's own margin before the deadline it is given: the time
// to log the answer and hand it to the runtime. Lambda ends an invocation at
// its deadline, and a function on a fraction of a CPU (a small memory
// setting, a busy host) can wait tens of milliseconds to run, so a lookup the
// deadline cut short would otherwise be cut off with no answer rather than
// answered 503 timeout. A deadline nearer than four times the reserve keeps
// a quarter of the time left, as the Reader's margin does.
const answerReserve = 200 * time.Millisecond

// reserveAnswer returns ctx with its deadline, if it has one, moved
// answerReserve (or a quarter of the time left, when less) earlier.
func reserveAnswer(ctx context.Context) (context.Context, context.CancelFunc) {
	deadline, ok := ctx.Deadline()
	if !ok {
		return ctx, func() {}
	}
	return context.WithDeadline(ctx, deadline.Add(-min(answerReserve, max(time.Until(deadline), 0)/4)))
}

func (h *handler) Invoke(ctx context.Context, payload []byte) (out []byte, err error) {
	ctx, cancel := reserveAnswer(ctx)
	defer cancel()
	requestID := fnenv.RequestID(ctx)
	// A panic is answered as any internal error (a 500 that names
	// nothing), in the shape the payload reads as; its stack is logged.
	// (Deferred in this order: Recover runs first, and must be deferred
	// itself for recover to stop the panic.)
	defer func() {
		if errors.Is(err, fnenv.ErrPanicked) {
			out, err = h.refuse(ctx, kindOfUnreadable(payload), err, requestID)
		}
	}()
	defer fnenv.Recover(ctx, h.env.Logger, &err)
	var sh shape
	if err := json.Unmarshal(payload, &sh); err != nil {
		return h.refuse(ctx, kindOfUnreadable(payload), badPayload(err), requestID)
	}
	kind := kindOf(sh)
	if err := lossless(kind, payload); err != nil {
		return h.refuse(ctx, kind, badPayload(err), requestID)
	}
	switch kind {
	case httpV2Event:
		var ev events.APIGatewayV2HTTPRequest
		if err := json.Unmarshal(payload, &ev); err != nil {
			return h.refuse(ctx, kind, badPayload(err), requestID)
		}
		raw := names(ev.RawQueryString)
		if name, ok := repeated(raw); ok {
			return h.refuse(ctx, kind, badPayload(repeatedError(name)), requestID)
		}
		if name, ok := disagree(raw, ev.QueryStringParameters, false); ok && ev.RawQueryString != "" {
			return h.refuse(ctx, kind, badPayload(disagreeError(name, "rawQueryString")), requestID)
		}
		decoded := ev.RawPath // as HTTP APIs deliver it
		if functionURL(ev.RequestContext.DomainName) {
			decoded, _ = url.PathUnescape(ev.RawPath) // as serveEncoded reads it; refused there when it does not unescape
		}
		if err := pathKeyAgrees(ev.PathParameters, decoded); err != nil {
			return h.refuse(ctx, kind, badPayload(err), requestID)
		}
		if functionURL(ev.RequestContext.DomainName) {
			// Function URLs deliver rawPath as the client sent it.
			return h.reply(ctx, kind, h.serveEncoded(ctx, ev.RequestContext.HTTP.Method, ev.RawPath, ev.QueryStringParameters, requestID))
		}
		// HTTP APIs deliver rawPath already percent-decoded.
		return h.reply(ctx, kind, h.api.Serve(ctx, lookupapi.Request{Method: ev.RequestContext.HTTP.Method, Path: ev.RawPath, Query: ev.QueryStringParameters, RequestID: requestID}))

	case httpV1Event:
		return h.refuse(ctx, kind, badPayload(errPayloadV1), requestID)

	case albEvent:
		return h.refuse(ctx, kind, badPayload(errALB), requestID)

	case restEvent:
		var ev events.APIGatewayProxyRequest
		if err := json.Unmarshal(payload, &ev); err != nil {
			return h.refuse(ctx, kind, badPayload(err), requestID)
		}
		if name, ok := repeated(ev.MultiValueQueryStringParameters); ok {
			return h.refuse(ctx, kind, badPayload(repeatedError(name)), requestID)
		}
		if name, ok := disagree(ev.MultiValueQueryStringParameters, ev.QueryStringParameters, true); ok && ev.MultiValueQueryStringParameters != nil {
			return h.refuse(ctx, kind, badPayload(disagreeError(name, "multiValueQueryStringParameters")), requestID)
		}
		if decoded, err := url.PathUnescape(ev.Path); err == nil {
			if err := pathKeyAgrees(ev.PathParameters, decoded); err != nil {
				return h.refuse(ctx, kind, badPayload(err), requestID)
			}
		}
		// REST APIs deliver the path still percent-encoded.
		return h.reply(ctx, kind, h.serveEncoded(ctx, ev.HTTPMethod, ev.Path, ev.QueryStringParameters, requestID))
	}
	// A member given twice, or in another letter case ("SCOPED_KEY"),
	// is refused: encoding/json would keep the last one, and the answer
	// would be about a key, or an action, the caller did not mean.
	var req lookupapi.DirectRequest
	if err := strictjson.Decode(payload, &req, true); err != nil {
		return h.refuse(ctx, kind, badPayload(err), requestID)
	}
	return h.respond(ctx, h.api.Direct(ctx, req, requestID))
}

// keyMembers are the members of an API Gateway or function URL event that
// can carry a key or a query.
type keyMembers struct {
	RawPath         json.RawMessage `json:"rawPath"`
	RawQueryString  json.RawMessage `json:"rawQueryString"`
	Path            json.RawMessage `json:"path"`
	Query           json.RawMessage `json:"queryStringParameters"`
	MultiValueQuery json.RawMessage `json:"multiValueQueryStringParameters"`
	PathParameters  json.RawMessage `json:"pathParameters"`
	RequestContext  json.RawMessage `json:"requestContext"`
}

// contextMembers holds requestContext's http object, whose members (the
// method) are checked for duplicates as requestContext's own are: its
// domainName decides how the key is read (a function URL's rawPath is
// percent-decoded once more, an HTTP API's is not), its elb whether the
// event is refused.
type contextMembers struct {
	HTTP json.RawMessage `json:"http"`
}

// lossless refuses a payload that encoding/json would read other than as
// written where it carries a key (or reads one of two members given for
// one): a byte that is not UTF-8, or an unpaired
// surrogate escape, is read as U+FFFD, and the key would be answered for
// another, as a definite 200 or 404. A direct payload is checked whole (all
// of it is the caller's request); an event only in the members that carry
// the key and the query, so that a header or cookie with odd bytes, which a
// client may send and API Gateway may pass on, does not fail the lookup.
func lossless(kind eventKind, payload []byte) error {
	if kind == directEvent {
		return strictjson.Lossless(payload)
	}
	var m keyMembers
	if json.Unmarshal(payload, &m) != nil {
		return nil // refused by the event's own decoding
	}
	for _, raw := range []json.RawMessage{m.RawPath, m.RawQueryString, m.Path, m.Query, m.MultiValueQuery, m.PathParameters} {
		if err := strictjson.Lossless(raw); err != nil {
			return err
		}
	}
	// A member given twice (API Gateway never does; a hand-made event
	// may) would be read by its last: the event's own members, where
	// encoding/json also matches "RAWPATH" to rawPath, the query's, and
	// requestContext's, whose domainName and elb decide how the path and
	// query are read.
	var rc contextMembers
	_ = json.Unmarshal(m.RequestContext, &rc) // a requestContext of the wrong type is refused by the event's own decoding
	for _, object := range [][]byte{payload, m.Query, m.MultiValueQuery, m.PathParameters, m.RequestContext, rc.HTTP} {
		if _, err := strictjson.Members(object); err != nil {
			return err
		}
	}
	return nil
}

// keyParameter is the path parameter of the keys route (/v1/archive/keys/{key+}).
const keyParameter = "key"

// pathKeyAgrees refuses an event whose path parameter names another key
// than the one the answer is built from, the key in its decoded path: API
// Gateway fills both from one request, so only a hand-made event can
// differ, and then which key the caller meant is unknown. The parameter
// may be given decoded or as the path carries it, so either agrees.
func pathKeyAgrees(params map[string]string, decoded string) error {
	param, ok := params[keyParameter]
	if !ok {
		return nil
	}
	if key, ok := keyOf(decoded); ok {
		if unescaped, err := url.PathUnescape(param); param == key || (err == nil && unescaped == key) {
			return nil
		}
	}
	return fmt.Errorf("pathParameters.%s does not name the key in the path: give one key", keyParameter)
}

// keyOf returns the key a path to the keys route names, found as
// lookupapi routes it: after the first "/v1/archive/".
func keyOf(path string) (string, bool) {
	i := strings.Index(path, "/v1/archive/")
	if i < 0 {
		return "", false
	}
	return strings.CutPrefix(path[i:], "/v1/archive/keys/")
}

// refuse answers err in the event's shape.
func (h *handler) refuse(ctx context.Context, kind eventKind, err error, requestID string) ([]byte, error) {
	if kind == directEvent {
		return h.respond(ctx, h.api.DirectProblem(ctx, err, requestID))
	}
	return h.reply(ctx, kind, h.api.ErrorResponse(ctx, err, requestID))
}

// reply answers r in the shape of an event of kind.
func (h *handler) reply(ctx context.Context, kind eventKind, r lookupapi.Response) ([]byte, error) {
	switch kind {
	case httpV2Event:
		return h.respond(ctx, events.APIGatewayV2HTTPResponse{StatusCode: r.Status, Headers: r.Headers, Body: string(r.Body)})
	case albEvent:
		// An ALB answer needs statusDescription as well; the rest of a
		// REST answer is what it reads.
		return h.respond(ctx, events.ALBTargetGroupResponse{StatusCode: r.Status, StatusDescription: statusLine(r.Status), Headers: r.Headers, Body: string(r.Body)})
	}
	return h.respond(ctx, events.APIGatewayProxyResponse{StatusCode: r.Status, Headers: r.Headers, Body: string(r.Body)})
}

// repeated returns a query parameter given more than once. API Gateway
// joins a repeated parameter's values with commas (HTTP APIs, function
// URLs) or keeps the last one (REST APIs): either would answer for a key or
// a window the client did not ask about, as if it were the one it did.
func repeated(query map[string][]string) (string, bool) {
	for name, values := range query {
		if len(values) > 1 {
			return name, true
		}
	}
	return "", false
}

// names returns the parameter names of a raw query string, each with one
// entry per time it is given. Every '&'-separated pair counts, whatever
// url.ParseQuery would make of it (it skips a pair with ';' or a bad
// escape): a name that does not unescape counts as written.
func names(rawQuery string) map[string][]string {
	out := map[string][]string{}
	for pair := range strings.SplitSeq(rawQuery, "&") {
		if pair == "" {
			continue
		}
		name, _, _ := strings.Cut(pair, "=")
		if unescaped, err := url.QueryUnescape(name); err == nil {
			name = unescaped
		}
		out[name] = append(out[name], "")
	}
	return out
}

// disagree returns a parameter that the event's other rendering of its
// query (multi, from repeated or names, each name given once) and the
// queryStringParameters the answer is built from (single) do not both
// hold, or hold with different values (withValues). API Gateway fills both
// from one query, so only a hand-made event can differ (one that leaves
// the other rendering out is taken as it is), and then which one the
// caller meant is unknown: a parameter the answer would not see (a
// "fingerprint" in the raw query only) would go unchecked. Without
// values, only names written in URL-unreserved characters, which no
// decoding changes, are compared (every parameter the API takes, in any
// letter case): others, decoded in two ways, are refused as unknown anyway.
func disagree(multi map[string][]string, single map[string]string, withValues bool) (string, bool) {
	plain := func(name string) bool {
		return withValues || (name != "" && strings.Trim(name, unreserved) == "")
	}
	for name, values := range multi {
		v, ok := single[name]
		if plain(name) && (!ok || withValues && (len(values) == 0 || values[len(values)-1] != v)) {
			return name, true
		}
	}
	for name := range single {
		if _, ok := multi[name]; plain(name) && !ok {
			return name, true
		}
	}
	return "", false
}

// unreserved are the characters RFC 3986 leaves unreserved in a URL.
const unreserved = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~"

func disagreeError(name, member string) error {
	return fmt.Errorf("query parameter %q differs between queryStringParameters and %s", name, member)
}

func repeatedError(name string) error {
	return fmt.Errorf("query parameter %q is given more than once", name)
}

func (h *handler) serveEncoded(ctx context.Context, method, rawPath string, query map[string]string, requestID string) lookupapi.Response {
	path, err := url.PathUnescape(rawPath)
	if err != nil {
		return h.api.ErrorResponse(ctx, badPayload(err), requestID)
	}
	return h.api.Serve(ctx, lookupapi.Request{Method: method, Path: path, Query: query, RequestID: requestID})
}

func (h *handler) respond(ctx context.Context, v any) ([]byte, error) {
	status := 0
	switch r := v.(type) {
	case events.APIGatewayV2HTTPResponse:
		status = r.StatusCode
	case events.APIGatewayProxyResponse:
		status = r.StatusCode
	case events.ALBTargetGroupResponse:
		status = r.StatusCode
	case lookupapi.DirectResponse:
		status = r.Status
	}
	h.env.RequestLogger(ctx).InfoContext(ctx, "lookup answered", "status", status)
	b, err := json.Marshal(v)
	if err != nil {
		h.env.RequestLogger(ctx).ErrorContext(ctx, "lookup answer failed to encode", "error", err)
	}
	return b, err
}

// statusLine is an HTTP status line's code and reason, as an ALB answer's
// statusDescription carries them ("400 Bad Request").
func statusLine(status int) string {
	return strconv.Itoa(status) + " " + http.StatusText(status)
}

type payloadError struct{ err error }

func (e payloadError) Error() string        { return "malformed request: " + e.err.Error() }
func (e payloadError) Is(target error) bool { return target == lookupapi.ErrBadRequest }

// badPayload wraps a payload that could not be read as a bad request. A
// JSON value of the wrong type is said in JSON's terms: encoding/json's own
// message names the Go struct and type it was decoding into, which are this
// code's internals, not the client's.
func badPayload(err error) error {
	if te := (*json.UnmarshalTypeError)(nil); errors.As(err, &te) {
		err = fmt.Errorf("%s: expected %s, got %s", cmp.Or(te.Field, "the payload"), strictjson.Kind(te.Type), te.Value)
	}
	return payloadError{err}
}

// lazyReader opens the pool on the first lookup of the execution environment
// and keeps the reader for every lookup after it.
type lazyReader struct {
	*database.Lazy[*archive.Reader]
}

func newLazyReader(env *fnenv.Env) lazyReader {
	return lazyReader{database.NewLazy(func(ctx context.Context) (*archive.Reader, error) {
		pool, err := env.DB.Get(ctx)
		if err != nil {
			return nil, err
		}
		return archive.NewReader(pool, env.Settings.Archive, env.Metrics)
	}, nil)}
}

func (l lazyReader) Lookup(ctx context.Context, key string, fp []byte) (archive.Record, error) {
	r, err := l.Get(ctx)
	if err != nil {
		return archive.Record{}, err
	}
	return r.Lookup(ctx, key, fp)
}

func (l lazyReader) Investigate(ctx context.Context, q archive.Query) (archive.Page, error) {
	r, err := l.Get(ctx)
	if err != nil {
		return archive.Page{}, err
	}
	return r.Investigate(ctx, q)
}
