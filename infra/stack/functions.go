package stack

import (
	"path/filepath"
	"time"

	"github.com/aws/aws-cdk-go/awscdk/v2"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsec2"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsiam"
	"github.com/aws/aws-cdk-go/awscdk/v2/awslambda"
	"github.com/aws/aws-cdk-go/awscdk/v2/awslambdadestinations"
	"github.com/aws/aws-cdk-go/awscdk/v2/awslogs"
	"github.com/aws/aws-cdk-go/awscdk/v2/awssqs"
	"github.com/aws/constructs-go/constructs/v10"
	"github.com/aws/jsii-runtime-go"
)

// Functions are the four Lambda functions, each with its own role, log group
// and database user.
type Functions struct {
	// Construct is the scope holding the resources (a Go struct embedding a
	// jsii object cannot itself be passed to jsii as a scope).
	Construct                          constructs.Construct
	Sweep, Partitions, Lookup, Migrate awslambda.Function
	// LookupTarget is what callers invoke: LookupLive when
	// Props.LookupProvisionedConcurrency is set (its instances are the
	// provisioned ones), the lookup function otherwise.
	LookupTarget awslambda.IFunction
	// LookupLive is the lookup's alias LookupAlias, with its provisioned
	// concurrency; nil without.
	LookupLive awslambda.Alias
	// Failures receives the scheduled invocations that failed after their
	// retries (the functions' on-failure destination) and the schedule
	// events EventBridge could not deliver (the rules' dead-letter queue).
	Failures awssqs.Queue
}

// fnSpec is what differs between the functions.
type fnSpec struct {
	name, description string
	// memory and timeout: see the comment at each function.
	memory  float64
	timeout time.Duration
	// user is the database user the function connects as.
	user string
	env  map[string]string
	// async configures invocations by a schedule: retries and the failure
	// destination. Nil for functions invoked synchronously.
	async *awslambda.EventInvokeConfigOptions
	// reserved is the function's reserved concurrency; nil for none.
	reserved *int
}

// LookupAlias is the lookup function's alias that carries its provisioned
// concurrency (Props.LookupProvisionedConcurrency).
const LookupAlias = "live"

// NewFunctions builds the functions from <CodeDir>/<name>.zip.
func NewFunctions(scope constructs.Construct, id string, net *Network, db *Database, p Props) *Functions {
	c := constructs.NewConstruct(scope, jsii.String(id))
	f := &Functions{Construct: c}
	f.Failures = awssqs.NewQueue(c, jsii.String("FailedInvocations"), &awssqs.QueueProps{
		Encryption:      awssqs.QueueEncryption_SQS_MANAGED,
		EnforceSSL:      jsii.Bool(true),
		RetentionPeriod: awscdk.Duration_Days(jsii.Number(14)),
	})
	failed := awslambdadestinations.NewSqsDestination(f.Failures)

	// Go binaries on arm64 need little memory; memory also buys CPU share,
	// and these functions wait on PostgreSQL far more than they compute, so
	// 256 MB (about 1/7 of a vCPU) is the floor that keeps cold starts (TLS
	// to the proxy, the first IAM token) short.
	f.Sweep = newFunction(c, net, db, p, fnSpec{
		name: "sweep", description: "Moves expired idempotency keys into the archive, in bounded batches",
		memory: 256,
		// One minute less than the schedule's interval: a run ends before
		// the next starts. The sweeper stops starting batches when the
		// deadline is closer than SWEEP_DEADLINE_MARGIN (35 s), so it ends
		// on its own, drained or not, rather than being cut off.
		timeout: p.sweepTimeout(),
		user:    SweeperUser,
		// The sweeper's role may not create partitions: a missing month is
		// an error naming it (and an alarm), and the partitions function
		// keeps PartitionLeadMonths ahead.
		env: map[string]string{"SWEEP_MISSING_PARTITION": "fail"},
		// A failed sweep is not retried: the next scheduled run, minutes
		// away, is the retry. An event Lambda could not start within an
		// interval (throttled) is dropped to the failure queue, not run
		// beside the next run: that one supersedes it.
		async: &awslambda.EventInvokeConfigOptions{RetryAttempts: jsii.Number(0), OnFailure: failed,
			MaxEventAge: awscdk.Duration_Seconds(jsii.Number(p.SweepInterval.Seconds()))},
	})
	f.Partitions = newFunction(c, net, db, p, fnSpec{
		name: "partitions", description: "Creates archive partitions ahead of time and retires expired ones",
		memory: 256,
		// PARTITION_STATEMENT_TIMEOUT is 2 minutes per DDL statement and a
		// run may detach (CONCURRENTLY, which waits for readers) and create
		// a few: 5 minutes covers a run that has catching up to do, and a
		// longer statement timeout lengthens it (partitionsTimeout).
		timeout: p.partitionsTimeout(),
		user:    OwnerUser,
		async:   &awslambda.EventInvokeConfigOptions{RetryAttempts: jsii.Number(2), OnFailure: failed},
	})
	f.Lookup = newFunction(c, net, db, p, fnSpec{
		name: "lookup", description: "Answers archive lookups and investigation queries (HTTP API and direct invoke)",
		// On the fresh-key path of every payment request: 512 MB for twice
		// the CPU of 256 MB, which shortens a cold start's TLS handshake.
		memory: 512,
		// A lookup is one point query; 10 s covers a cold start and a
		// proxy connection wait, and stays below API Gateway's 30 s.
		timeout:  10 * time.Second,
		user:     ReaderUser,
		reserved: p.LookupReservedConcurrency,
	})
	f.LookupTarget = f.Lookup
	if n := p.LookupProvisionedConcurrency; n > 0 {
		// Provisioned concurrency is set on a version (through an alias):
		// invocations of the function's unqualified name run on
		// $LATEST, which has none.
		f.LookupLive = awslambda.NewAlias(c, jsii.String("LookupLive"), &awslambda.AliasProps{
			AliasName:                       jsii.String(LookupAlias),
			Version:                         f.Lookup.CurrentVersion(),
			ProvisionedConcurrentExecutions: jsii.Number(n),
			Description:                     jsii.String("Lookup with provisioned concurrency: what the API and the middleware invoke"),
		})
		f.LookupTarget = f.LookupLive
	}
	f.Migrate = newFunction(c, net, db, p, fnSpec{
		name: "migrate", description: "CloudFormation custom resource: migrates the schema, creates the users and the partitions",
		memory: 256,
		// Migrations take the tern advisory lock, a new index is built on
		// every archive partition, and partition DDL waits up to
		// PARTITION_LOCK_TIMEOUT: the longest Lambda allows. The handler
		// answers CloudFormation before it, even when the database is
		// unreachable.
		timeout: migrateTimeout,
		user:    MasterUser,
		// CloudFormation invokes a custom resource asynchronously. Lambda's
		// default retries would run a failed or timed-out Create or Update
		// again up to hours later, after CloudFormation gave up on it
		// (ServiceTimeout) and while it may be rolling back: the stale
		// event would race the rollback's own invocation and could give the
		// users the failed update's roles back. The handler answers every
		// event it receives; a function that dies without answering fails
		// the deploy at ServiceTimeout instead, and its event goes to the
		// failed-invocations queue. For the same race, an event is run only
		// while a whole run still ends before ServiceTimeout: one queued
		// longer (the account's concurrency used up) is dropped to that
		// queue, and the deploy fails at ServiceTimeout, rather than run
		// beside the rollback.
		async: &awslambda.EventInvokeConfigOptions{
			RetryAttempts: jsii.Number(0), MaxEventAge: awscdk.Duration_Seconds(jsii.Number(migrateMaxEventAge.Seconds())), OnFailure: failed,
		},
	})
	// The deploy's migrations and partition run sign in as the partitions
	// function's user: they run code that user's role may change (its
	// functions, triggers on its tables), which must never run as the
	// master user.
	db.GrantConnect(f.Migrate, OwnerUser)
	return f
}

func newFunction(scope constructs.Construct, net *Network, db *Database, p Props, s fnSpec) awslambda.Function {
	id := titled(s.name)
	logs := awslogs.NewLogGroup(scope, jsii.String(id+"Logs"), &awslogs.LogGroupProps{
		Retention:     retention(p.LogRetentionDays),
		RemovalPolicy: logRemoval(p),
	})
	role := awsiam.NewRole(scope, jsii.String(id+"Role"), &awsiam.RoleProps{
		AssumedBy:   awsiam.NewServicePrincipal(jsii.String("lambda.amazonaws.com"), nil),
		Description: jsii.String("Idempotency archive " + s.name + " function"),
	})
	logs.GrantWrite(role)
	// What AWSLambdaVPCAccessExecutionRole grants, inline: Lambda manages the
	// function's network interfaces with the function's role. These EC2
	// actions take no resource-level restriction, hence "*".
	role.AddToPolicy(awsiam.NewPolicyStatement(&awsiam.PolicyStatementProps{
		Actions: jsii.Strings("ec2:CreateNetworkInterface", "ec2:DescribeNetworkInterfaces", "ec2:DescribeSubnets",
			"ec2:DeleteNetworkInterface", "ec2:AssignPrivateIpAddresses", "ec2:UnassignPrivateIpAddresses"),
		Resources: jsii.Strings("*"),
	}))

	env := p.settingsEnv()
	env["DATABASE_URL"] = db.URL(s.user)
	env["DATABASE_IAM_AUTH"] = "true"
	env["DATABASE_EXEC_MODE"] = execMode
	for k, v := range s.env {
		env[k] = v
	}
	props := &awslambda.FunctionProps{
		Description:    jsii.String(s.description),
		Code:           awslambda.Code_FromAsset(jsii.String(filepath.Join(p.CodeDir, s.name+".zip")), nil),
		Handler:        jsii.String("bootstrap"),
		Runtime:        awslambda.Runtime_PROVIDED_AL2023(),
		Architecture:   awslambda.Architecture_ARM_64(),
		MemorySize:     jsii.Number(s.memory),
		Timeout:        awscdk.Duration_Seconds(jsii.Number(s.timeout.Seconds())),
		Tracing:        awslambda.Tracing_ACTIVE,
		LoggingFormat:  awslambda.LoggingFormat_JSON,
		LogGroup:       logs,
		Role:           role,
		Environment:    stringMap(env),
		Vpc:            net.Vpc,
		VpcSubnets:     isolated,
		SecurityGroups: &[]awsec2.ISecurityGroup{net.Functions},
	}
	if s.reserved != nil {
		props.ReservedConcurrentExecutions = jsii.Number(*s.reserved)
	}
	if s.async != nil {
		props.RetryAttempts = s.async.RetryAttempts
		props.OnFailure = s.async.OnFailure
		props.MaxEventAge = s.async.MaxEventAge
		if props.MaxEventAge == nil {
			props.MaxEventAge = awscdk.Duration_Hours(jsii.Number(1))
		}
	}
	fn := awslambda.NewFunction(scope, jsii.String(id), props)
	db.GrantConnect(role, s.user)
	return fn
}

// invokeConfig is fn's AWS::Lambda::EventInvokeConfig: the retries, event
// age and failure destination of its asynchronous invocations, which the
// CDK builds as fn's child "EventInvokeConfig" from fnSpec.async. It is a
// resource of its own, so whatever invokes fn asynchronously depends on it:
// an invocation before it exists gets Lambda's defaults (2 retries, events
// kept 6 hours, no failure destination). It panics for a function without
// one, a mistake in this package.
func invokeConfig(fn awslambda.Function) constructs.IConstruct {
	return fn.Node().FindChild(jsii.String("EventInvokeConfig"))
}

func titled(s string) string { return string(s[0]-'a'+'A') + s[1:] }

func stringMap(m map[string]string) *map[string]*string {
	out := make(map[string]*string, len(m))
	for k, v := range m {
		out[k] = jsii.String(v)
	}
	return &out
}

// retentionDays are the retentions CloudWatch Logs offers, in days.
var retentionDays = map[int]awslogs.RetentionDays{
	1: awslogs.RetentionDays_ONE_DAY, 3: awslogs.RetentionDays_THREE_DAYS, 5: awslogs.RetentionDays_FIVE_DAYS,
	7: awslogs.RetentionDays_ONE_WEEK, 14: awslogs.RetentionDays_TWO_WEEKS, 30: awslogs.RetentionDays_ONE_MONTH,
	60: awslogs.RetentionDays_TWO_MONTHS, 90: awslogs.RetentionDays_THREE_MONTHS, 120: awslogs.RetentionDays_FOUR_MONTHS,
	150: awslogs.RetentionDays_FIVE_MONTHS, 180: awslogs.RetentionDays_SIX_MONTHS, 365: awslogs.RetentionDays_ONE_YEAR,
	400: awslogs.RetentionDays_THIRTEEN_MONTHS, 545: awslogs.RetentionDays_EIGHTEEN_MONTHS, 731: awslogs.RetentionDays_TWO_YEARS,
	1096: awslogs.RetentionDays_THREE_YEARS, 1827: awslogs.RetentionDays_FIVE_YEARS, 2192: awslogs.RetentionDays_SIX_YEARS,
	2557: awslogs.RetentionDays_SEVEN_YEARS, 2922: awslogs.RetentionDays_EIGHT_YEARS, 3288: awslogs.RetentionDays_NINE_YEARS,
	3653: awslogs.RetentionDays_TEN_YEARS,
}

func retention(days int) awslogs.RetentionDays { return retentionDays[days] }
