package stack

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/aws/aws-cdk-go/awscdk/v2/assertions"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsiam"
	"github.com/aws/jsii-runtime-go"
	"github.com/stretchr/testify/require"
)

// Investigations run on the lookup function, whose concurrency the payment
// path's lookups need, and each may take its statement timeout: their route
// has a throttle of its own, below the stage's.
func TestInvestigationsAreThrottledOnTheirOwn(t *testing.T) {
	b := setup(t, nil)
	b.template.HasResourceProperties(jsii.String("AWS::ApiGatewayV2::Stage"), map[string]any{
		"DefaultRouteSettings": map[string]any{"ThrottlingRateLimit": 200, "ThrottlingBurstLimit": 400},
		"RouteSettings": map[string]any{
			"GET /v1/archive/keys": map[string]any{"ThrottlingRateLimit": 10, "ThrottlingBurstLimit": 20},
		},
	})
	// AND the route key names a route of the API (a setting for a route
	// that does not exist would throttle nothing)
	found := false
	for _, r := range b.ofType("AWS::ApiGatewayV2::Route") {
		found = found || r.Properties["RouteKey"] == "GET "+InvestigationRoute
	}
	require.True(t, found, "no route GET %s", InvestigationRoute)
	// AND the stage waits for that route: API Gateway refuses settings for
	// a route it cannot find, and the route waits for the function
	for id, r := range b.ofType("AWS::ApiGatewayV2::Route") {
		if r.Properties["RouteKey"] == "GET "+InvestigationRoute {
			b.template.HasResource(jsii.String("AWS::ApiGatewayV2::Stage"), map[string]any{
				"DependsOn": assertions.Match_ArrayWith(&[]any{id}),
			})
		}
	}

	// AND a stage throttled below the defaults takes them down with it
	b = setup(t, func(p *Props) { p.APIRateLimit, p.APIBurstLimit = 5, 8 })
	b.template.HasResourceProperties(jsii.String("AWS::ApiGatewayV2::Stage"), map[string]any{
		"RouteSettings": map[string]any{
			"GET /v1/archive/keys": map[string]any{"ThrottlingRateLimit": 5, "ThrottlingBurstLimit": 8},
		},
	})

	b = setup(t, func(p *Props) { p.APIInvestigationRateLimit, p.APIInvestigationBurstLimit = 2, 4 })
	b.template.HasResourceProperties(jsii.String("AWS::ApiGatewayV2::Stage"), map[string]any{
		"RouteSettings": map[string]any{
			"GET /v1/archive/keys": map[string]any{"ThrottlingRateLimit": 2, "ThrottlingBurstLimit": 4},
		},
	})

	code := placeholderCode(t)
	for want, p := range map[string]Props{
		"must be at most APIRateLimit":                               {CodeDir: code, APIInvestigationRateLimit: 300},
		"APIInvestigationBurstLimit must be a whole":                 {CodeDir: code, APIInvestigationBurstLimit: 2.5},
		"APIInvestigationRateLimit must be a positive finite number": {CodeDir: code, APIInvestigationRateLimit: -1},
	} {
		require.ErrorContains(t, p.validate(), want)
	}
}

// A service that checks late retries over HTTP gets the lookup routes
// alone: no investigations (which list every key under a prefix).
func TestGrantAPILookupInvokeLeavesInvestigationsOut(t *testing.T) {
	b := setupWith(t, nil, func(s *Stack) {
		role := awsiam.NewRole(s.Stack, jsii.String("HTTPCaller"), &awsiam.RoleProps{
			AssumedBy: awsiam.NewServicePrincipal(jsii.String("ecs-tasks.amazonaws.com"), nil),
		})
		s.API.GrantAPILookupInvoke(role)
	})
	var resources []string
	for id, r := range b.ofType("AWS::IAM::Policy") {
		if !strings.HasPrefix(id, "HTTPCaller") {
			continue
		}
		for _, st := range r.Properties["PolicyDocument"].(map[string]any)["Statement"].([]any) {
			stmt := st.(map[string]any)
			require.Equal(t, "execute-api:Invoke", stmt["Action"])
			for _, x := range stmt["Resource"].([]any) {
				j, _ := json.Marshal(x)
				resources = append(resources, string(j))
			}
		}
	}
	require.Len(t, resources, 2, "%v", resources)
	joined := strings.Join(resources, "\n")
	require.Contains(t, joined, `/*/GET/v1/archive/lookup"`)
	require.Contains(t, joined, `/*/GET/v1/archive/keys/*"`)
	require.NotContains(t, joined, `/GET/*"`, "every route")
	require.NotContains(t, joined, `/GET/v1/archive/keys"`, "investigations")
}
