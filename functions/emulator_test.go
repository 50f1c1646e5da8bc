// Package functions_test runs the real bootstrap binaries of every function
// under the AWS Lambda Runtime Interface Emulator, invoked over HTTP with the
// sample events of events/, as `sam local invoke` or Lambda itself would.
package functions_test

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/events"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	awslambda "github.com/aws/aws-sdk-go-v2/service/lambda"
	"github.com/stretchr/testify/require"

	"github.com/idemarchive/idemarchive/shared/archive"
	"github.com/idemarchive/idemarchive/shared/archiveclient"
	"github.com/idemarchive/idemarchive/shared/dbtest"
	"github.com/idemarchive/idemarchive/shared/idempotency"
	"github.com/idemarchive/idemarchive/shared/livestore"
	"github.com/idemarchive/idemarchive/shared/testenv"
)

type record struct {
	OriginalStatus   int     `json:"original_status"`
	ResourceID       *string `json:"resource_id"`
	FingerprintMatch *bool   `json:"fingerprint_match"`
}

type direct struct {
	Status  int
	Record  *record
	Problem *struct{ Code string }
	Page    *struct{ Records []map[string]any }
}

func TestFunctionsUnderTheRuntimeInterfaceEmulator(t *testing.T) {
	t.Parallel()
	db := dbtest.New(t)
	env := map[string]string{"DATABASE_URL": db.URL, "SWEEP_PAUSE": "1ms"}
	// GIVEN the three functions, each a real bootstrap under the emulator
	bin := testenv.Bootstraps(t, "partitions", "sweep", "lookup")
	partitions := testenv.StartEmulator(t, bin["partitions"], env)
	sweeper := testenv.StartEmulator(t, bin["sweep"], env)
	lookup := testenv.StartEmulator(t, bin["lookup"], env)

	// WHEN the daily partitions schedule fires
	var parts struct{ Created []string }
	require.NoError(t, json.Unmarshal(partitions.Invoke(t, testenv.Event(t, "partitions-schedule.json")), &parts))
	require.Len(t, parts.Created, 5)

	// AND a completed key and an in-flight key expire, and the sweep schedule fires
	now := time.Now()
	dbtest.InsertLive(t, db.Pool,
		dbtest.LiveRow{Key: "idem:v1:probe", Status: 201, Response: map[string]any{"id": "ch_probe"}, CreatedAt: now.Add(-30 * time.Hour), ExpiresAt: now.Add(-6 * time.Hour)},
		dbtest.LiveRow{Key: "idem:v1:stuck", ExpiresAt: now.Add(-time.Hour)},
	)
	var swept struct {
		Moved   int64
		Drained bool
		Backlog int64
	}
	require.NoError(t, json.Unmarshal(sweeper.Invoke(t, testenv.Event(t, "sweep-schedule.json")), &swept))
	require.Equal(t, int64(2), swept.Moved)
	require.True(t, swept.Drained)
	require.Zero(t, swept.Backlog)
	// The emulator copies the function's output through a pipe: the line may
	// land a moment after the response.
	require.Eventually(t, func() bool {
		return len(testenv.Lines(sweeper.Output.String(), `"idempotency_archived_total":2`)) > 0
	}, 5*time.Second, 20*time.Millisecond, "EMF line in the function's output")

	// THEN the lookup function finds what the sweeper archived, through every shape
	t.Run("HTTP API 2.0", func(t *testing.T) {
		var resp events.APIGatewayV2HTTPResponse
		require.NoError(t, json.Unmarshal(lookup.Invoke(t, testenv.Event(t, "lookup-http-api-v2.json")), &resp))
		require.Equal(t, 200, resp.StatusCode, resp.Body)
		var rec record
		require.NoError(t, json.Unmarshal([]byte(resp.Body), &rec))
		require.Equal(t, 201, rec.OriginalStatus)
		require.Equal(t, "ch_probe", *rec.ResourceID)
		require.Nil(t, rec.FingerprintMatch, "the sample's fingerprint 00 is no digest: it proves nothing")
	})
	t.Run("REST proxy 1.0", func(t *testing.T) {
		var resp events.APIGatewayProxyResponse
		require.NoError(t, json.Unmarshal(lookup.Invoke(t, testenv.Event(t, "lookup-rest-v1.json")), &resp))
		require.Equal(t, 200, resp.StatusCode, resp.Body)
		require.Contains(t, resp.Body, `"resource_id":"ch_probe"`)
	})
	t.Run("direct invoke", func(t *testing.T) {
		var resp direct
		require.NoError(t, json.Unmarshal(lookup.Invoke(t, testenv.Event(t, "lookup-direct.json")), &resp))
		require.Equal(t, 200, resp.Status)
		require.Equal(t, "ch_probe", *resp.Record.ResourceID)
	})
	t.Run("investigation", func(t *testing.T) {
		var resp events.APIGatewayV2HTTPResponse
		require.NoError(t, json.Unmarshal(lookup.Invoke(t, testenv.Event(t, "query-http-api-v2.json")), &resp))
		require.Equal(t, 200, resp.StatusCode, resp.Body)
		require.Contains(t, resp.Body, `"scoped_key":"idem:v1:stuck","original_status":0`, "in-flight keys are archived with status 0")
		var d direct
		require.NoError(t, json.Unmarshal(lookup.Invoke(t, testenv.Event(t, "query-direct.json")), &d))
		require.Len(t, d.Page.Records, 2)
	})
	t.Run("bad input is a 400, not a crash", func(t *testing.T) {
		var resp direct
		require.NoError(t, json.Unmarshal(lookup.Invoke(t, []byte(`{"scoped_key": `)), &resp))
		require.Equal(t, 400, resp.Status)
		require.Equal(t, "bad_request", resp.Problem.Code)
	})
	t.Run("lambda:Invoke through the AWS SDK", func(t *testing.T) {
		// A service calling the function synchronously, with the SDK's Lambda
		// client pointed at the emulator (it serves the Invoke API path).
		client := awslambda.New(awslambda.Options{
			Region:       "eu-west-1",
			BaseEndpoint: aws.String(lookup.URL),
			Credentials:  credentials.NewStaticCredentialsProvider("test", "test", ""),
		})
		fp := dbtest.Fingerprint("idem:v1:probe")
		payload, _ := json.Marshal(map[string]string{"scoped_key": "idem:v1:probe", "fingerprint": hex.EncodeToString(fp)})
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		out, err := client.Invoke(ctx, &awslambda.InvokeInput{FunctionName: aws.String("function"), Payload: payload})
		require.NoError(t, err)
		require.Nil(t, out.FunctionError)
		var resp direct
		require.NoError(t, json.Unmarshal(out.Payload, &resp))
		require.Equal(t, 200, resp.Status)
		require.Equal(t, 201, resp.Record.OriginalStatus)
		require.True(t, *resp.Record.FingerprintMatch)
	})
	t.Run("middleware archive client through lambda:Invoke", func(t *testing.T) {
		client := archiveclient.Lambda{FunctionName: "function", Timeout: 30 * time.Second, Client: awslambda.New(awslambda.Options{
			Region: "eu-west-1", BaseEndpoint: aws.String(lookup.URL),
			Credentials: credentials.NewStaticCredentialsProvider("test", "test", ""),
		})}
		ctx := context.Background()
		rec, err := client.Lookup(ctx, "idem:v1:probe", dbtest.Fingerprint("idem:v1:probe"))
		require.NoError(t, err)
		require.Equal(t, "ch_probe", *rec.ResourceID)
		require.True(t, *rec.FingerprintMatch)
		_, err = client.Lookup(ctx, "idem:v1:never", nil)
		require.ErrorIs(t, err, archive.ErrNotFound)

		// A service using it: the late retry is a 409 without a second charge.
		dbtest.InsertArchive(t, db.Pool, dbtest.ArchiveRow{Key: "idem:v1:late", Status: 201, ExpiredAt: time.Now().Add(-time.Hour)})
		_, err = db.Pool.Exec(ctx, "UPDATE idempotency_key_archive SET fingerprint = $1 WHERE scoped_key = 'idem:v1:late'",
			idempotency.Fingerprint(http.MethodPost, "/v1/charges", []byte(`{}`)))
		require.NoError(t, err)
		mw, err := idempotency.New(idempotency.Config{Store: livestore.NewPostgres(db.Pool), SingleTenant: true, Archive: client, ArchiveTimeout: 30 * time.Second})
		require.NoError(t, err)
		charged := 0
		srv := mw.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { charged++ }))
		r := httptest.NewRequest(http.MethodPost, "/v1/charges", strings.NewReader(`{}`))
		r.Header.Set(idempotency.HeaderKey, "late")
		w := httptest.NewRecorder()
		srv.ServeHTTP(w, r)
		require.Equal(t, 409, w.Code, w.Body.String())
		require.Contains(t, w.Body.String(), `"idempotency_key_expired"`)
		require.Zero(t, charged)

		// An unreachable function is ErrUnavailable (the middleware fails closed).
		down := archiveclient.Lambda{FunctionName: "function", Client: awslambda.New(awslambda.Options{
			Region: "eu-west-1", BaseEndpoint: aws.String("http://127.0.0.1:1"),
			Credentials:      credentials.NewStaticCredentialsProvider("test", "test", ""),
			RetryMaxAttempts: 1,
		})}
		_, err = down.Lookup(ctx, "idem:v1:probe", nil)
		require.ErrorIs(t, err, archiveclient.ErrUnavailable)
	})
	require.Eventually(t, func() bool {
		return len(testenv.Lines(lookup.Output.String(), `"idempotency_archive_lookup_duration_ms"`)) > 0
	}, 5*time.Second, 20*time.Millisecond, "EMF line in the lookup function's output")
}

// Lambda's default 3-second timeout is under the default deadline margin
// (35 s): the sweep can start no batch. With a backlog waiting, that is an
// error the platform counts, not a quiet success, under the real runtime.
func TestASweepThatCannotRunFailsUnderTheEmulator(t *testing.T) {
	t.Parallel()
	db := dbtest.New(t)
	db.Partition(t, 0)
	dbtest.InsertLive(t, db.Pool, dbtest.LiveRow{Key: "idem:v1:waiting", Status: 201, ExpiresAt: time.Now().Add(-time.Hour)})
	bin := testenv.Bootstraps(t, "sweep")
	sweeper := testenv.StartEmulator(t, bin["sweep"], map[string]string{"DATABASE_URL": db.URL, "AWS_LAMBDA_FUNCTION_TIMEOUT": "3"})
	var failure struct {
		ErrorMessage string `json:"errorMessage"`
		ErrorType    string `json:"errorType"`
	}
	require.NoError(t, json.Unmarshal(sweeper.Invoke(t, testenv.Event(t, "sweep-schedule.json")), &failure))
	require.Contains(t, failure.ErrorMessage, "sweep started no batch")
	require.Contains(t, failure.ErrorMessage, "1 expired rows wait")
	require.Contains(t, failure.ErrorMessage, "SWEEP_DEADLINE_MARGIN")
	require.EqualValues(t, 1, dbtest.Count(t, db.Pool, "SELECT count(*) FROM idempotency_keys"), "no row was lost")
}

// A configured secret never reaches the logs: every function, failing to
// reach its database, logs the failure without the password it was given.
func TestNoFunctionLogsTheDatabasePassword(t *testing.T) {
	t.Parallel()
	const password = "s3cr3t-Pa55word"
	bin := testenv.Bootstraps(t, "partitions", "sweep", "lookup")
	env := map[string]string{"DATABASE_URL": "postgres://archive:" + password + "@127.0.0.1:1/x?connect_timeout=2"}
	for name, event := range map[string]string{"partitions": "partitions-schedule.json", "sweep": "sweep-schedule.json", "lookup": "lookup-direct.json"} {
		e := testenv.StartEmulator(t, bin[name], env)
		out := e.Invoke(t, testenv.Event(t, event))
		require.NotContains(t, string(out), password, name)
		require.Eventually(t, func() bool {
			return strings.Contains(e.Output.String(), "127.0.0.1") || strings.Contains(e.Output.String(), "connect")
		},
			5*time.Second, 20*time.Millisecond, "%s logged its failure", name)
		require.NotContains(t, e.Output.String(), password, "%s logged the password", name)
	}
}
