package archiveclient_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/lambda"
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
