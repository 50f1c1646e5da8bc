package fnenv_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemarchive/idemarchive/shared/fnenv"
)

type options struct {
	DryRun          *bool `json:"dry_run,omitempty"`
	RetentionMonths *int  `json:"retention_months,omitempty"`
}

// Options that act (a shorter retention drops months) are never read one
// way when the caller meant another: a name given twice, in two spellings
// encoding/json takes for one, or beside an EventBridge event's detail
// (where it would be ignored) is refused, not settled by whichever wins.
func TestAmbiguousOptionsAreRefused(t *testing.T) {
	t.Parallel()
	for payload, want := range map[string]string{
		`{"dry_run": true, "retention_months": 1, "DRY_RUN": false}`:                        `"dry_run" and "DRY_RUN" name the same option`,
		`{"dry_run": true, "retention_months": 1, "dry_run": false}`:                        `"dry_run" and "dry_run" name the same option`,
		`{"retention_months": 1, "retention_months": 24}`:                                   "name the same option",
		`{"detail-type": "x", "detail": {"retention_months": 1}, "dry_run": true}`:          `"dry_run" is beside the EventBridge event's detail`,
		`{"detail-type": "x", "detail": {"retention_months": 1}, "Dry_Run": true}`:          "beside the EventBridge event's detail",
		`{"detail-type": "x", "detail": {"dry_run": true, "Dry_run": false}}`:               "name the same option",
		`{"detail-type": "x", "detail-type": "y", "detail": {}}`:                            "name the same option",
		"{\"retention_months\": 1, \"retention_month\u017f\": 24}":                          "name the same option", // ſ folds to s
		`{"detail-type": "x", "detail": {"retention_months": 1}, "retention_months": 1200}`: "beside the EventBridge event's detail",
		// null would read as false ("dry_run": null, a run that acts) or
		// as not given.
		`{"dry_run": null, "retention_months": 1}`:                   `"dry_run" is null`,
		`{"detail-type": "x", "detail": {"dry_run": null}}`:          `"dry_run" is null`,
		`{"detail-type": "x", "detail": {"retention_months": null}}`: `"retention_months" is null`,
	} {
		var o options
		err := fnenv.DecodeInput([]byte(payload), &o)
		require.ErrorContains(t, err, want, payload)
	}
	for _, payload := range []string{
		`{"dry_run": true, "retention_months": 1}`,
		`{"DRY_RUN": true}`,
		`{"detail-type": "Scheduled Event", "source": "aws.events", "id": "1", "detail": {"dry_run": true}}`,
		`{"detail-type": "Scheduled Event", "detail": {}}`,
		`{"detail-type": "Scheduled Event", "resources": null, "detail": {"dry_run": true}}`,
		`null`, ``,
	} {
		var o options
		require.NoError(t, fnenv.DecodeInput([]byte(payload), &o), payload)
	}
}

// Raw hands a handler the payload whole: of two JSON values, aws-lambda-go's
// typed handlers read the first ({"retention_months": 1}) and drop the
// rest ({"dry_run": true}), and a partitions run acted on it, dropping
// months. Through Raw, DecodeInput refuses such a payload.
func TestRawRefusesAPayloadOfTwoValues(t *testing.T) {
	t.Parallel()
	calls := 0
	h := fnenv.Raw(slog.New(slog.NewTextHandler(io.Discard, nil)), func(_ context.Context, payload json.RawMessage) (map[string]any, error) {
		var o options
		if err := fnenv.DecodeInput(payload, &o); err != nil {
			return nil, err
		}
		calls++
		return map[string]any{"dry_run": o.DryRun != nil && *o.DryRun, "note": "<&>"}, nil
	})
	_, err := h.Invoke(context.Background(), []byte(`{"retention_months": 1} {"dry_run": true}`))
	require.ErrorContains(t, err, "payload is not JSON")
	require.Zero(t, calls)
	out, err := h.Invoke(context.Background(), []byte(`{"dry_run": true}`))
	require.NoError(t, err)
	require.Equal(t, `{"dry_run":true,"note":"<&>"}`, string(out), "as aws-lambda-go answers: no HTML escapes, no newline")
	require.Contains(t, string(out), "<&>", "answered as aws-lambda-go answers, without HTML escapes")
}

// A panic of the handler is answered ErrPanicked, naming nothing of it;
// its value and stack go to the log (left to aws-lambda-go, the invoker was
// answered the stack trace, and the process ended).
func TestRawAnswersAPanicAsAnErrorNamingNothing(t *testing.T) {
	t.Parallel()
	var logs bytes.Buffer
	h := fnenv.Raw(slog.New(slog.NewJSONHandler(&logs, nil)), func(context.Context, json.RawMessage) (int, error) {
		panic("secret internals")
	})
	out, err := h.Invoke(context.Background(), []byte(`{}`))
	require.ErrorIs(t, err, fnenv.ErrPanicked)
	require.Nil(t, out)
	require.NotContains(t, err.Error(), "secret")
	require.Contains(t, logs.String(), "secret internals")
	require.Contains(t, logs.String(), "goroutine")
}
