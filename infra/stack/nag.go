package stack

import (
	"strings"

	"github.com/aws/aws-cdk-go/awscdk/v2/awslambda"
	"github.com/aws/constructs-go/constructs/v10"
	"github.com/aws/jsii-runtime-go"
	"github.com/cdklabs/cdk-nag-go/cdknag/v2"
)

// suppress records, on the resources they concern, the cdk-nag findings
// (AwsSolutions and Serverless packs) this stack accepts, each with its
// reason. Suppressions are template metadata only: they change nothing that
// is deployed, and nag_test.go fails on any finding not listed here.
func suppress(s *Stack) {
	on := func(c constructs.IConstruct, id, reason string, appliesTo ...string) {
		sup := &cdknag.NagPackSuppression{Id: jsii.String(id), Reason: jsii.String(reason)}
		if len(appliesTo) > 0 {
			list := make([]any, len(appliesTo))
			for i, a := range appliesTo {
				list[i] = a
			}
			sup.AppliesTo = &list
		}
		cdknag.NagSuppressions_AddResourceSuppressions(c, &[]*cdknag.NagPackSuppression{sup}, jsii.Bool(true))
	}
	p := s.Props
	fns := s.Functions

	for _, fn := range []awslambda.Function{fns.Sweep, fns.Partitions, fns.Lookup, fns.Migrate} {
		on(fn.Role(), "AwsSolutions-IAM5",
			"Resource * only for actions without resource-level permissions: xray:PutTraceSegments and xray:PutTelemetryRecords "+
				"(active tracing), and the EC2 network-interface actions Lambda performs with the function's role to attach it to the VPC. "+
				"Every other statement names its resource; no action is a wildcard.",
			"Resource::*")
	}
	for _, fn := range []awslambda.Function{fns.Sweep, fns.Partitions} {
		on(fn, "Serverless-LambdaDLQ",
			"Asynchronous failures go to an on-failure destination (the failed-invocations queue, alarmed), which records the error "+
				"and the request along with the event; a dead-letter queue would keep the event alone.")
	}
	on(fns.Lookup, "Serverless-LambdaDLQ",
		"Invoked synchronously only (HTTP API, lambda:InvokeFunction from services): the caller gets the error, there is no asynchronous event to keep.")
	on(fns.Migrate, "Serverless-LambdaDLQ",
		"Invoked by CloudFormation for the schema custom resource: a failure is answered to CloudFormation, which fails the deploy and shows the reason.")
	on(fns.Failures, "AwsSolutions-SQS3",
		"This queue is the dead end for failed scheduled invocations (Lambda on-failure destination and EventBridge dead-letter queue); "+
			"an operator reads it when its alarm fires. A queue behind it would hold nothing.")
	on(fns.Failures, "Serverless-SQSRedrivePolicy",
		"Same queue: it has no consumer to fail, so no redrive policy applies.")
	if p.AlarmEmail != "" && p.AlarmTopicArn == "" {
		on(s.Monitoring.Construct, "Serverless-SNSRedrivePolicy",
			"The alarmEmail subscription: an email that cannot be delivered loses a notification, not the alarm, which stays in ALARM "+
				"in CloudWatch and on the dashboard; a dead-letter queue would hold messages no one reads. Route alarms through "+
				"alarmTopicArn for delivery guarantees of your own.")
	}

	if !p.Aurora {
		db := s.Database.Construct
		on(db, "AwsSolutions-RDS11",
			"The default port 5432: only the proxy's security group may reach the instance, in isolated subnets; another port would hide nothing.")
		if !p.MultiAZ {
			on(db, "AwsSolutions-RDS3",
				"Single-AZ by default to halve the cost of an archive whose writers tolerate minutes of downtime (the sweeper retries "+
					"on its next run and the live store keeps the keys meanwhile); set MultiAZ for a standby.")
		}
	}
	if !*p.DeletionProtection {
		on(s.Database.Construct, "AwsSolutions-RDS10",
			"Deletion protection was turned off by the operator (DeletionProtection false), for throwaway stacks such as LocalStack.")
	}
	if !*p.RotateMasterSecret {
		on(s.Database.Construct, "AwsSolutions-SMG4",
			"Rotation was turned off by the operator (RotateMasterSecret false), for LocalStack, which has no Serverless Application "+
				"Repository for the rotation function. The functions never use this secret: they sign in with IAM.")
	}

	// The CDK's own log-retention function (RDS log exports use it).
	for _, child := range *s.Stack.Node().Children() {
		if strings.HasPrefix(*child.Node().Id(), "LogRetention") {
			on(child, "AwsSolutions-IAM4",
				"The CDK's log-retention singleton function, which sets the retention of the RDS log groups that RDS creates itself; "+
					"it logs with AWSLambdaBasicExecutionRole.",
				"Policy::arn:<AWS::Partition>:iam::aws:policy/service-role/AWSLambdaBasicExecutionRole")
			on(child, "AwsSolutions-IAM5",
				"The CDK's log-retention function sets retention on log groups whose names RDS chooses; logs:PutRetentionPolicy on * is how the CDK ships it.",
				"Resource::*")
		}
	}
}
