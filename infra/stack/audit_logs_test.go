package stack

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// The API's access log is where an investigation of who read the archive
// starts. With DeletionProtection (the default) the database is
// snapshotted and the schema resource retained, and so are the access log
// and the functions' log groups: deleting the stack keeps the audit trail of
// every read of a permanent archive.
func TestAccessLogsOutliveTheStackWhenTheArchiveDoes(t *testing.T) {
	b := setup(t, nil)
	res := rawResources(t, b)
	found := 0
	for id, r := range res {
		if r.Type != "AWS::ApiGatewayV2::Stage" {
			continue
		}
		settings, _ := r.Properties["AccessLogSettings"].(map[string]any)
		dest, _ := settings["DestinationArn"].(map[string]any)
		att, _ := dest["Fn::GetAtt"].([]any)
		require.Len(t, att, 2, "%s access log destination", id)
		group := att[0].(string)
		found++
		require.Equal(t, "Retain", res[group].DeletionPolicy,
			"%s: the API access log group (who read the archive) is deleted with the stack although the archive is kept", group)
	}
	require.Equal(t, 1, found)
}

// Every log group the functions write to follows the database: kept with a
// protected one, deleted with an unprotected one (a test stack).
func TestLogGroupsFollowTheDatabasesProtection(t *testing.T) {
	for protected, want := range map[bool]string{true: "Retain", false: "Delete"} {
		b := setup(t, func(p *Props) { p.DeletionProtection = &protected })
		res := rawResources(t, b)
		groups := 0
		for id, r := range res {
			if r.Type != "AWS::Logs::LogGroup" || id == "" {
				continue
			}
			if _, ok := r.Properties["RetentionInDays"]; !ok {
				continue
			}
			if strings.Contains(id, "FlowLog") {
				continue // the network's own, kept by CDK's default
			}
			groups++
			require.Equal(t, want, r.DeletionPolicy, "%s with deletion protection %v", id, protected)
		}
		require.GreaterOrEqual(t, groups, 5, "four functions and the access log")
	}
}
