package stack

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/aws/aws-cdk-go/awscdk/v2/assertions"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsec2"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsiam"
	"github.com/aws/jsii-runtime-go"
	"github.com/stretchr/testify/require"
)

// API services get a user of their own (idempotency_writer, for the
// Postgres live store), a way to sign in as it, and a way to reach the proxy.
func TestAPIServicesCanUseTheLiveStore(t *testing.T) {
	var service awsiam.Role
	var serviceSG awsec2.SecurityGroup
	b := setupWith(t, nil, func(s *Stack) {
		service = awsiam.NewRole(s.Stack, jsii.String("ServiceRole"), &awsiam.RoleProps{AssumedBy: awsiam.NewServicePrincipal(jsii.String("ecs-tasks.amazonaws.com"), nil)})
		serviceSG = awsec2.NewSecurityGroup(s.Stack, jsii.String("ServiceSG"), &awsec2.SecurityGroupProps{Vpc: s.Network.Vpc})
		s.GrantWriterConnect(service)
		s.AllowDatabaseFrom(serviceSG)
	})
	_ = service
	// The migration creates the writer user.
	b.template.HasResourceProperties(jsii.String(SchemaResourceType), map[string]any{"WriterUser": WriterUser})
	// The service's role may connect as that user, through the proxy.
	b.template.HasResourceProperties(jsii.String("AWS::IAM::Policy"), map[string]any{
		"Roles": []any{map[string]any{"Ref": assertions.Match_StringLikeRegexp(jsii.String("ServiceRole.*"))}},
		"PolicyDocument": map[string]any{"Statement": []any{map[string]any{
			"Action": "rds-db:connect", "Effect": "Allow",
		}}},
	})
	raw, _ := json.Marshal(b.template.ToJSON())
	require.Contains(t, string(raw), ":dbuser:", "rds-db:connect names a database user")
	require.Contains(t, string(raw), "/"+WriterUser, "the writer user")
	// The service's security group reaches the proxy on 5432.
	b.template.HasResourceProperties(jsii.String("AWS::EC2::SecurityGroupIngress"), map[string]any{
		"FromPort": 5432, "ToPort": 5432, "IpProtocol": "tcp",
		"SourceSecurityGroupId": map[string]any{"Fn::GetAtt": []any{assertions.Match_StringLikeRegexp(jsii.String("ServiceSG.*")), "GroupId"}},
	})
	b.template.HasOutput(jsii.String("WriterDatabaseUrl"), map[string]any{})
}

// The functions reach the proxy and HTTPS only, and the S3 endpoint allows
// nothing but CloudFormation's responses: no function can send data out.
func TestTheFunctionsCannotSendDataOut(t *testing.T) {
	b := setup(t, nil)
	b.template.HasResourceProperties(jsii.String("AWS::EC2::VPCEndpoint"), map[string]any{
		"VpcEndpointType": "Gateway",
		"PolicyDocument": map[string]any{"Statement": []any{map[string]any{
			"Action": "s3:PutObject", "Effect": "Allow", "Principal": map[string]any{"AWS": "*"},
			"Resource": map[string]any{"Fn::Join": []any{"", []any{
				"arn:", map[string]any{"Ref": "AWS::Partition"}, ":s3:::cloudformation-custom-resource-response-",
				map[string]any{"Fn::Join": []any{"", map[string]any{"Fn::Split": []any{"-", map[string]any{"Ref": "AWS::Region"}}}}}, "/*",
			}}},
		}}},
	})
	for id, sg := range b.ofType("AWS::EC2::SecurityGroup") {
		if d, _ := sg.Properties["GroupDescription"].(string); strings.HasPrefix(d, "Idempotency archive functions") {
			egress, _ := json.Marshal(sg.Properties["SecurityGroupEgress"])
			require.NotContains(t, string(egress), `"IpProtocol":"-1"`, "%s allows every protocol out", id)
			require.Contains(t, string(egress), `"FromPort":443`)
		}
	}
}

// Deploys wait for what they need: the schedules for the migration (no run
// before the schema exists), the migration for up to 15 minutes, and
// CloudFormation for an answer for no longer than 20.
func TestDeploysWaitForTheMigration(t *testing.T) {
	b := setup(t, nil)
	raw, _ := json.Marshal(b.template.ToJSON())
	var doc struct {
		Resources map[string]struct {
			Type       string
			DependsOn  []string
			Properties map[string]any
		}
	}
	require.NoError(t, json.Unmarshal(raw, &doc))
	migration := ""
	for id, r := range doc.Resources {
		if r.Type == SchemaResourceType {
			migration = id
			require.Equal(t, "1200", fmt.Sprint(r.Properties["ServiceTimeout"]))
		}
	}
	require.NotEmpty(t, migration)
	rules := 0
	for id, r := range doc.Resources {
		if r.Type == "AWS::Events::Rule" {
			rules++
			require.Contains(t, r.DependsOn, migration, "%s runs before the migration", id)
		}
	}
	require.Equal(t, 2, rules)
	require.EqualValues(t, 900, b.json.Resources[b.functionID(t, "migrate")].Properties["Timeout"])
}
