package stack

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"
)

// The S3 gateway endpoint's policy names CloudFormation's response buckets
// in the stack's own partition: a policy written for "arn:aws" matches
// nothing in aws-cn or aws-us-gov, and the migration could never answer
// CloudFormation there.
func TestS3EndpointPolicyIsInTheStacksPartition(t *testing.T) {
	b := setup(t, nil)
	checked := 0
	for id, r := range b.ofType("AWS::EC2::VPCEndpoint") {
		if r.Properties["VpcEndpointType"] != "Gateway" {
			continue
		}
		doc := r.Properties["PolicyDocument"].(map[string]any)
		for _, s := range doc["Statement"].([]any) {
			res, err := json.Marshal(s.(map[string]any)["Resource"])
			require.NoError(t, err)
			checked++
			require.Contains(t, string(res), `{"Ref":"AWS::Partition"}`, id)
			require.Contains(t, string(res), `:s3:::cloudformation-custom-resource-response-*/*`, id)
			require.NotContains(t, string(res), `arn:aws:`, id)
		}
	}
	require.Positive(t, checked)
}
