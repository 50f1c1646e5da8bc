package main

import (
	"context"
	"encoding/json"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/events"
	"github.com/stretchr/testify/require"

	"github.com/idemarchive/idemarchive/shared/lookupapi"
)

// lambdaMaxResponse is what Lambda returns from a synchronous invocation
// (6 MB); a larger answer is a function error (Function.ResponseSizeTooLarge)
// for the caller, a 5xx through API Gateway.
const lambdaMaxResponse = 6 << 20

// A page is bounded in rows, but keys of other writers are archived up to
// 2,000 bytes, and JSON writes '<', '>' and '&' in six bytes each (seven
// once the body is a string inside an API Gateway answer): 1,000 keys of
// 1,200 such bytes are over 6 MB. The page is cut to fit, and its cursor
// reads the rest: every record once, in order, in every event shape.
func TestAnInvestigationPageFitsALambdaResponse(t *testing.T) {
	t.Parallel()
	b := setup(t)
	_, err := b.db.Pool.Exec(context.Background(), `INSERT INTO idempotency_key_archive
		(scoped_key, fingerprint, status_code, resource_id, created_at, expired_at)
		SELECT 'idem:v2:' || repeat('<', 1200) || lpad(g::text, 6, '0'), '\x00', 201, 'ch_' || g,
		       now() - interval '30 hours', now() - interval '6 hours'
		  FROM generate_series(1, 1000) g`)
	require.NoError(t, err)
	from := time.Now().Add(-48 * time.Hour).UTC().Format(time.RFC3339)
	to := time.Now().UTC().Format(time.RFC3339)

	type page struct {
		Records []struct {
			ScopedKey  string `json:"scoped_key"`
			ResourceID string `json:"resource_id"`
		}
		NextCursor string `json:"next_cursor"`
	}
	check := func(t *testing.T, next func(cursor string) (page, int)) {
		seen, pages, cursor := 0, 0, ""
		for {
			p, size := next(cursor)
			require.LessOrEqual(t, size, lambdaMaxResponse, "answer over Lambda's response limit")
			require.NotEmpty(t, p.Records)
			for _, r := range p.Records {
				seen++
				require.Equal(t, "ch_"+strconv.Itoa(seen), r.ResourceID, "records in key order, none skipped or repeated")
			}
			pages++
			if cursor = p.NextCursor; cursor == "" {
				break
			}
		}
		require.Equal(t, 1000, seen)
		require.Greater(t, pages, 1, "a page over the limit is cut")
	}
	query := func(cursor string) map[string]string {
		q := map[string]string{"scope_prefix": "idem:v2:", "created_from": from, "created_to": to, "limit": "1000"}
		if cursor != "" {
			q["cursor"] = cursor
		}
		return q
	}

	t.Run("HTTP API", func(t *testing.T) {
		check(t, func(cursor string) (page, int) {
			out := b.invoke(t, v2("GET", "/v1/archive/keys", query(cursor)))
			var resp events.APIGatewayV2HTTPResponse
			require.NoError(t, json.Unmarshal(out, &resp))
			require.Equal(t, 200, resp.StatusCode, resp.Body[:min(len(resp.Body), 300)])
			require.LessOrEqual(t, len(resp.Body), lookupapi.MaxPageBytes)
			require.True(t, strings.Contains(resp.Body, `\u003c`), "the escaping is what costs")
			var p page
			require.NoError(t, json.Unmarshal([]byte(resp.Body), &p))
			return p, len(out)
		})
	})
	t.Run("REST API", func(t *testing.T) {
		check(t, func(cursor string) (page, int) {
			out := b.invoke(t, v1("GET", "/v1/archive/keys", query(cursor)))
			var resp events.APIGatewayProxyResponse
			require.NoError(t, json.Unmarshal(out, &resp))
			require.Equal(t, 200, resp.StatusCode)
			var p page
			require.NoError(t, json.Unmarshal([]byte(resp.Body), &p))
			return p, len(out)
		})
	})
	t.Run("direct", func(t *testing.T) {
		check(t, func(cursor string) (page, int) {
			req, err := json.Marshal(lookupapi.DirectRequest{Action: "query", ScopePrefix: "idem:v2:", CreatedFrom: from, CreatedTo: to, Limit: new(1000), Cursor: cursor})
			require.NoError(t, err)
			out := b.invoke(t, req)
			var resp struct {
				Status int
				Page   page
			}
			require.NoError(t, json.Unmarshal(out, &resp))
			require.Equal(t, 200, resp.Status)
			return resp.Page, len(out)
		})
	})
}
