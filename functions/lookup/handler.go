package main

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"reflect"
	"strconv"
	"strings"

	"github.com/aws/aws-lambda-go/events"

	"github.com/idemarchive/idemarchive/shared/archive"
	"github.com/idemarchive/idemarchive/shared/database"
	"github.com/idemarchive/idemarchive/shared/fnenv"
	"github.com/idemarchive/idemarchive/shared/lookupapi"
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

func (h *handler) Invoke(ctx context.Context, payload []byte) ([]byte, error) {
	requestID := fnenv.RequestID(ctx)
	var sh shape
	if err := json.Unmarshal(payload, &sh); err != nil {
		// An API Gateway event whose fields are not of their types is
		// answered in an event's shape, as below.
		var fields map[string]json.RawMessage
		if json.Unmarshal(payload, &fields) == nil {
			r := h.api.ErrorResponse(ctx, badPayload(err), requestID)
			if _, ok := fields["rawPath"]; ok {
				return h.respond(ctx, events.APIGatewayV2HTTPResponse{StatusCode: r.Status, Headers: r.Headers, Body: string(r.Body)})
			}
			if _, ok := fields["httpMethod"]; ok {
				return h.respond(ctx, events.APIGatewayProxyResponse{StatusCode: r.Status, Headers: r.Headers, Body: string(r.Body)})
			}
		}
		return h.respond(ctx, h.api.DirectProblem(ctx, badPayload(err), requestID))
	}
	switch {
	case sh.Version == "2.0" && sh.RawPath != "":
		var ev events.APIGatewayV2HTTPRequest
		var r lookupapi.Response
		if err := json.Unmarshal(payload, &ev); err != nil {
			// Answered in the event's shape: API Gateway reads an answer
			// without a statusCode as a 200 whose body it is.
			r = h.api.ErrorResponse(ctx, badPayload(err), requestID)
		} else if name, ok := repeated(names(ev.RawQueryString)); ok {
			r = h.api.ErrorResponse(ctx, badPayload(repeatedError(name)), requestID)
		} else if functionURL(ev.RequestContext.DomainName) {
			// Function URLs deliver rawPath as the client sent it.
			r = h.serveEncoded(ctx, ev.RequestContext.HTTP.Method, ev.RawPath, ev.QueryStringParameters, requestID)
		} else {
			// HTTP APIs deliver rawPath already percent-decoded.
			r = h.api.Serve(ctx, lookupapi.Request{Method: ev.RequestContext.HTTP.Method, Path: ev.RawPath, Query: ev.QueryStringParameters, RequestID: requestID})
		}
		return h.respond(ctx, events.APIGatewayV2HTTPResponse{StatusCode: r.Status, Headers: r.Headers, Body: string(r.Body)})

	case sh.HTTPMethod != "" && sh.Version == "1.0":
		r := h.api.ErrorResponse(ctx, badPayload(errPayloadV1), requestID)
		return h.respond(ctx, events.APIGatewayProxyResponse{StatusCode: r.Status, Headers: r.Headers, Body: string(r.Body)})

	case sh.HTTPMethod != "" && len(sh.RequestContext.ELB) > 0 && string(sh.RequestContext.ELB) != "null":
		// An ALB answer needs statusDescription as well; the rest of a
		// REST answer is what it reads.
		r := h.api.ErrorResponse(ctx, badPayload(errALB), requestID)
		return h.respond(ctx, events.ALBTargetGroupResponse{StatusCode: r.Status, StatusDescription: statusLine(r.Status), Headers: r.Headers, Body: string(r.Body)})

	case sh.HTTPMethod != "":
		var ev events.APIGatewayProxyRequest
		if err := json.Unmarshal(payload, &ev); err != nil {
			r := h.api.ErrorResponse(ctx, badPayload(err), requestID)
			return h.respond(ctx, events.APIGatewayProxyResponse{StatusCode: r.Status, Headers: r.Headers, Body: string(r.Body)})
		}
		if name, ok := repeated(ev.MultiValueQueryStringParameters); ok {
			r := h.api.ErrorResponse(ctx, badPayload(repeatedError(name)), requestID)
			return h.respond(ctx, events.APIGatewayProxyResponse{StatusCode: r.Status, Headers: r.Headers, Body: string(r.Body)})
		}
		// REST APIs deliver the path still percent-encoded.
		r := h.serveEncoded(ctx, ev.HTTPMethod, ev.Path, ev.QueryStringParameters, requestID)
		return h.respond(ctx, events.APIGatewayProxyResponse{StatusCode: r.Status, Headers: r.Headers, Body: string(r.Body)})

	default:
		var req lookupapi.DirectRequest
		dec := json.NewDecoder(bytes.NewReader(payload))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&req); err != nil {
			return h.respond(ctx, h.api.DirectProblem(ctx, badPayload(err), requestID))
		}
		return h.respond(ctx, h.api.Direct(ctx, req, requestID))
	}
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
		err = fmt.Errorf("%s: expected %s, got %s", cmp.Or(te.Field, "the payload"), jsonKind(te.Type), te.Value)
	}
	return payloadError{err}
}

// jsonKind names the JSON value a Go type decodes from.
func jsonKind(t reflect.Type) string {
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
		return "a whole number in range"
	case reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.Slice, reflect.Array:
		return "an array"
	case reflect.Map, reflect.Struct:
		return "an object"
	case reflect.Pointer:
		return jsonKind(t.Elem())
	}
	return "another value"
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
