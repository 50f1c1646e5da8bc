package archiveclient_test

import (
	"bufio"
	"context"
	"net"
	"net/http"
	"sync/atomic"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/lambda"
	"github.com/stretchr/testify/require"

	"github.com/idemarchive/idemarchive/shared/archive"
	"github.com/idemarchive/idemarchive/shared/archiveclient"
	"github.com/idemarchive/idemarchive/shared/idempotency"
)

// A server or middlebox that answers with a malformed HTTP response: net/http
// quotes what it sent ("malformed MIME header line: <the line>") in an error
// with no response. The configuration phrases are not read in it: what a
// server wrote is an outage, for FailOpen to apply to, not the client's
// misconfiguration.
func TestAMalformedAnswerQuotingAPhraseIsNoMisconfiguration(t *testing.T) {
	t.Parallel()
	for _, line := range []string{"no Host in request URL", "unsupported protocol scheme", "endpoint rule error"} {
		t.Run(line, func(t *testing.T) {
			t.Parallel()
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			require.NoError(t, err)
			t.Cleanup(func() { _ = ln.Close() })
			go func() {
				for {
					conn, err := ln.Accept()
					if err != nil {
						return
					}
					go func() {
						defer conn.Close()
						_, _ = http.ReadRequest(bufio.NewReader(conn))
						_, _ = conn.Write([]byte("HTTP/1.1 502 Bad Gateway\r\n" + line + "\r\n\r\n"))
					}()
				}
			}()
			client := lambda.New(lambda.Options{Region: "us-east-1", BaseEndpoint: aws.String("http://" + ln.Addr().String()),
				Credentials: credentials.NewStaticCredentialsProvider("AKIDEXAMPLE", "secret", ""), RetryMaxAttempts: 1})
			c := archiveclient.Lambda{Client: client, FunctionName: "idemarchive-lookup"}
			require.NoError(t, c.Validate())
			_, err = c.Lookup(context.Background(), "idem:v1:archived-key", nil)
			require.Error(t, err)
			require.NotErrorIs(t, err, archive.ErrMisconfigured, "a server's malformed answer was taken for the client's configuration: %v", err)
			require.ErrorIs(t, err, archiveclient.ErrUnavailable)
			mw, err := idempotency.New(idempotency.Config{Store: freshStore{}, Archive: c, SingleTenant: true, OnArchiveError: idempotency.FailOpen})
			require.NoError(t, err)
			var ran atomic.Int32
			w := charge(mw, "archived-key", &ran)
			require.EqualValues(t, 1, ran.Load(), "FailOpen not honoured on a server's malformed answer: %d %s", w.Code, w.Body.String())
		})
	}
}
