package stack

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
)

// A deploy that ships a migration also ships the code that needs it: the
// sweep, partitions and lookup functions depend on the schema custom
// resource, so CloudFormation updates their code only after the migration
// (which may take up to 15 minutes), never beside it, where new lookup code
// would serve payment traffic against the old schema.
func TestFunctionsRunNewCodeOnlyAfterTheMigration(t *testing.T) {
	b := setup(t, nil)
	res := rawResources(t, b)
	migration := schemaResourceID(t, res)
	for _, name := range []string{"sweep", "partitions", "lookup"} {
		id := b.functionID(t, name)
		require.Contains(t, res[id].DependsOn, migration,
			"the %s function's code is updated before (or while) the migration runs: new code against the old schema", name)
	}
}

// schemaResourceID is the logical id of the schema custom resource in res.
func schemaResourceID(t *testing.T, res map[string]rawResource) string {
	t.Helper()
	for id, r := range res {
		if r.Type == SchemaResourceType {
			return id
		}
	}
	t.Fatal("no schema custom resource")
	return ""
}

// CloudFormation invokes the migrate function asynchronously, and an
// EventBridge rule its function; each function's retries, event age and
// failure queue are an AWS::Lambda::EventInvokeConfig of their own. Whatever
// invokes a function waits for that config: on a new stack, an invocation
// before it exists gets Lambda's defaults (2 retries, events kept 6 hours,
// no failure queue), and a failed Create would be retried by Lambda after
// CloudFormation gave up on it, racing the rollback.
func TestTheMigrationWaitsForItsNoRetrySetting(t *testing.T) {
	// GIVEN the stack
	b := setup(t, nil)
	res := rawResources(t, b)
	// THEN the schema custom resource depends on migrate's config
	migration := schemaResourceID(t, res)
	require.Contains(t, res[migration].DependsOn, invokeConfigID(t, b, "migrate"),
		"CloudFormation may invoke the migrate function before its RetryAttempts 0 exists")
}

func TestEachScheduleWaitsForItsFunctionsRetrySetting(t *testing.T) {
	// GIVEN the stack
	b := setup(t, nil)
	res := rawResources(t, b)
	// THEN each rule depends on its target's config
	for _, name := range []string{"sweep", "partitions"} {
		fn := getAtt(b.functionID(t, name), "Arn")
		rules := 0
		for id, r := range b.ofType("AWS::Events::Rule") {
			target := r.Properties["Targets"].([]any)[0].(map[string]any)
			if fmt.Sprint(target["Arn"]) != fmt.Sprint(fn) {
				continue
			}
			rules++
			require.Contains(t, res[id].DependsOn, invokeConfigID(t, b, name),
				"the %s rule may fire before the function's retries and failure queue exist", name)
		}
		require.Equal(t, 1, rules, "one rule invokes the %s function", name)
	}
}

// invokeConfigID returns the logical id of the named function's
// EventInvokeConfig.
func invokeConfigID(t *testing.T, b bundle, name string) string {
	t.Helper()
	fn := map[string]any{"Ref": b.functionID(t, name)}
	var ids []string
	for id, r := range b.ofType("AWS::Lambda::EventInvokeConfig") {
		if fmt.Sprint(r.Properties["FunctionName"]) == fmt.Sprint(fn) {
			ids = append(ids, id)
		}
	}
	require.Len(t, ids, 1, "one EventInvokeConfig for the %s function", name)
	return ids[0]
}
