package main

import (
	"encoding/json"
	"testing"

	"github.com/aws/aws-lambda-go/lambda"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemarchive/idemarchive/shared/testenv"
)

// An event of "version": "2.0" is answered as an HTTP API event, with a
// statusCode, however malformed: also when its typed fields do not decode
// (a requestContext member of the wrong type) and the shape is guessed from
// its members, named in any letter case. An answer in the direct shape
// ({"status":400,...}) is read by API Gateway as a 200 whose body it is.
func TestAnEventThatDoesNotDecodeIsAnsweredInItsShape(t *testing.T) {
	t.Parallel()
	env, _, _ := testenv.FunctionEnv(t, nil, map[string]string{"DATABASE_URL": "postgres://u:p@127.0.0.1:1/db?connect_timeout=2"})
	h := lambda.NewHandler(newHandler(env))
	for _, payload := range []string{
		`{"version":"2.0","requestContext":{"domainName":5,"http":{"method":"GET"}}}`,
		`{"version":"2.0","requestContext":{"domainName":["abc.lambda-url.eu-west-1.on.aws"]}}`,
		`{"version":"2.0","RAWPATH":"/v1/archive/keys/idem:v1:probe","requestContext":{"domainName":5}}`,
		`{"Version":"2.0","requestContext":{"domainName":5}}`,
		`{"rawpath":"/v1/archive/keys/idem:v1:probe","requestContext":{"domainName":5}}`,
		`{"HTTPMETHOD":"GET","path":"/v1/archive/keys/idem:v1:probe","requestContext":{"domainName":5}}`,
	} {
		out, err := h.Invoke(testenv.Invocation("req-unreadable"), []byte(payload))
		require.NoError(t, err)
		var d struct {
			StatusCode *int   `json:"statusCode"`
			Body       string `json:"body"`
		}
		require.NoError(t, json.Unmarshal(out, &d), payload)
		if !assert.NotNil(t, d.StatusCode, "version 2.0 event answered without a statusCode (API Gateway reads it as a 200): %s -> %s", payload, out) {
			continue
		}
		assert.Equal(t, 400, *d.StatusCode, "%s -> %s", payload, out)
	}
}

// A payload that names a member twice in different letter cases gets one
// answer every time (a map's order is random).
func TestAnEventThatDoesNotDecodeGetsOneShapeEveryTime(t *testing.T) {
	t.Parallel()
	env, _, _ := testenv.FunctionEnv(t, nil, map[string]string{"DATABASE_URL": "postgres://u:p@127.0.0.1:1/db?connect_timeout=2"})
	h := lambda.NewHandler(newHandler(env))
	for _, payload := range []string{
		`{"version":"2.0","VERSION":1,"rawpath":null}`,
		`{"version":"2.0","Version":"1.0","requestContext":{"domainName":5}}`,
	} {
		shapes := map[bool]string{}
		for range 64 {
			out, err := h.Invoke(testenv.Invocation("req-dup"), []byte(payload))
			require.NoError(t, err)
			var d struct {
				StatusCode *int `json:"statusCode"`
			}
			require.NoError(t, json.Unmarshal(out, &d))
			shapes[d.StatusCode != nil] = string(out)
		}
		require.Len(t, shapes, 1, "one payload answered in two shapes: %s -> %v", payload, shapes)
	}
}

// A load balancer's event whose fields do not decode is answered in its
// shape, statusDescription included.
func TestALoadBalancerEventThatDoesNotDecodeGetsItsShape(t *testing.T) {
	t.Parallel()
	env, _, _ := testenv.FunctionEnv(t, nil, map[string]string{"DATABASE_URL": "postgres://u:p@127.0.0.1:1/db?connect_timeout=2"})
	h := lambda.NewHandler(newHandler(env))
	payload := `{"httpMethod":"GET","path":"/v1/archive/keys/idem:v1:k","requestContext":{"elb":{"targetGroupArn":"arn:aws:elasticloadbalancing:eu-west-1:123456789012:targetgroup/t/1"},"domainName":5}}`
	out, err := h.Invoke(testenv.Invocation("req-alb"), []byte(payload))
	require.NoError(t, err)
	var d struct {
		StatusCode        *int   `json:"statusCode"`
		StatusDescription string `json:"statusDescription"`
	}
	require.NoError(t, json.Unmarshal(out, &d))
	require.NotNil(t, d.StatusCode, "%s", out)
	require.NotEmpty(t, d.StatusDescription, "ALB event answered without statusDescription: %s", out)
}
