// Package stack is the AWS CDK stack of the idempotency key archive: the
// functions of this repository on Lambda, PostgreSQL behind RDS Proxy, the
// schedules, an IAM-authorized HTTP API for lookups, the schema migrated at
// every deploy, and an alarm for every item of the runbook's observability
// checklist.
//
// One construct per concern, composed by New:
//
//	Network     VPC with isolated subnets and the endpoints the workloads use
//	Database    RDS PostgreSQL (or Aurora Serverless v2) and RDS Proxy
//	Functions   sweep, partitions, lookup and migrate, from <CodeDir>/<fn>.zip
//	Migration   the custom resource that migrates the schema at deploy
//	Schedules   EventBridge rules for the sweeper and the partition manager
//	API         HTTP API (IAM authorization) in front of the lookup function
//	Monitoring  SNS topics, alarms and the dashboard
//
// Names that the code also uses (metric names and namespace, configuration
// variables) come from the code's own packages, shared/metrics and
// shared/settings, so the stack and the functions cannot disagree.
//
//	app := awscdk.NewApp(nil)
//	s, err := stack.New(app, "IdempotencyArchive", stack.Props{CodeDir: "../bin"})
package stack

import (
	"github.com/aws/aws-cdk-go/awscdk/v2"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsec2"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsiam"
	"github.com/aws/aws-cdk-go/awscdk/v2/awslambda"
	"github.com/aws/constructs-go/constructs/v10"
	"github.com/aws/jsii-runtime-go"
)

// Stack is the composed stack.
type Stack struct {
	Stack      awscdk.Stack
	Props      Props // with defaults applied
	Network    *Network
	Database   *Database
	Functions  *Functions
	Migration  *Migration
	Schedules  *Schedules
	API        *API
	Monitoring *Monitoring
}

// New validates p and builds the stack.
func New(scope constructs.Construct, id string, p Props) (*Stack, error) {
	if err := p.validate(); err != nil {
		return nil, err
	}
	p = p.withDefaults()
	sprops := p.StackProps
	if sprops.Description == nil {
		sprops.Description = jsii.String("Idempotency key archive: sweep, partitions and lookup functions on RDS PostgreSQL")
	}
	s := &Stack{Stack: awscdk.NewStack(scope, jsii.String(id), &sprops), Props: p}
	s.Network = NewNetwork(s.Stack, "Network", p)
	s.Database = NewDatabase(s.Stack, "Database", s.Network, p)
	s.Functions = NewFunctions(s.Stack, "Functions", s.Network, s.Database, p)
	var err error
	if s.Migration, err = NewMigration(s.Stack, "Migration", s.Network, s.Database, s.Functions, p); err != nil {
		return nil, err
	}
	s.Schedules = NewSchedules(s.Stack, "Schedules", s.Functions, p)
	// No scheduled run before the deploy's migration: on a fresh stack the
	// schema and the users would not exist yet.
	// Every deploy: a deploy that ships a migration ships the code that
	// needs it, and CloudFormation updates a function's code only once the
	// schema is migrated, not beside it (lookups and scheduled runs would
	// meet the old schema meanwhile).
	for _, fn := range []awslambda.Function{s.Functions.Sweep, s.Functions.Partitions, s.Functions.Lookup} {
		fn.Node().AddDependency(s.Migration.Resource)
	}
	s.Schedules.Sweep.Node().AddDependency(s.Migration.Resource)
	s.Schedules.Partitions.Node().AddDependency(s.Migration.Resource)
	s.API = NewAPI(s.Stack, "Api", s.Functions.LookupTarget, s.Functions.Lookup, p)
	if s.Monitoring, err = NewMonitoring(s.Stack, "Monitoring", s.Functions, s.API, s.Database, p); err != nil {
		return nil, err
	}
	suppress(s)
	awscdk.NewCfnOutput(s.Stack, jsii.String("ApiUrl"), &awscdk.CfnOutputProps{
		Value: s.API.HTTPAPI.ApiEndpoint(), Description: jsii.String("HTTP API (IAM authorization: sign requests with SigV4)"),
	})
	// With provisioned concurrency, the alias-qualified name: an
	// unqualified invocation runs on $LATEST, which has none.
	lookupName := s.Functions.Lookup.FunctionName()
	if p.LookupProvisionedConcurrency > 0 {
		lookupName = awscdk.Fn_Join(jsii.String(":"), &[]*string{lookupName, jsii.String(LookupAlias)})
	}
	awscdk.NewCfnOutput(s.Stack, jsii.String("LookupFunctionName"), &awscdk.CfnOutputProps{
		Value: lookupName, Description: jsii.String("For the middleware's Lambda archive client (lambda:InvokeFunction)"),
	})
	awscdk.NewCfnOutput(s.Stack, jsii.String("WriterDatabaseUrl"), &awscdk.CfnOutputProps{
		Value:       jsii.String(s.Database.URL(WriterUser)),
		Description: jsii.String("DATABASE_URL for API services' Postgres live store (IAM token; GrantWriterConnect, AllowDatabaseFrom)"),
	})
	awscdk.NewCfnOutput(s.Stack, jsii.String("ProxyEndpoint"), &awscdk.CfnOutputProps{
		Value: s.Database.Proxy.Endpoint(), Description: jsii.String("RDS Proxy endpoint (IAM authentication, TLS required)"),
	})
	return s, nil
}

// GrantWriterConnect lets an API service's role connect through the proxy as
// WriterUser (idempotency_writer: the Postgres live store), with an IAM
// token; use the WriterDatabaseUrl output as its DATABASE_URL. The service
// must also reach the proxy: see AllowDatabaseFrom.
func (s *Stack) GrantWriterConnect(grantee awsiam.IGrantable) {
	s.Database.GrantConnect(grantee, WriterUser)
}

// AllowDatabaseFrom lets peer (an API service's security group, in this VPC
// or a peered one) reach the proxy on 5432.
func (s *Stack) AllowDatabaseFrom(peer awsec2.IConnectable) {
	s.Database.Proxy.Connections().AllowFrom(peer, awsec2.Port_Tcp(jsii.Number(5432)), jsii.String("an API service"))
}

// GrantLookupInvoke lets a service's role invoke the lookup function directly.
func (s *Stack) GrantLookupInvoke(grantee awsiam.IGrantable) awsiam.Grant {
	return s.API.GrantLookupInvoke(grantee)
}
