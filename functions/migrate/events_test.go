package main

import (
	"encoding/json"
	"maps"
	"slices"
	"testing"

	"github.com/aws/aws-lambda-go/cfn"
	"github.com/stretchr/testify/require"

	"github.com/idemarchive/idemarchive/shared/testenv"
)

// stackProperties are the properties the stack's custom resource sets
// (infra/stack/migration.go), and those CloudFormation adds to every event.
var stackProperties = []string{
	"ServiceToken", "ServiceTimeout",
	"SweeperUser", "ReaderUser", "OwnerUser", "WriterUser",
	"PackageSha256", "LeadMonths", "RetentionMonths", "DatabaseId",
}

// The sample events are what a deploy of the stack sends, property for
// property (old properties included): an event without WriterUser, run
// under the emulator or sam local invoke, provisions no API services' user
// and so never takes the path every deploy takes.
func TestTheSampleEventsCarryEveryPropertyTheStackSends(t *testing.T) {
	t.Parallel()
	for _, fixture := range []string{"migrate-cfn-create.json", "migrate-cfn-update.json", "migrate-cfn-delete.json"} {
		var ev cfn.Event
		require.NoError(t, json.Unmarshal(testenv.Event(t, fixture), &ev), fixture)
		sets := map[string]map[string]any{"ResourceProperties": ev.ResourceProperties}
		if ev.RequestType == cfn.RequestUpdate {
			sets["OldResourceProperties"] = ev.OldResourceProperties
		}
		for name, props := range sets {
			require.ElementsMatch(t, stackProperties, slices.Collect(maps.Keys(props)), "%s: %s", fixture, name)
		}
		p, err := decode(ev.ResourceProperties)
		require.NoError(t, err, fixture)
		require.NotEmpty(t, p.WriterUser, fixture)
	}
}
