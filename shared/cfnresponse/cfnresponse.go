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
	// AttemptTimeout bounds each PUT. Default DefaultAttemptTimeout.
	AttemptTimeout time.Duration
	// Attempts is how many times the PUT is tried before the answer is
	// given up. Default 3.
	Attempts int
	// Logger receives a handler's panic, with its stack. Default
	// slog.Default().
	Logger *slog.Logger
}

// Wrap returns a Lambda handler that runs fn and answers CloudFormation with
// its outcome: SUCCESS with its physical id and data, or FAILED with its
// error's text as the reason (also when fn panics). It returns an error only
// when the answer could not be delivered, without the URL's query string.
func Wrap(fn cfn.CustomResourceFunction, opts Options) func(context.Context, cfn.Event) error {
	opts.AttemptTimeout = cmp.Or(opts.AttemptTimeout, DefaultAttemptTimeout)
	opts.Attempts = cmp.Or(opts.Attempts, 3)
	if opts.Client == nil {
		opts.Client = &http.Client{Transport: http.DefaultTransport.(*http.Transport).Clone()}
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	return func(ctx context.Context, ev cfn.Event) error {
		resp := cfn.NewResponse(&ev)
		resp.PhysicalResourceID, resp.Data, resp.Status, resp.Reason = run(ctx, fn, ev, opts.Logger)
		if resp.PhysicalResourceID == "" {
			// CloudFormation refuses an answer without one, and shows
			// "Invalid PhysicalResourceId" instead of the reason.
			resp.PhysicalResourceID = cmp.Or(ev.PhysicalResourceID, ev.LogicalResourceID)
		}
		return send(ctx, opts, ev.ResponseURL, resp)
	}
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
		return id, nil, cfn.StatusFailed, err.Error()
	}
	return id, data, cfn.StatusSuccess, ""
}

// send PUTs the answer, trying again after a failed attempt while ctx lasts.
func send(ctx context.Context, opts Options, rawURL string, resp *cfn.Response) error {
	body, err := json.Marshal(resp)
	if err != nil {
		return fmt.Errorf("answer CloudFormation: %w", err)
	}
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
