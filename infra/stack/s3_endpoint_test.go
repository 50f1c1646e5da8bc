package stack

import (
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// The S3 gateway endpoint's policy names CloudFormation's response bucket of
// the deploy's own partition and region, whose name AWS spells without the
// region's dashes: a policy written for "arn:aws" matches nothing in aws-cn
// or aws-us-gov, one with the dashes kept matches no bucket at all (the
// migration could never answer CloudFormation), and a wildcard lets a
// function PUT to any bucket whose owner chose a name with that prefix.
func TestS3EndpointPolicyIsTheRegionsResponseBucket(t *testing.T) {
	b := setup(t, nil)
	checked := 0
	for id, r := range b.ofType("AWS::EC2::VPCEndpoint") {
		if r.Properties["VpcEndpointType"] != "Gateway" {
			continue
		}
		doc := r.Properties["PolicyDocument"].(map[string]any)
		for _, s := range doc["Statement"].([]any) {
			checked++
			res := s.(map[string]any)["Resource"]
			for _, c := range []struct{ partition, region, want string }{
				{"aws", "us-west-2", "arn:aws:s3:::cloudformation-custom-resource-response-uswest2/*"},
				{"aws", "eu-central-1", "arn:aws:s3:::cloudformation-custom-resource-response-eucentral1/*"},
				{"aws-cn", "cn-north-1", "arn:aws-cn:s3:::cloudformation-custom-resource-response-cnnorth1/*"},
				{"aws-us-gov", "us-gov-west-1", "arn:aws-us-gov:s3:::cloudformation-custom-resource-response-usgovwest1/*"},
			} {
				got, err := evalIntrinsic(res, map[string]string{"AWS::Partition": c.partition, "AWS::Region": c.region})
				require.NoError(t, err, id)
				require.Equal(t, c.want, got, "%s in %s", id, c.region)
				require.NotContains(t, got, "-*", id)
			}
		}
	}
	require.Positive(t, checked)
}

// evalIntrinsic evaluates the CloudFormation intrinsics a policy ARN is
// built from (Ref of a pseudo parameter, Fn::Join, Fn::Split) for the given
// pseudo parameters; anything else is an error, so a template that changes
// shape fails the test instead of passing unevaluated.
func evalIntrinsic(v any, refs map[string]string) (string, error) {
	switch x := v.(type) {
	case string:
		return x, nil
	case map[string]any:
		if len(x) != 1 {
			return "", fmt.Errorf("not one intrinsic: %v", x)
		}
		if r, ok := x["Ref"].(string); ok {
			s, ok := refs[r]
			if !ok {
				return "", fmt.Errorf("unknown Ref %q", r)
			}
			return s, nil
		}
		if j, ok := x["Fn::Join"].([]any); ok && len(j) == 2 {
			sep, _ := j[0].(string)
			parts, err := evalList(j[1], refs)
			if err != nil {
				return "", err
			}
			return strings.Join(parts, sep), nil
		}
	}
	return "", fmt.Errorf("cannot evaluate %v", v)
}

func evalList(v any, refs map[string]string) ([]string, error) {
	if m, ok := v.(map[string]any); ok {
		if s, ok := m["Fn::Split"].([]any); ok && len(s) == 2 {
			sep, _ := s[0].(string)
			src, err := evalIntrinsic(s[1], refs)
			if err != nil {
				return nil, err
			}
			return strings.Split(src, sep), nil
		}
		return nil, fmt.Errorf("cannot evaluate list %v", v)
	}
	items, ok := v.([]any)
	if !ok {
		return nil, fmt.Errorf("not a list: %v", v)
	}
	out := make([]string, len(items))
	for i, it := range items {
		s, err := evalIntrinsic(it, refs)
		if err != nil {
			return nil, err
		}
		out[i] = s
	}
	return out, nil
}
