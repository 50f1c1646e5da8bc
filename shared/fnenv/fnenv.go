// Package fnenv is what every Lambda function of this project sets up once per
// execution environment: validated settings, a JSON logger, the EMF metrics
// emitter, the AWS configuration (traced) and the lazily created pool.
//
//	env, err := fnenv.Load(ctx, os.Getenv)
//	lambda.StartWithOptions(handler, lambda.WithEnableSIGTERM(env.Close))
package fnenv

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"runtime/debug"
	"slices"
	"strings"

	"github.com/aws/aws-lambda-go/lambdacontext"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemarchive/idemarchive/shared/database"
	"github.com/idemarchive/idemarchive/shared/metrics"
	"github.com/idemarchive/idemarchive/shared/settings"
	"github.com/idemarchive/idemarchive/shared/strictjson"
	"github.com/idemarchive/idemarchive/shared/tracing"
	"github.com/idemarchive/idemarchive/shared/tracing/xraytracing"
)

// Env is one function's execution environment.
type Env struct {
	Settings settings.Settings
	Logger   *slog.Logger
	Metrics  *metrics.Emitter
	DB       *database.Lazy[*pgxpool.Pool]
}

// DefaultMaxConns is the pool size of a function: one invocation at a time
// runs in an execution environment, so two connections are plenty.
const DefaultMaxConns = 2

// Load reads and validates the settings and prepares (without connecting)
// everything a handler needs. Logs go to stderr as JSON; metric lines to
// stdout. Neither ever carries the connection string.
func Load(ctx context.Context, getenv func(string) string, stdout, stderr io.Writer) (*Env, error) {
	// The functions trace with X-Ray (a no-op in a notrace build); the
	// library packages they share with payment APIs link no tracer.
	xraytracing.Install()
	s, err := settings.FromEnv(getenv)
	if err != nil {
		return nil, fmt.Errorf("configuration: %w", err)
	}
	if s, err = s.WithDefaultPoolSize(DefaultMaxConns); err != nil {
		return nil, fmt.Errorf("configuration: %w", err)
	}
	env := &Env{
		Settings: s,
		Logger:   slog.New(slog.NewJSONHandler(stderr, nil)),
		Metrics:  metrics.New(stdout, s.MetricsNamespace),
	}
	var awsCfg *aws.Config
	if s.Database.SecretARN != "" || s.Database.IAMAuth {
		c, err := AWSConfig(getenv)
		if err != nil {
			return nil, fmt.Errorf("AWS configuration: %w", err)
		}
		tracing.InstrumentAWS(&c)
		awsCfg = &c
	}
	env.DB = database.NewLazy(func(ctx context.Context) (*pgxpool.Pool, error) {
		return database.Open(ctx, s.Database, awsCfg)
	}, (*pgxpool.Pool).Close)
	return env, nil
}

// AWSConfig returns a function's AWS configuration from the variables the
// Lambda runtime sets: the region (AWS_REGION, else AWS_DEFAULT_REGION),
// the execution role's credentials (AWS_ACCESS_KEY_ID,
// AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN; `sam local invoke` passes the
// caller's) and, where set, an endpoint for every service (AWS_ENDPOINT_URL,
// as LocalStack sets it).
//
// Not the SDK's config.LoadDefaultConfig: a function reads its credentials
// from these variables whichever way it loads them, and the shared-file,
// SSO, STS and instance-metadata providers the loader links in cost each
// function's bootstrap about 2 MB and their package init a part of every
// cold start (BENCHMARKS.md, measurement 5); the lookup function is on a
// payment's path. Missing settings fail the function's init with a clear
// line rather than its first connection.
func AWSConfig(getenv func(string) string) (c aws.Config, err error) {
	// Read trimmed, as settings reads every variable, and a variable set to
	// blanks alone is refused: the message names it and never holds a value.
	get := func(name string) string {
		v := strings.TrimSpace(getenv(name))
		if v == "" && getenv(name) != "" && err == nil {
			err = fmt.Errorf("%s is set to blanks only: unset it or give it a value", name)
		}
		return v
	}
	region := get("AWS_REGION")
	if region == "" {
		region = get("AWS_DEFAULT_REGION")
	}
	id, secret, token, endpoint := get("AWS_ACCESS_KEY_ID"), get("AWS_SECRET_ACCESS_KEY"), get("AWS_SESSION_TOKEN"), get("AWS_ENDPOINT_URL")
	switch {
	case err != nil:
		return aws.Config{}, err
	case region == "":
		return aws.Config{}, errors.New("AWS_REGION is not set (the Lambda runtime sets it)")
	case id == "" || secret == "":
		return aws.Config{}, errors.New("AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY must both be set (the Lambda runtime sets them from the function's role)")
	}
	c = aws.Config{
		Region:      region,
		Credentials: credentials.NewStaticCredentialsProvider(id, secret, token),
	}
	if endpoint != "" {
		c.BaseEndpoint = aws.String(endpoint)
	}
	return c, nil
}

// MustLoad is Load for main: on error it prints one line and exits, which
// Lambda reports as an init error.
func MustLoad() *Env {
	env, err := Load(context.Background(), os.Getenv, os.Stdout, os.Stderr)
	if err != nil {
		// One line, no secret: a connection string pasted into another
		// variable is echoed by its error.
		fmt.Fprintln(os.Stderr, "init:", settings.Redact(strings.ReplaceAll(err.Error(), "\n", " ")))
		os.Exit(1)
	}
	return env
}

// Close releases the pool; it is the SIGTERM callback.
func (e *Env) Close() { e.DB.Close() }

// RequestID returns the Lambda request id of ctx, or "".
func RequestID(ctx context.Context) string {
	if lc, ok := lambdacontext.FromContext(ctx); ok {
		return lc.AwsRequestID
	}
	return ""
}

// RequestLogger returns the logger with the invocation's request id.
func (e *Env) RequestLogger(ctx context.Context) *slog.Logger {
	return e.Logger.With("request_id", RequestID(ctx))
}

// DecodeInput decodes the options of a scheduled function into v. It accepts
// an empty or null payload (no options), a direct JSON object of options, or
// an EventBridge event whose "detail" holds the options (an empty detail, as
// a plain schedule sends, means none). Unknown option names are errors, so a
// misspelt override never passes silently; so are ambiguous ones.
//
// These options act (a shorter retention drops months), so an object whose
// meaning depends on which of two readings wins is refused: a name given
// twice, or in two spellings encoding/json takes for one ("dry_run" and
// "DRY_RUN": it keeps the last, and matches names regardless of case), and
// an option beside an EventBridge event's detail instead of in it (it
// would be ignored: {"detail-type": ..., "detail": {"retention_months": 1},
// "dry_run": true} is not a dry run).
//
// Its errors speak of the payload's JSON, never of Go's types. The payload
// must be one JSON value: a second one after it ({"retention_months": 1}
// {"dry_run": true}) is refused, never read as the first alone (Raw hands
// the payload over whole).
func DecodeInput(payload []byte, v any) error {
	payload = bytes.TrimSpace(payload)
	if len(payload) == 0 || bytes.Equal(payload, []byte("null")) {
		return nil
	}
	if err := json.Unmarshal(payload, new(json.RawMessage)); err != nil {
		return fmt.Errorf("payload is not JSON: %w", err)
	}
	if payload[0] != '{' {
		return fmt.Errorf("payload must be a JSON object of options, or an EventBridge event, got %s", jsonKind(payload))
	}
	var probe struct {
		DetailType json.RawMessage `json:"detail-type"`
		Detail     json.RawMessage `json:"detail"`
	}
	if err := json.Unmarshal(payload, &probe); err != nil {
		return fmt.Errorf("payload is not a JSON object: %w", err)
	}
	names, err := objectNames(payload)
	if err != nil {
		return err
	}
	if probe.DetailType != nil {
		if probe.DetailType[0] != '"' {
			return fmt.Errorf("invalid EventBridge event: detail-type must be a string, got %s", jsonKind(probe.DetailType))
		}
		if d := bytes.TrimSpace(probe.Detail); len(d) > 0 && d[0] != '{' && !bytes.Equal(d, []byte("null")) {
			return fmt.Errorf("invalid EventBridge event: detail must be a JSON object of options, got %s", jsonKind(d))
		}
		for _, n := range names {
			if slices.ContainsFunc(strictjson.FieldNames(v), func(o string) bool { return strings.EqualFold(n, o) }) {
				return fmt.Errorf("invalid options: %q is beside the EventBridge event's detail, where it would be ignored: put the options in detail", n)
			}
		}
		payload = bytes.TrimSpace(probe.Detail)
		if len(payload) == 0 || bytes.Equal(payload, []byte("null")) {
			return nil
		}
		if names, err = objectNames(payload); err != nil {
			return err
		}
	}
	// A null option would read as its zero value ("dry_run": null as
	// false, a run that acts), or as not given: refused, as meaning two
	// things.
	var members map[string]json.RawMessage
	if json.Unmarshal(payload, &members) == nil {
		for _, n := range names {
			if string(members[n]) == "null" {
				return fmt.Errorf("invalid options: %q is null: leave it out for the configured value, or give one", n)
			}
		}
	}
	dec := json.NewDecoder(bytes.NewReader(payload))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		if te := (*json.UnmarshalTypeError)(nil); errors.As(err, &te) && te.Field != "" {
			return fmt.Errorf("invalid options: %s must be %s, got %s", te.Field, strictjson.Kind(te.Type), te.Value)
		}
		return fmt.Errorf("invalid options: %w", err)
	}
	return nil
}

// jsonKind names the kind of a JSON value by its first byte.
func jsonKind(value []byte) string {
	switch value[0] {
	case '{':
		return "an object"
	case '[':
		return "an array"
	case '"':
		return "a string"
	case 't', 'f':
		return "true or false"
	case 'n':
		return "null"
	}
	return "a number"
}

// Raw adapts a scheduled function's handler to aws-lambda-go's Handler, so
// that it is given the invocation's payload whole. aws-lambda-go's typed
// handlers decode the first JSON value of a payload and drop the rest: of
// {"retention_months": 1} {"dry_run": true} a partitions run would act on
// the first, dropping months. DecodeInput refuses such a payload.
//
// A panic of fn is answered ErrPanicked, and logged on logger with its
// stack (Recover).
func Raw[T any](logger *slog.Logger, fn func(context.Context, json.RawMessage) (T, error)) interface {
	Invoke(context.Context, []byte) ([]byte, error)
} {
	return rawHandler[T]{fn: fn, logger: logger}
}

type rawHandler[T any] struct {
	fn     func(context.Context, json.RawMessage) (T, error)
	logger *slog.Logger
}

func (h rawHandler[T]) Invoke(ctx context.Context, payload []byte) (answer []byte, err error) {
	defer Recover(ctx, h.logger, &err)
	out, err := h.fn(ctx, payload)
	if err != nil {
		return nil, err
	}
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(out); err != nil {
		return nil, fmt.Errorf("encode the answer: %w", err)
	}
	return bytes.TrimSuffix(b.Bytes(), []byte("\n")), nil // as aws-lambda-go answers
}

// ErrPanicked is the error of an invocation whose handler panicked.
var ErrPanicked = errors.New("the function failed: its log has the details")

// Recover, deferred in a handler with err its named error, turns a panic
// into ErrPanicked and logs the panic with its stack on logger: left to
// aws-lambda-go, the invoker would be answered the stack trace and the
// process would end.
func Recover(ctx context.Context, logger *slog.Logger, err *error) {
	if p := recover(); p != nil {
		logger.ErrorContext(ctx, "the function panicked", "request_id", RequestID(ctx), "panic", fmt.Sprint(p), "stack", string(debug.Stack()))
		*err = ErrPanicked
	}
}

// objectNames returns the names of a JSON object's members, refusing a name
// given twice, in the same spelling or in two that encoding/json matches
// alike (regardless of case).
func objectNames(object []byte) ([]string, error) {
	names, err := strictjson.Members(object)
	if dup := (*strictjson.DuplicateError)(nil); errors.As(err, &dup) {
		return nil, fmt.Errorf("invalid options: %q and %q name the same option: give it once", dup.First, dup.Second)
	}
	if err != nil {
		return nil, fmt.Errorf("payload is %w", err)
	}
	return names, nil
}
