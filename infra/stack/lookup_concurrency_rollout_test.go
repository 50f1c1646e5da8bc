package stack

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/aws/aws-cdk-go/awscdk/v2/awsiam"
	"github.com/aws/jsii-runtime-go"
	"github.com/stretchr/testify/require"
)

// callerPolicyResources returns the Resource entries of the policy
// GrantLookupInvoke gives a service role, as JSON strings.
func callerPolicyResources(t *testing.T, mutate func(*Props)) (bundle, []string) {
	t.Helper()
	b := setupWith(t, mutate, func(s *Stack) {
		role := awsiam.NewRole(s.Stack, jsii.String("LookupCaller"), &awsiam.RoleProps{
			AssumedBy: awsiam.NewServicePrincipal(jsii.String("ecs-tasks.amazonaws.com"), nil),
		})
		s.GrantLookupInvoke(role)
	})
	var out []string
	for id, r := range b.ofType("AWS::IAM::Policy") {
		if !strings.HasPrefix(id, "LookupCaller") {
			continue
		}
		doc := r.Properties["PolicyDocument"].(map[string]any)
		for _, st := range doc["Statement"].([]any) {
			res := st.(map[string]any)["Resource"]
			list, ok := res.([]any)
			if !ok {
				list = []any{res}
			}
			for _, x := range list {
				j, _ := json.Marshal(x)
				out = append(out, string(j))
			}
		}
	}
	require.NotEmpty(t, out, "the caller's policy")
	return b, out
}

// Turning provisioned concurrency on (an alias) or off must not deny a
// caller still configured with the other name during the rollout: a policy
// on a qualified ARN alone denies unqualified invocations (and the reverse),
// and a middleware denied fails closed (503) for fresh keys. The grant
// covers the function's unqualified name and every qualifier, either way.
func TestGrantLookupInvokeKeepsCallersOfEitherName(t *testing.T) {
	b, before := callerPolicyResources(t, nil)
	fnArn := `{"Fn::GetAtt":["` + b.functionID(t, "lookup") + `","Arn"]}`
	require.Contains(t, before, fnArn, "baseline: the unqualified function is granted")

	b, after := callerPolicyResources(t, func(p *Props) { p.LookupProvisionedConcurrency = 2 })
	fnArn = `{"Fn::GetAtt":["` + b.functionID(t, "lookup") + `","Arn"]}`
	require.Contains(t, after, fnArn,
		"with LookupProvisionedConcurrency, a caller still invoking the unqualified name (configured from the previous LookupFunctionName) is denied at deploy: granted only %v", after)
	require.Contains(t, after, `{"Fn::Join":["",[`+fnArn+`,":*"]]}`, "the alias-qualified name is granted too: %v", after)
}

// Provisioned concurrency as much as the reservation throttles every
// invocation of the unpublished version ($LATEST, what the unqualified name
// runs) and leaves nothing past the provisioned instances: refused.
func TestProvisionedAsMuchAsReservedIsRefused(t *testing.T) {
	p := Props{CodeDir: placeholderCode(t), LookupReservedConcurrency: new(3), LookupProvisionedConcurrency: 3}
	require.ErrorContains(t, p.validate(), "less than LookupReservedConcurrency")
}

// Invocations past the provisioned instances run on new ones, cold, the
// wait the prop is bought to spare: they notify
// (ProvisionedConcurrencySpilloverInvocations of the alias).
func TestProvisionedSpilloverNotifies(t *testing.T) {
	b := setup(t, func(p *Props) { p.LookupProvisionedConcurrency = 2 })
	a := alarmNamed(t, b, "Test-lookup-spillover")
	require.Equal(t, "ProvisionedConcurrencySpilloverInvocations", a.Properties["MetricName"])
	require.Equal(t, "Sum", a.Properties["Statistic"])
	dims := flatten(a.Properties["Dimensions"])
	require.Contains(t, dims, "Resource")
	require.Contains(t, dims, ":"+LookupAlias)
	// AND without provisioned concurrency there is no such alarm
	for _, r := range setup(t, nil).ofType("AWS::CloudWatch::Alarm") {
		require.NotEqual(t, "Test-lookup-spillover", r.Properties["AlarmName"])
	}
}
