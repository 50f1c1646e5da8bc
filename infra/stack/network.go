package stack

import (
	"github.com/aws/aws-cdk-go/awscdk/v2"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsec2"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsiam"
	"github.com/aws/aws-cdk-go/awscdk/v2/awslogs"
	"github.com/aws/constructs-go/constructs/v10"
	"github.com/aws/jsii-runtime-go"
)

// Network is a VPC with private isolated subnets only: nothing in it reaches
// the internet, so there is no NAT gateway to pay for. What the workloads do
// call outside the VPC goes through endpoints:
//
//   - S3 (a gateway endpoint, free): the migration function answers
//     CloudFormation through a pre-signed S3 URL.
//   - Secrets Manager (an interface endpoint): the master-password rotation
//     function. The functions themselves read no secret: they authenticate to
//     RDS Proxy with IAM tokens, which are signed locally. Without rotation
//     (RotateMasterSecret false) there is no endpoint.
//
// Deliberately absent: CloudWatch Logs and X-Ray endpoints. Lambda ships a
// function's stdout/stderr and its traces itself, outside the function's
// network interface, and the EMF metrics travel in the logs; no function calls
// the CloudWatch, Logs or X-Ray APIs.
type Network struct {
	// Construct is the scope holding the resources (a Go struct embedding a
	// jsii object cannot itself be passed to jsii as a scope).
	Construct constructs.Construct
	Vpc       awsec2.Vpc
	// Functions is the security group of every function.
	Functions awsec2.SecurityGroup
	// SecretsManager is the Secrets Manager endpoint, nil without rotation.
	SecretsManager awsec2.InterfaceVpcEndpoint
}

// isolated selects the subnets of the database, the proxy, the functions and
// the interface endpoints.
var isolated = &awsec2.SubnetSelection{SubnetType: awsec2.SubnetType_PRIVATE_ISOLATED}

// NewNetwork builds the VPC over two availability zones (RDS subnet groups
// and the proxy need two).
func NewNetwork(scope constructs.Construct, id string, p Props) *Network {
	c := constructs.NewConstruct(scope, jsii.String(id))
	vpc := awsec2.NewVpc(c, jsii.String("Vpc"), &awsec2.VpcProps{
		MaxAzs:      jsii.Number(2),
		NatGateways: jsii.Number(0),
		SubnetConfiguration: &[]*awsec2.SubnetConfiguration{{
			Name:       jsii.String("isolated"),
			SubnetType: awsec2.SubnetType_PRIVATE_ISOLATED,
			CidrMask:   jsii.Number(24),
		}},
	})
	// The S3 endpoint carries one thing: the migration function's answer to
	// CloudFormation, a PUT to a pre-signed URL in CloudFormation's response
	// bucket of the stack's region, which AWS names
	// cloudformation-custom-resource-response-<region without dashes>
	// (uswest2). Its policy allows that and nothing else, so no function can
	// send data to any other bucket, pre-signed URL or not: not even to a
	// bucket someone else named cloudformation-custom-resource-response-x.
	s3 := vpc.AddGatewayEndpoint(jsii.String("S3"), &awsec2.GatewayVpcEndpointOptions{Service: awsec2.GatewayVpcEndpointAwsService_S3()})
	s3.AddToPolicy(awsiam.NewPolicyStatement(&awsiam.PolicyStatementProps{
		Principals: &[]awsiam.IPrincipal{awsiam.NewAnyPrincipal()},
		Actions:    jsii.Strings("s3:PutObject"),
		Resources:  &[]*string{cfnResponseObjects()},
	}))
	// Rejected connections are the first thing to look at when a function
	// times out connecting to the proxy.
	vpc.AddFlowLog(jsii.String("FlowLog"), &awsec2.FlowLogOptions{
		TrafficType: awsec2.FlowLogTrafficType_REJECT,
		Destination: awsec2.FlowLogDestination_ToCloudWatchLogs(awslogs.NewLogGroup(c, jsii.String("FlowLogGroup"), &awslogs.LogGroupProps{
			Retention: retention(p.LogRetentionDays),
		}), nil),
	})
	var secrets awsec2.InterfaceVpcEndpoint
	if *p.RotateMasterSecret {
		secrets = vpc.AddInterfaceEndpoint(jsii.String("SecretsManager"), &awsec2.InterfaceVpcEndpointOptions{
			Service: awsec2.InterfaceVpcEndpointAwsService_SECRETS_MANAGER(),
			Subnets: isolated,
			// Not open to the whole VPC: the rotation function's security
			// group is let in by the rotation construct.
			Open: jsii.Bool(false),
		})
	}
	functions := awsec2.NewSecurityGroup(c, jsii.String("FunctionsSecurityGroup"), &awsec2.SecurityGroupProps{
		Vpc:         vpc,
		Description: jsii.String("Idempotency archive functions: out to the database proxy and the VPC endpoints only"),
		// Out: the proxy on 5432 (added where the proxy lets the functions
		// in) and HTTPS, which in these isolated subnets reaches only the
		// S3 gateway endpoint.
		AllowAllOutbound: jsii.Bool(false),
	})
	functions.AddEgressRule(awsec2.Peer_AnyIpv4(), awsec2.Port_Tcp(jsii.Number(443)),
		jsii.String("HTTPS: the S3 gateway endpoint (CloudFormation responses)"), nil)
	return &Network{Construct: c, Vpc: vpc, Functions: functions, SecretsManager: secrets}
}

// cfnResponseObjects is the ARN of every object in CloudFormation's
// custom-resource response bucket of the stack's partition and region:
// arn:<partition>:s3:::cloudformation-custom-resource-response-<region without
// dashes>/*. The region is the deploy's own (AWS::Region), its dashes dropped
// by CloudFormation, so one template serves every region.
func cfnResponseObjects() *string {
	region := awscdk.Fn_Join(jsii.String(""), awscdk.Fn_Split(jsii.String("-"), awscdk.Aws_REGION(), nil))
	return awscdk.Fn_Join(jsii.String(""), &[]*string{
		jsii.String("arn:"), awscdk.Aws_PARTITION(),
		jsii.String(":s3:::cloudformation-custom-resource-response-"), region, jsii.String("/*"),
	})
}
