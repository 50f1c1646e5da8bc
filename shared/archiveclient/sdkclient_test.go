package archiveclient_test

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/lambda"
	smithyendpoints "github.com/aws/smithy-go/endpoints"
	"github.com/stretchr/testify/require"

	"github.com/idemarchive/idemarchive/shared/archive"
	"github.com/idemarchive/idemarchive/shared/archiveclient"
	"github.com/idemarchive/idemarchive/shared/idempotency"
	"github.com/idemarchive/idemarchive/shared/lookupapi"
)

// A client whose every invocation fails before a request is sent fails
// without a Lambda error code, which a lookup cannot tell from an outage:
// under FailOpen every late retry of an archived key would run again. Such a
// client is refused by Validate, so idempotency.New refuses it, and every
// lookup through it is archive.ErrMisconfigured, which is never failed open on.
func TestAClientThatCanNeverInvokeIsRefused(t *testing.T) {
	t.Parallel()
	creds := credentials.NewStaticCredentialsProvider("AKIDEXAMPLE", "secret", "")
	for _, tc := range []struct {
		name   string
		client *lambda.Client
		want   string
	}{
		{"never made", &lambda.Client{}, "not made with lambda.New"},
		{"no region", lambda.New(lambda.Options{Credentials: creds}), "no AWS region"},
		{"a region with spaces", lambda.New(lambda.Options{Region: "eu west 1", Credentials: creds}), `region "eu west 1" is not a host name label`},
		{"a region starting with a hyphen", lambda.New(lambda.Options{Region: "-eu-west-1", Credentials: creds}), "is not a host name label"},
		{"a region ending with a hyphen", lambda.New(lambda.Options{Region: "eu-west-1-", Credentials: creds}), "is not a host name label"},
		{"an empty label", lambda.New(lambda.Options{Region: "eu..west", Credentials: creds}), "is not a host name label"},
		{"empty static credentials", lambda.New(lambda.Options{Region: "eu-west-1", Credentials: credentials.NewStaticCredentialsProvider("", "", "")}), "static credentials"},
		{"empty static credentials, cached", lambda.NewFromConfig(aws.Config{Region: "eu-west-1", Credentials: aws.NewCredentialsCache(credentials.NewStaticCredentialsProvider("", "", ""))}), "static credentials"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := archiveclient.Lambda{Client: tc.client, FunctionName: "idemarchive-lookup"}
			err := c.Validate()
			require.ErrorContains(t, err, tc.want)
			_, err = idempotency.New(idempotency.Config{Store: freshStore{}, Archive: c, SingleTenant: true, OnArchiveError: idempotency.FailOpen})
			require.ErrorContains(t, err, tc.want, "idempotency.New built a middleware on it")
			require.NotPanics(t, func() { _, err = c.Lookup(context.Background(), "idem:v1:k", nil) })
			require.ErrorIs(t, err, archive.ErrMisconfigured)
		})
	}
}

// What a working client looks like passes: a region with static
// credentials, or no region with an endpoint of one's own (LocalStack).
func TestAClientThatCanInvokePasses(t *testing.T) {
	t.Parallel()
	creds := credentials.NewStaticCredentialsProvider("AKIDEXAMPLE", "secret", "")
	for name, client := range map[string]*lambda.Client{
		"a region":                        lambda.New(lambda.Options{Region: "eu-west-1", Credentials: creds}),
		"a GovCloud region":               lambda.New(lambda.Options{Region: "us-gov-west-1", Credentials: creds}),
		"an endpoint and no region":       lambda.New(lambda.Options{BaseEndpoint: aws.String("http://localhost:4566"), Credentials: creds}),
		"no credentials (anonymous)":      lambda.New(lambda.Options{Region: "eu-west-1"}),
		"from config, region and a cache": lambda.NewFromConfig(aws.Config{Region: "eu-west-1", Credentials: aws.NewCredentialsCache(creds)}),
	} {
		require.NoError(t, archiveclient.Lambda{Client: client, FunctionName: "idemarchive-lookup"}.Validate(), name)
	}
}

// The middleware refuses an ArchiveTimeout under archive.MinLookupTimeout;
// the client's own Timeout bounds the same lookup and is held to the same
// floor (zero is 2s).
func TestATimeoutTooShortForAnyInvocationIsRefused(t *testing.T) {
	t.Parallel()
	f := &function{out: archived}
	for _, d := range []time.Duration{time.Nanosecond, time.Microsecond, archive.MinLookupTimeout - 1, -time.Second} {
		c := archiveclient.Lambda{Client: f, FunctionName: "lookup", Timeout: d}
		require.ErrorContains(t, c.Validate(), "Timeout must be at least 10ms", "%s", d)
		_, err := idempotency.New(idempotency.Config{Store: freshStore{}, Archive: c, SingleTenant: true, OnArchiveError: idempotency.FailOpen})
		require.Error(t, err, "%s", d)
		_, err = c.Lookup(context.Background(), "idem:v1:k", nil)
		require.ErrorIs(t, err, archive.ErrMisconfigured, "%s", d)
	}
	for _, d := range []time.Duration{0, archive.MinLookupTimeout, time.Minute} {
		require.NoError(t, archiveclient.Lambda{Client: f, FunctionName: "lookup", Timeout: d}.Validate(), "%s", d)
	}
}

// A RequestResponse invocation the function answered is a 200. A 202
// (queued, not run) or 204 (dry run) carries no answer of the function's:
// its payload is not read, not even a not-found one.
func TestOnlyA200CarriesTheFunctionsAnswer(t *testing.T) {
	t.Parallel()
	notFound := []byte(`{"status":404,"problem":{"code":"key_not_found"}}`)
	lookup := func(code int32) error {
		f := &function{out: func(lookupapi.DirectRequest) *lambda.InvokeOutput {
			return &lambda.InvokeOutput{StatusCode: code, Payload: notFound}
		}}
		_, err := archiveclient.Lambda{Client: f, FunctionName: "lookup"}.Lookup(context.Background(), "idem:v1:k", nil)
		return err
	}
	for _, code := range []int32{202, 204, 201, 299, 500} {
		err := lookup(code)
		require.ErrorIs(t, err, archiveclient.ErrUnavailable, "HTTP %d", code)
		require.NotErrorIs(t, err, archive.ErrNotFound, "HTTP %d was read as not found", code)
		require.True(t, strings.Contains(err.Error(), "not 200"), "%v", err)
	}
	// 200, and 0 from an Invoker written by hand, are read.
	for _, code := range []int32{200, 0} {
		require.ErrorIs(t, lookup(code), archive.ErrNotFound, "HTTP %d", code)
	}
}

type fixedResolver struct{ u string }

func (f fixedResolver) ResolveEndpoint(_ context.Context, _ lambda.EndpointParameters) (smithyendpoints.Endpoint, error) {
	u, err := url.Parse(f.u)
	if err != nil {
		return smithyendpoints.Endpoint{}, err
	}
	return smithyendpoints.Endpoint{URI: *u}, nil
}

// A client with its own endpoint resolver (the SDK's legacy
// EndpointResolverWithOptions, which also names the signing region, or an
// EndpointResolverV2) and no client region invokes fine: the SDK signs and
// sends every request, and Validate lets it through.
func TestAClientWithItsOwnResolverAndNoRegionPasses(t *testing.T) {
	t.Parallel()
	var calls atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"status":404,"problem":{"code":"key_not_found"}}`))
	}))
	t.Cleanup(srv.Close)
	creds := credentials.NewStaticCredentialsProvider("AKIDEXAMPLE", "secret", "")
	legacy := aws.EndpointResolverWithOptionsFunc(func(service, region string, _ ...interface{}) (aws.Endpoint, error) {
		return aws.Endpoint{URL: srv.URL, SigningRegion: "eu-west-1"}, nil
	})
	for name, client := range map[string]*lambda.Client{
		"legacy resolver with its signing region": lambda.NewFromConfig(aws.Config{EndpointResolverWithOptions: legacy, Credentials: creds}),
		"EndpointResolverV2":                      lambda.New(lambda.Options{EndpointResolverV2: fixedResolver{srv.URL}, Credentials: creds}),
	} {
		t.Run(name, func(t *testing.T) {
			before := calls.Load()
			_, err := client.Invoke(context.Background(), &lambda.InvokeInput{FunctionName: aws.String("idemarchive-lookup"), Payload: []byte(`{}`)})
			require.NoError(t, err, "the SDK itself cannot invoke with it")
			require.Equal(t, before+1, calls.Load(), "the request was sent")
			c := archiveclient.Lambda{Client: client, FunctionName: "idemarchive-lookup"}
			require.NoError(t, c.Validate(), "Validate refuses a client that invokes")
			_, err = c.Lookup(context.Background(), "idem:v1:k", nil)
			require.ErrorIs(t, err, archive.ErrNotFound)
		})
	}
}

// meteredInvoker is an ordinary Invoker decorator (metrics, a circuit
// breaker) around the SDK's client.
type meteredInvoker struct{ *lambda.Client }

// The never-invokable SDK clients Validate refuses (no region and no
// endpoint, as config.LoadDefaultConfig gives on a host without AWS_REGION;
// empty static credentials; an endpoint the SDK cannot parse) behind a
// decorator, which Validate does not
// judge: every lookup fails before sending anything, and is
// archive.ErrMisconfigured, never failed open on.
func TestANeverInvokableClientBehindADecoratorIsNeverFailedOpenOn(t *testing.T) {
	t.Parallel()
	creds := credentials.NewStaticCredentialsProvider("AKIDEXAMPLE", "secret", "")
	for name, inner := range map[string]*lambda.Client{
		"no region":                lambda.NewFromConfig(aws.Config{Credentials: creds}),
		"an unbindable region":     lambda.NewFromConfig(aws.Config{Region: "-eu-west-1", Credentials: creds}),
		"empty static credentials": lambda.New(lambda.Options{Region: "eu-west-1", Credentials: credentials.NewStaticCredentialsProvider("", "", "")}),
		// Endpoints the SDK's rules cannot parse ("Failed to parse uri"):
		// read from a file with its newline, or with a space.
		"an endpoint with a newline": lambda.NewFromConfig(aws.Config{Region: "eu-west-1", Credentials: creds, BaseEndpoint: aws.String("http://127.0.0.1:3001\n")}),
		"an endpoint with a space":   lambda.NewFromConfig(aws.Config{Region: "eu-west-1", Credentials: creds, BaseEndpoint: aws.String("http://lambda local:3001")}),
		// Endpoints that parse and that net/http can never send to.
		"an endpoint without a scheme":       lambda.NewFromConfig(aws.Config{Region: "eu-west-1", Credentials: creds, BaseEndpoint: aws.String("localhost:3001")}),
		"a host name without a scheme":       lambda.NewFromConfig(aws.Config{Region: "eu-west-1", Credentials: creds, BaseEndpoint: aws.String("lambda.local")}),
		"an endpoint without a host":         lambda.NewFromConfig(aws.Config{Region: "eu-west-1", Credentials: creds, BaseEndpoint: aws.String("http://")}),
		"an ftp endpoint":                    lambda.NewFromConfig(aws.Config{Region: "eu-west-1", Credentials: creds, BaseEndpoint: aws.String("ftp://127.0.0.1:3001")}),
		"an endpoint with a port past 65535": lambda.NewFromConfig(aws.Config{Region: "eu-west-1", Credentials: creds, BaseEndpoint: aws.String("http://127.0.0.1:99999")}),
		// Port 0 dials, and is refused, on every call.
		"an endpoint on port 0":  lambda.NewFromConfig(aws.Config{Region: "eu-west-1", Credentials: creds, BaseEndpoint: aws.String("http://127.0.0.1:0")}),
		"an endpoint on port 00": lambda.NewFromConfig(aws.Config{Region: "eu-west-1", Credentials: creds, BaseEndpoint: aws.String("https://127.0.0.1:00")}),
	} {
		for kind, inv := range map[string]archiveclient.Invoker{"embedded": meteredInvoker{inner}, "hidden": opaqueInvoker{inner}} {
			t.Run(name+", "+kind, func(t *testing.T) {
				require.Error(t, archiveclient.Lambda{Client: inner, FunctionName: "idemarchive-lookup"}.Validate(), "bare, it is refused")
				c := archiveclient.Lambda{Client: inv, FunctionName: "idemarchive-lookup"}
				mw, err := idempotency.New(idempotency.Config{Store: freshStore{}, Archive: c, SingleTenant: true, OnArchiveError: idempotency.FailOpen})
				require.NoError(t, err)
				var ran atomic.Int32
				w := charge(mw, "archived-key", &ran)
				_, lerr := c.Lookup(context.Background(), "idem:v1:archived-key", nil)
				require.EqualValues(t, 0, ran.Load(), "a key the archive may hold ran under FailOpen (%d %s): the lookup error was %v", w.Code, w.Body, lerr)
				require.ErrorIs(t, lerr, archive.ErrMisconfigured)
			})
		}
	}
}

// opaqueInvoker hides the client it calls.
type opaqueInvoker struct{ c *lambda.Client }

func (o opaqueInvoker) Invoke(ctx context.Context, in *lambda.InvokeInput, opts ...func(*lambda.Options)) (*lambda.InvokeOutput, error) {
	return o.c.Invoke(ctx, in, opts...)
}

// discoveryResolver is an EndpointResolverV2 of one's own (which Validate
// now trusts) that finds the endpoint through a discovery service, as a
// Cloud Map / Consul / DNS SRV lookup would: its lookup can fail for a
// moment, and answer again on the next call.
type discoveryResolver struct {
	down *atomic.Bool
	url  string
}

func (d discoveryResolver) ResolveEndpoint(_ context.Context, _ lambda.EndpointParameters) (smithyendpoints.Endpoint, error) {
	if d.down.Load() {
		return smithyendpoints.Endpoint{}, &net.OpError{Op: "dial", Net: "tcp", Err: errors.New("connection refused")}
	}
	u, _ := url.Parse(d.url)
	return smithyendpoints.Endpoint{URI: *u}, nil
}

// A passing failure of a trusted resolver of one's own is an outage, not a
// configuration every later call fails on: the next call resolves. Taken as
// archive.ErrMisconfigured, the middleware answers 503 whatever
// OnArchiveError says, so an operator's FailOpen is not applied.
func TestAPassingFailureOfOnesOwnResolverIsAnOutage(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"status":404,"problem":{"code":"key_not_found"}}`))
	}))
	t.Cleanup(srv.Close)
	var down atomic.Bool
	client := lambda.New(lambda.Options{
		EndpointResolverV2: discoveryResolver{&down, srv.URL},
		Credentials:        credentials.NewStaticCredentialsProvider("AKIDEXAMPLE", "secret", ""),
	})
	c := archiveclient.Lambda{Client: client, FunctionName: "idemarchive-lookup"}
	require.NoError(t, c.Validate())
	mw, err := idempotency.New(idempotency.Config{Store: freshStore{}, Archive: c, SingleTenant: true, OnArchiveError: idempotency.FailOpen})
	require.NoError(t, err)

	down.Store(true)
	_, lerr := c.Lookup(context.Background(), "idem:v1:k", nil)
	require.NotErrorIs(t, lerr, archive.ErrMisconfigured, "a passing discovery failure was taken for a configuration error: %v", lerr)
	require.ErrorIs(t, lerr, archiveclient.ErrUnavailable)
	var ran atomic.Int32
	w := charge(mw, "k", &ran)
	require.EqualValues(t, 1, ran.Load(), "FailOpen was not applied to an outage: answered %d %s", w.Code, w.Body)

	down.Store(false) // the next call works: it was never a configuration error
	_, lerr = c.Lookup(context.Background(), "idem:v1:k", nil)
	require.ErrorIs(t, lerr, archive.ErrNotFound)
}

// regionalInvoker is a decorator that embeds the SDK client (so that the
// rest of its API is at hand) and overrides Invoke to name the region of
// each call itself (a regional failover): the embedded client's own options
// have no region, and every invocation works.
type regionalInvoker struct {
	*lambda.Client
	region string
}

func (r regionalInvoker) Invoke(ctx context.Context, in *lambda.InvokeInput, opts ...func(*lambda.Options)) (*lambda.InvokeOutput, error) {
	return r.Client.Invoke(ctx, in, append(opts, func(o *lambda.Options) { o.Region = r.region })...)
}

// stubInvoker embeds a nil *lambda.Client (to satisfy a wider interface of
// the application's) and answers Invoke itself, never touching it.
type stubInvoker struct {
	*lambda.Client
}

func (stubInvoker) Invoke(context.Context, *lambda.InvokeInput, ...func(*lambda.Options)) (*lambda.InvokeOutput, error) {
	return &lambda.InvokeOutput{StatusCode: 200, Payload: []byte(`{"status":404,"problem":{"code":"key_not_found"}}`)}, nil
}

// A decorator that overrides Invoke decides what an invocation uses; the
// options of a client it embeds say nothing about it, and it is not refused
// on them.
func TestADecoratorOverridingInvokeIsNotJudgedByTheClientItEmbeds(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"status":404,"problem":{"code":"key_not_found"}}`))
	}))
	t.Cleanup(srv.Close)
	creds := credentials.NewStaticCredentialsProvider("AKIDEXAMPLE", "secret", "")
	noRegion := lambda.New(lambda.Options{Credentials: creds}, func(o *lambda.Options) {
		o.HTTPClient = &http.Client{Transport: redirectTo(srv.URL)}
	})
	for name, inv := range map[string]archiveclient.Invoker{
		"regional failover decorator": regionalInvoker{noRegion, "eu-west-1"},
		"stub embedding a nil client": stubInvoker{},
	} {
		t.Run(name, func(t *testing.T) {
			out, ierr := inv.Invoke(context.Background(), &lambda.InvokeInput{FunctionName: aws.String("idemarchive-lookup"), Payload: []byte(`{"scoped_key":"idem:v1:k"}`)})
			require.NoError(t, ierr, "the Invoker itself works")
			require.EqualValues(t, 200, out.StatusCode)
			c := archiveclient.Lambda{Client: inv, FunctionName: "idemarchive-lookup"}
			_, lerr := c.Lookup(context.Background(), "idem:v1:k", nil)
			_, err := idempotency.New(idempotency.Config{Store: freshStore{}, Archive: c, SingleTenant: true, OnArchiveError: idempotency.FailClosed})
			require.NoError(t, err, "a working Invoker is refused (its lookup, Validate aside, would be: %v)", lerr)
		})
	}
}

// redirectTo sends every request to base (the test's function).
type redirectTo string

func (r redirectTo) RoundTrip(req *http.Request) (*http.Response, error) {
	u, _ := url.Parse(string(r))
	req = req.Clone(req.Context())
	req.URL.Scheme, req.URL.Host = u.Scheme, u.Host
	return http.DefaultTransport.RoundTrip(req)
}

// The phrases that name an SDK configuration failure are read only in an
// error no answer came with: a service's answer that happens to say them (a
// transient ServiceException) stays an outage, for OnArchiveError.
func TestPhrasesInTheServicesAnswerAreNoMisconfiguration(t *testing.T) {
	t.Parallel()
	for _, message := range []string{
		"upstream connect error: invalid port on a draining host, retry",
		"no Host in request URL",
		"unsupported protocol scheme",
		"endpoint rule error, Failed to parse uri",
	} {
		t.Run(message, func(t *testing.T) {
			t.Parallel()
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
				w.Header().Set("X-Amzn-Errortype", "ServiceException")
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(http.StatusInternalServerError)
				_, _ = io.WriteString(w, `{"Type":"Service","message":"`+message+`"}`)
			}))
			t.Cleanup(srv.Close)
			client := lambda.New(lambda.Options{Region: "us-east-1", BaseEndpoint: aws.String(srv.URL),
				Credentials: credentials.NewStaticCredentialsProvider("AKIDEXAMPLE", "secret", ""), RetryMaxAttempts: 1})
			c := archiveclient.Lambda{Client: client, FunctionName: "idemarchive-lookup"}
			require.NoError(t, c.Validate())
			_, err := c.Lookup(context.Background(), "idem:v1:archived-key", nil)
			require.NotErrorIs(t, err, archive.ErrMisconfigured)
			require.ErrorIs(t, err, archiveclient.ErrUnavailable)
			mw, err := idempotency.New(idempotency.Config{Store: freshStore{}, Archive: c, SingleTenant: true, OnArchiveError: idempotency.FailOpen})
			require.NoError(t, err)
			var ran atomic.Int32
			w := charge(mw, "archived-key", &ran)
			require.EqualValues(t, 1, ran.Load(), "FailOpen not honoured on an outage: %d %s", w.Code, w.Body.String())
		})
	}
}

// A redirect whose Location the HTTP client cannot parse ends with no
// response and the server's text in the error ("invalid port"): what a
// server said, an outage for OnArchiveError, not the client's configuration.
func TestARedirectWithABadLocationIsNoMisconfiguration(t *testing.T) {
	t.Parallel()
	for name, location := range map[string]string{
		"invalid port":       "http://archive.example:bad port/",
		"invalid port again": "https://lambda.us-east-1.amazonaws.com:443x/",
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
				w.Header().Set("Location", location)
				w.WriteHeader(http.StatusFound)
			}))
			t.Cleanup(srv.Close)
			client := lambda.New(lambda.Options{Region: "us-east-1", BaseEndpoint: aws.String(srv.URL),
				Credentials: credentials.NewStaticCredentialsProvider("AKIDEXAMPLE", "secret", ""), RetryMaxAttempts: 1})
			c := archiveclient.Lambda{Client: client, FunctionName: "idemarchive-lookup"}
			require.NoError(t, c.Validate())
			_, err := c.Lookup(context.Background(), "idem:v1:archived-key", nil)
			require.Error(t, err)
			require.NotErrorIs(t, err, archive.ErrMisconfigured, "a server's redirect answer was taken for the client's configuration: %v", err)
			require.ErrorIs(t, err, archiveclient.ErrUnavailable)
			mw, err := idempotency.New(idempotency.Config{Store: freshStore{}, Archive: c, SingleTenant: true, OnArchiveError: idempotency.FailOpen})
			require.NoError(t, err)
			var ran atomic.Int32
			w := charge(mw, "archived-key", &ran)
			require.EqualValues(t, 1, ran.Load(), "FailOpen not honoured on a server's answer: %d %s", w.Code, w.Body.String())
		})
	}
}
