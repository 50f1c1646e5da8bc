package stack

import (
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
	migration := ""
	for id, r := range res {
		if r.Type == SchemaResourceType {
			migration = id
		}
	}
	require.NotEmpty(t, migration)
	for _, name := range []string{"sweep", "partitions", "lookup"} {
		id := b.functionID(t, name)
		require.Contains(t, res[id].DependsOn, migration,
			"the %s function's code is updated before (or while) the migration runs: new code against the old schema", name)
	}
}
