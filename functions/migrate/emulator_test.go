package main

import (
	"testing"

	"github.com/aws/aws-lambda-go/cfn"
	"github.com/stretchr/testify/require"

	"github.com/idemarchive/idemarchive/shared/testenv"
)

func TestCustomResourceUnderTheRuntimeInterfaceEmulator(t *testing.T) {
	t.Parallel()
	// GIVEN the real bootstrap under the emulator, on an empty schema
	b := setup(t)
	fn := testenv.StartEmulator(t, testenv.Bootstraps(t, "migrate")["migrate"], map[string]string{"DATABASE_URL": b.db.URL})

	// WHEN CloudFormation's Create event is invoked, as CloudFormation does
	fn.Invoke(t, b.event(t, "migrate-cfn-create.json", nil))

	// THEN the function answered the response URL itself, with success
	resp := b.cfn.last(t)
	require.Equal(t, cfn.StatusSuccess, resp.Status, resp.Reason)
	require.Equal(t, PhysicalID, resp.PhysicalResourceID)
	require.EqualValues(t, 5, count(t, b, "SELECT count(*) FROM pg_inherits WHERE inhparent = 'idempotency_key_archive'::regclass"))
	require.NotEmpty(t, testenv.Lines(fn.Output.String(), `"idempotency_archive_newest_partition_days"`), "EMF line in the function's output")

	// WHEN an event it must refuse arrives
	fn.Invoke(t, b.event(t, "migrate-cfn-create.json", func(p map[string]any) { p["OwnerUser"] = "rds_owner" }))
	// THEN the failure and its reason reach CloudFormation
	resp = b.cfn.last(t)
	require.Equal(t, cfn.StatusFailed, resp.Status)
	require.Contains(t, resp.Reason, "reserved")
}
