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
	"net/http"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/lambda"
	"github.com/aws/aws-sdk-go-v2/service/lambda/types"

	"github.com/idemarchive/idemarchive/shared/archive"
	"github.com/idemarchive/idemarchive/shared/lookupapi"
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
	// zero); a negative one is refused on every lookup, with an error that
	// matches context.DeadlineExceeded (so never failed open on). The
	// caller's context may cut it shorter.
	Timeout time.Duration
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
	if l.Timeout < 0 {
		// A configuration error, said as one, and not an archive that
		// never answers. It still matches context.DeadlineExceeded, as
		// the deadline already passed it once was: the middleware never
		// fails open on that, and an error of its own would let FailOpen
		// run every key, those the archive holds included.
		return archive.Record{}, fmt.Errorf("archiveclient: Timeout must not be negative, got %s (no lookup fits in it: %w)", l.Timeout, context.DeadlineExceeded)
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
	if err != nil {
		return archive.Record{}, fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	if out.FunctionError != nil {
		// The payload (a message and stack trace, up to 6 MB) is cut
		// short: the middleware logs this error on every request while
		// the function fails.
		return archive.Record{}, fmt.Errorf("%w: function error %s: %s", ErrUnavailable, *out.FunctionError, out.Payload[:min(len(out.Payload), maxErrorPayload)])
	}
	var resp lookupapi.DirectResponse
	if err := json.Unmarshal(out.Payload, &resp); err != nil {
		return archive.Record{}, fmt.Errorf("%w: unreadable answer: %w", ErrUnavailable, err)
	}
	switch {
	case resp.Status == http.StatusOK && resp.Record != nil && resp.Record.ScopedKey != scopedKey:
		// Not an answer for this key (another deployment's function, a
		// proxy in between): taken for one, a key that never ran would
		// be answered as archived, or a charge as another's.
		return archive.Record{}, fmt.Errorf("%w: the answer is for another key", ErrUnavailable)
	case resp.Status == http.StatusOK && resp.Record != nil:
		return *resp.Record, nil
	case resp.Status == http.StatusNotFound && resp.Problem != nil && resp.Problem.Code == "key_not_found":
		return archive.Record{}, archive.ErrNotFound
	case resp.Problem != nil && resp.Status < 500:
		return archive.Record{}, fmt.Errorf("archive lookup rejected the key: %s: %s", resp.Problem.Code, resp.Problem.Detail)
	}
	return archive.Record{}, fmt.Errorf("%w: status %d", ErrUnavailable, resp.Status)
}
