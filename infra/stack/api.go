package stack

import (
	"encoding/json"

	"github.com/aws/aws-cdk-go/awscdk/v2/awsapigatewayv2"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsapigatewayv2authorizers"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsapigatewayv2integrations"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsiam"
	"github.com/aws/aws-cdk-go/awscdk/v2/awslambda"
	"github.com/aws/aws-cdk-go/awscdk/v2/awslogs"
	"github.com/aws/constructs-go/constructs/v10"
	"github.com/aws/jsii-runtime-go"
)

// Routes are the lookup function's routes (shared/lookupapi), all GET.
var Routes = []string{"/v1/archive/lookup", InvestigationRoute, "/v1/archive/keys/{key+}"}

// InvestigationRoute lists archived keys under a prefix and a window
// (archive.Reader.Investigate): throttled on its own (see
// Props.APIInvestigationRateLimit), and left out of GrantAPILookupInvoke.
const InvestigationRoute = "/v1/archive/keys"

// API is the HTTP API in front of the lookup function. Every route requires
// IAM authorization (SigV4-signed requests, allowed by execute-api:Invoke on
// the caller's role): the archive tells who paid for what, so no anonymous
// caller may read it.
type API struct {
	// Construct is the scope holding the resources (a Go struct embedding a
	// jsii object cannot itself be passed to jsii as a scope).
	Construct constructs.Construct
	HTTPAPI   awsapigatewayv2.HttpApi
	// grantee is what GrantLookupInvoke grants: the lookup function,
	// whose grant covers its unqualified name and every qualifier (the
	// alias among them).
	grantee awslambda.IFunction
}

// NewAPI builds the API, its $default stage with throttling and JSON access
// logs, in front of lookup (the function, or its alias with provisioned
// concurrency).
func NewAPI(scope constructs.Construct, id string, lookup, function awslambda.IFunction, p Props) *API {
	c := constructs.NewConstruct(scope, jsii.String(id))
	api := awsapigatewayv2.NewHttpApi(c, jsii.String("HttpApi"), &awsapigatewayv2.HttpApiProps{
		Description:        jsii.String("Idempotency key archive: lookups and investigations (IAM authorized)"),
		DefaultAuthorizer:  awsapigatewayv2authorizers.NewHttpIamAuthorizer(),
		CreateDefaultStage: jsii.Bool(false),
	})
	integration := awsapigatewayv2integrations.NewHttpLambdaIntegration(jsii.String("Lookup"), lookup,
		&awsapigatewayv2integrations.HttpLambdaIntegrationProps{
			// Explicit: the function tells the shapes apart by "version".
			PayloadFormatVersion: awsapigatewayv2.PayloadFormatVersion_VERSION_2_0(),
		})
	var investigations []awsapigatewayv2.HttpRoute
	for _, path := range Routes {
		routes := api.AddRoutes(&awsapigatewayv2.AddRoutesOptions{
			Path:        jsii.String(path),
			Methods:     &[]awsapigatewayv2.HttpMethod{awsapigatewayv2.HttpMethod_GET},
			Integration: integration,
		})
		if path == InvestigationRoute {
			investigations = *routes
		}
	}
	stage := api.AddStage(jsii.String("DefaultStage"), &awsapigatewayv2.HttpStageOptions{
		StageName:  jsii.String("$default"),
		AutoDeploy: jsii.Bool(true),
		Throttle: &awsapigatewayv2.ThrottleSettings{
			RateLimit:  jsii.Number(p.APIRateLimit),
			BurstLimit: jsii.Number(p.APIBurstLimit),
		},
	})
	accessLogs := awslogs.NewLogGroup(c, jsii.String("AccessLogs"), &awslogs.LogGroupProps{
		Retention:     retention(p.LogRetentionDays),
		RemovalPolicy: logRemoval(p),
	})
	format, _ := json.Marshal(accessLogFormat)
	cfnStage := stage.Node().DefaultChild().(awsapigatewayv2.CfnStage)
	cfnStage.SetAccessLogSettings(&awsapigatewayv2.CfnStage_AccessLogSettingsProperty{
		DestinationArn: accessLogs.LogGroupArn(),
		Format:         jsii.String(string(format)),
	})
	// Investigations share the lookup function (and its reserved and
	// provisioned concurrency) with the payment path's lookups, and each
	// may run for its statement timeout: a throttle of their own keeps a
	// burst of them from taking the concurrency lookups need.
	cfnStage.SetRouteSettings(map[string]any{
		"GET " + InvestigationRoute: map[string]any{
			"ThrottlingRateLimit":  p.APIInvestigationRateLimit,
			"ThrottlingBurstLimit": p.APIInvestigationBurstLimit,
		},
	})
	// API Gateway refuses settings for a route that does not exist yet
	// ("Unable to find Route by key"), and nothing else orders the stage
	// after the routes, which wait for the function: on a new stack the
	// stage would come first.
	for _, r := range investigations {
		stage.Node().AddDependency(r)
	}
	return &API{Construct: c, HTTPAPI: api, grantee: function}
}

// accessLogFormat is one JSON line per request. The caller's IAM identity is
// in it: an investigation of who read the archive starts here.
var accessLogFormat = map[string]string{
	"requestId":          "$context.requestId",
	"time":               "$context.requestTime",
	"caller":             "$context.identity.userArn",
	"sourceIp":           "$context.identity.sourceIp",
	"routeKey":           "$context.routeKey",
	"status":             "$context.status",
	"latencyMs":          "$context.responseLatency",
	"integrationLatency": "$context.integrationLatency",
	"integrationError":   "$context.integrationErrorMessage",
	"authorizerError":    "$context.authorizer.error",
}

// GrantLookupInvoke lets a service's role call the lookup function directly
// (lambda:InvokeFunction, as the middleware's Lambda archive client does),
// without going through the API: the function's unqualified name and every
// qualifier, so that turning provisioned concurrency on (its alias) or off
// never denies a caller still configured with the other name during the
// rollout.
func (a *API) GrantLookupInvoke(grantee awsiam.IGrantable) awsiam.Grant {
	return a.grantee.GrantInvoke(grantee)
}

// GrantAPILookupInvoke lets a role look keys up over HTTP
// (execute-api:Invoke on GET /v1/archive/lookup and /v1/archive/keys/*),
// without investigations: what a service's late-retry check needs.
func (a *API) GrantAPILookupInvoke(grantee awsiam.IGrantable) awsiam.Grant {
	return awsiam.Grant_AddToPrincipal(&awsiam.GrantOnPrincipalOptions{
		Grantee: grantee,
		Actions: jsii.Strings("execute-api:Invoke"),
		ResourceArns: jsii.Strings(
			*a.HTTPAPI.ArnForExecuteApi(jsii.String("GET"), jsii.String("/v1/archive/lookup"), nil),
			*a.HTTPAPI.ArnForExecuteApi(jsii.String("GET"), jsii.String(InvestigationRoute+"/*"), nil),
		),
	})
}

// GrantAPIInvoke lets a role call every route of the API
// (execute-api:Invoke), investigations included: for operators and
// incident tooling. A service that only checks late retries needs
// GrantAPILookupInvoke.
func (a *API) GrantAPIInvoke(grantee awsiam.IGrantable) awsiam.Grant {
	return awsiam.Grant_AddToPrincipal(&awsiam.GrantOnPrincipalOptions{
		Grantee:      grantee,
		Actions:      jsii.Strings("execute-api:Invoke"),
		ResourceArns: jsii.Strings(*a.HTTPAPI.ArnForExecuteApi(jsii.String("GET"), nil, nil)),
	})
}
