package stack

import (
	"strings"
	"testing"

	"github.com/aws/jsii-runtime-go"
	"github.com/stretchr/testify/require"
)

// The lookup sits on a payment's path: an operator can reserve it
// concurrency (other functions of the account cannot take it) and keep
// instances initialized (no cold start). Provisioned concurrency lives on
// an alias, and everything that invokes the lookup names that alias: an
// unqualified invocation would run on $LATEST, cold.
func TestLookupConcurrency(t *testing.T) {
	// GIVEN the defaults THEN no alias, nothing reserved, and the output
	// names the function
	b := setup(t, nil)
	lookup := b.functionID(t, "lookup")
	require.Empty(t, b.ofType("AWS::Lambda::Alias"))
	require.NotContains(t, b.json.Resources[lookup].Properties, "ReservedConcurrentExecutions")
	b.template.HasOutput(jsii.String("LookupFunctionName"), map[string]any{"Value": map[string]any{"Ref": lookup}})

	// GIVEN 10 reserved and 4 provisioned
	b = setup(t, func(p *Props) { p.LookupReservedConcurrency = new(10); p.LookupProvisionedConcurrency = 4 })
	lookup = b.functionID(t, "lookup")
	require.EqualValues(t, 10, b.json.Resources[lookup].Properties["ReservedConcurrentExecutions"])
	// THEN one alias, "live", on a version of the lookup, with 4 provisioned
	aliases := b.ofType("AWS::Lambda::Alias")
	require.Len(t, aliases, 1)
	var aliasID string
	for id, a := range aliases {
		aliasID = id
		require.Equal(t, LookupAlias, a.Properties["Name"])
		require.Equal(t, map[string]any{"Ref": lookup}, a.Properties["FunctionName"])
		require.Equal(t, map[string]any{"ProvisionedConcurrentExecutions": float64(4)}, a.Properties["ProvisionedConcurrencyConfig"])
	}
	// AND the API's integration invokes the alias, and API Gateway may
	// invoke it
	integrations := b.ofType("AWS::ApiGatewayV2::Integration")
	require.Len(t, integrations, 1)
	for _, i := range integrations {
		require.Equal(t, map[string]any{"Ref": aliasID}, i.Properties["IntegrationUri"])
	}
	permitted := false
	for _, perm := range b.ofType("AWS::Lambda::Permission") {
		if perm.Properties["Principal"] == "apigateway.amazonaws.com" {
			require.Equal(t, map[string]any{"Ref": aliasID}, perm.Properties["FunctionName"])
			permitted = true
		}
	}
	require.True(t, permitted, "API Gateway may invoke the alias")
	// AND the output the middleware reads names the alias
	out := flatten(b.json.Outputs["LookupFunctionName"].Value)
	require.True(t, strings.HasSuffix(out, ":"+LookupAlias), "output %s", out)
	require.Contains(t, out, lookup)
}

// A reservation of 0 (every lookup throttled) or provisioned concurrency
// not under the reservation (beyond it Lambda refuses the deploy; as much
// throttles the unqualified name) is refused at synth.
func TestLookupConcurrencyIsValidatedAtSynth(t *testing.T) {
	code := placeholderCode(t)
	for name, c := range map[string]struct {
		reserved    *int
		provisioned int
		want        string
	}{
		"nothing reserved":                  {new(0), 0, "LookupReservedConcurrency must be at least 1"},
		"negative reservation":              {new(-1), 0, "LookupReservedConcurrency must be at least 1"},
		"provisioned past the reserved":     {new(2), 3, "less than LookupReservedConcurrency"},
		"negative provisioned":              {nil, -1, "LookupProvisionedConcurrency must be 0 or more"},
		"provisioned as much as reserved":   {new(3), 3, "less than LookupReservedConcurrency"},
		"provisioned one under reserved":    {new(3), 2, ""},
		"provisioned without a reservation": {nil, 2, ""},
	} {
		p := Props{CodeDir: code, LookupReservedConcurrency: c.reserved, LookupProvisionedConcurrency: c.provisioned}
		err := p.validate()
		if c.want == "" {
			require.NoError(t, err, name)
			continue
		}
		require.ErrorContains(t, err, c.want, name)
	}
}
