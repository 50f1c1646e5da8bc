// Package cfnresponse answers CloudFormation custom resource events: it runs
// a handler and PUTs its outcome to the event's pre-signed response URL.
//
// It replaces aws-lambda-go's cfn.LambdaWrap, which sends the answer through
// http.DefaultClient (no timeout: a response URL that stops answering holds
// the function until Lambda kills it, and CloudFormation then waits for its
// ServiceTimeout) and returns the raw *url.Error of a failed PUT, whose text
// carries the URL's signature into the function's log (anyone who can read
// the log could then answer for the function while the URL is valid).
//
//	lambda.Start(cfnresponse.Wrap(handle, cfnresponse.Options{}))
package cfnresponse

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"runtime/debug"
	"strings"
	"time"

	"github.com/aws/aws-lambda-go/cfn"
)

// DefaultAttemptTimeout bounds each PUT of the answer.
const DefaultAttemptTimeout = 10 * time.Second

// Options configures Wrap.
type Options struct {
	// Client sends the answer. Default: an http.Client of its own (proxy
	// settings from the environment), each attempt bounded by
	// AttemptTimeout.
	Client *http.Client
	// AttemptTimeout bounds each PUT. Default (zero or less)
	// DefaultAttemptTimeout.
	AttemptTimeout time.Duration
	// Attempts is how many times the PUT is tried before the answer is
	// given up. Default (zero or less) 3: an answer is always tried.
	Attempts int
	// Logger receives a handler's panic, with its stack. Default
	// slog.Default().
	Logger *slog.Logger
	// SendMargin is kept free for the answer before the invocation's
	// deadline: the handler's context ends that much earlier. Default (zero
	// or less: a margin past the deadline leaves no time to answer)
	// DefaultSendMargin.
	SendMargin time.Duration
}

// DefaultSendMargin is Options.SendMargin's default.
const DefaultSendMargin = 10 * time.Second

// MaxResponseBytes is the largest answer CloudFormation takes; a longer one
// fails the resource with "Response is too long" instead of its reason.
const MaxResponseBytes = 4096

// Wrap returns a Lambda handler that runs fn and answers CloudFormation with
// its outcome: SUCCESS with its physical id and data, or FAILED with its
// error's text as the reason (also when fn panics). It returns an error only
// when the answer could not be delivered, without the URL's query string.
func Wrap(fn cfn.CustomResourceFunction, opts Options) func(context.Context, cfn.Event) error {
	opts.AttemptTimeout = orDefault(opts.AttemptTimeout, DefaultAttemptTimeout)
	opts.Attempts = orDefault(opts.Attempts, 3)
	opts.SendMargin = orDefault(opts.SendMargin, DefaultSendMargin)
	if opts.Client == nil {
		opts.Client = &http.Client{
			Transport: http.DefaultTransport.(*http.Transport).Clone(),
			// A redirect would turn the PUT into a GET, whose 200 would
			// pass for a delivered answer: it is an answer not delivered.
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		}
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	return func(ctx context.Context, ev cfn.Event) error {
		// The handler stops SendMargin before the deadline; the answer is
		// sent even when the handler used all of its time, up to the
		// deadline itself.
		runCtx, sendCtx := ctx, context.WithoutCancel(ctx)
		if deadline, ok := ctx.Deadline(); ok {
			var cancelRun, cancelSend context.CancelFunc
			runCtx, cancelRun = context.WithDeadline(ctx, deadline.Add(-opts.SendMargin))
			defer cancelRun()
			sendCtx, cancelSend = context.WithDeadline(sendCtx, deadline)
			defer cancelSend()
		}
		resp := cfn.NewResponse(&ev)
		resp.PhysicalResourceID, resp.Data, resp.Status, resp.Reason = run(runCtx, fn, ev, opts.Logger)
		if resp.PhysicalResourceID == "" {
			// CloudFormation refuses an answer without one, and shows
			// "Invalid PhysicalResourceId" instead of the reason.
			resp.PhysicalResourceID = cmp.Or(ev.PhysicalResourceID, ev.LogicalResourceID)
		}
		body, err := encode(resp, cmp.Or(ev.PhysicalResourceID, ev.LogicalResourceID))
		if err != nil {
			return fmt.Errorf("answer CloudFormation: %w", err)
		}
		return send(sendCtx, opts, ev.ResponseURL, body)
	}
}

// encode returns the answer's JSON, made to fit MaxResponseBytes: a reason
// too long is cut (the function's log has it whole), and Data that JSON
// cannot hold (NaN) or that does not fit turns the answer into a FAILED one
// that says so, rather than an answer CloudFormation never gets; so does a
// physical id too long to fit beside any reason, answered FAILED under
// fallbackID (the resource's own id, or its logical id on a create).
func encode(resp *cfn.Response, fallbackID string) ([]byte, error) {
	idBytes := len(resp.PhysicalResourceID)
	body, err := json.Marshal(resp)
	if err != nil || len(body) > MaxResponseBytes && len(resp.Data) > 0 {
		why := fmt.Sprintf("its Data does not fit in the %d bytes CloudFormation takes, beside its physical resource id (%d bytes)", MaxResponseBytes, idBytes)
		if err != nil {
			why = "its Data cannot be written as JSON: " + err.Error()
		}
		resp.Status, resp.Data, resp.NoEcho = cfn.StatusFailed, nil, false
		resp.Reason = "the function's answer was dropped: " + why
		if body, err = json.Marshal(resp); err != nil {
			return nil, err
		}
	}
	if len(body) <= MaxResponseBytes {
		return body, nil
	}
	const cut = "... (the function's log has the rest)"
	reason := []rune(resp.Reason)
	// The longest prefix of the reason, in whole runes, whose answer fits:
	// found by its encoded length, as JSON escapes make '<' or '"' longer
	// than a byte and a rune may be four.
	withReason := func(n int) ([]byte, error) {
		resp.Reason = string(reason[:n]) + cut
		return json.Marshal(resp)
	}
	lo, hi := -1, len(reason) // the answer with reason[:lo] fits (-1: not known to), with reason[:hi] does not
	for hi-lo > 1 {
		mid := lo + (hi-lo)/2
		b, err := withReason(mid)
		if err != nil {
			return nil, err
		}
		if len(b) <= MaxResponseBytes {
			lo = mid
		} else {
			hi = mid
		}
	}
	if lo >= 0 {
		return withReason(lo)
	}
	resp.Status, resp.Data, resp.NoEcho = cfn.StatusFailed, nil, false
	resp.PhysicalResourceID = fallbackID
	resp.Reason = fmt.Sprintf("the function's answer was dropped: its physical resource id (%d bytes) is longer than CloudFormation takes", idBytes)
	if body, err = json.Marshal(resp); err != nil {
		return nil, err
	}
	if len(body) > MaxResponseBytes {
		return nil, fmt.Errorf("an answer of %d bytes cannot be cut to the %d CloudFormation takes", len(body), MaxResponseBytes)
	}
	return body, nil
}

// orDefault is v, or def where v is zero or less.
func orDefault[T int | time.Duration](v, def T) T {
	if v <= 0 {
		return def
	}
	return v
}

// run calls fn, turning its error or panic into a FAILED status.
func run(ctx context.Context, fn cfn.CustomResourceFunction, ev cfn.Event, log *slog.Logger) (id string, data map[string]any, status cfn.StatusType, reason string) {
	defer func() {
		if p := recover(); p != nil {
			log.ErrorContext(ctx, "custom resource handler panicked", "panic", fmt.Sprint(p), "stack", string(debug.Stack()))
			id, data, status, reason = ev.PhysicalResourceID, nil, cfn.StatusFailed, "the function panicked: its log has the details"
		}
	}()
	id, data, err := fn(ctx, ev)
	if err != nil {
		// CloudFormation shows the reason as the resource's failure: never
		// none.
		return id, nil, cfn.StatusFailed, cmp.Or(strings.TrimSpace(err.Error()), "the function failed without saying why")
	}
	return id, data, cfn.StatusSuccess, ""
}

// send PUTs the answer, trying again after a failed attempt while ctx lasts.
func send(ctx context.Context, opts Options, rawURL string, body []byte) error {
	where := redact(rawURL)
	var last error
	for attempt := range opts.Attempts {
		if attempt > 0 {
			select {
			case <-ctx.Done():
				return fmt.Errorf("answer CloudFormation at %s: %w (after: %w)", where, ctx.Err(), last)
			case <-time.After(time.Duration(attempt) * 500 * time.Millisecond):
			}
		}
		if last = put(ctx, opts, rawURL, body); last == nil {
			return nil
		}
	}
	return fmt.Errorf("answer CloudFormation at %s: %d attempts failed, the last: %w", where, opts.Attempts, last)
}

func put(ctx context.Context, opts Options, rawURL string, body []byte) error {
	ctx, cancel := context.WithTimeout(ctx, opts.AttemptTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPut, rawURL, bytes.NewReader(body))
	if err != nil {
		return errors.New("the response URL is not a URL")
	}
	// The URL is pre-signed without a content type: S3 refuses a PUT that
	// sends one.
	req.Header.Del("Content-Type")
	res, err := opts.Client.Do(req)
	if err != nil {
		var uerr *url.Error
		if errors.As(err, &uerr) {
			return uerr.Err // its text would carry the URL
		}
		return err
	}
	defer res.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(res.Body, 64<<10))
	if res.StatusCode != http.StatusOK {
		return fmt.Errorf("the response URL answered %s", res.Status)
	}
	return nil
}

// redact returns the URL without its query string (the signature) and
// user information.
func redact(rawURL string) string {
	u, err := url.Parse(rawURL)
	if err != nil {
		return "(an unparsable response URL)"
	}
	u.User, u.RawQuery, u.ForceQuery, u.Fragment = nil, "", false, ""
	return u.Redacted()
}
