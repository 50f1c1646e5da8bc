package stack

import (
	"github.com/aws/aws-cdk-go/awscdk/v2"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsevents"
	"github.com/aws/aws-cdk-go/awscdk/v2/awseventstargets"
	"github.com/aws/constructs-go/constructs/v10"
	"github.com/aws/jsii-runtime-go"
)

// Schedules triggers the sweeper every SweepInterval and the partition
// manager daily.
//
// EventBridge rules, not EventBridge Scheduler: both invoke the function
// asynchronously with the same guarantees here, but LocalStack's Scheduler
// accepts schedules without ever firing their targets, while its rules do
// fire, so the same stack runs on LocalStack. Rules also cost nothing for
// scheduled events.
type Schedules struct {
	// Construct is the scope holding the resources (a Go struct embedding a
	// jsii object cannot itself be passed to jsii as a scope).
	Construct         constructs.Construct
	Sweep, Partitions awsevents.Rule
}

// NewSchedules builds the two rules. Events EventBridge cannot deliver (the
// function was deleted, or throttled past the retries) go to the functions'
// failure queue, whose alarm pages.
func NewSchedules(scope constructs.Construct, id string, fns *Functions, p Props) *Schedules {
	c := constructs.NewConstruct(scope, jsii.String(id))
	deliver := &awseventstargets.LambdaFunctionProps{
		DeadLetterQueue: fns.Failures,
		RetryAttempts:   jsii.Number(2),
		MaxEventAge:     awscdk.Duration_Hours(jsii.Number(1)),
	}
	s := &Schedules{Construct: c}
	// A sweep event EventBridge could not deliver within an interval is
	// superseded by the next run's: dropped to the queue, not delivered
	// late beside it.
	deliverSweep := *deliver
	deliverSweep.MaxEventAge = awscdk.Duration_Seconds(jsii.Number(p.SweepInterval.Seconds()))
	s.Sweep = awsevents.NewRule(c, jsii.String("Sweep"), &awsevents.RuleProps{
		Description: jsii.String("Idempotency archive: sweep expired keys into the archive"),
		Schedule:    awsevents.Schedule_Rate(awscdk.Duration_Minutes(jsii.Number(p.SweepInterval.Minutes()))),
		Targets:     &[]awsevents.IRuleTarget{awseventstargets.NewLambdaFunction(fns.Sweep, &deliverSweep)},
	})
	s.Partitions = awsevents.NewRule(c, jsii.String("Partitions"), &awsevents.RuleProps{
		Description: jsii.String("Idempotency archive: keep partitions ahead and retire expired ones"),
		// Daily, at an odd minute in the quiet of the night (UTC), away from
		// the month boundary's midnight.
		Schedule: awsevents.Schedule_Cron(&awsevents.CronOptions{Minute: jsii.String("17"), Hour: jsii.String("3")}),
		Targets:  &[]awsevents.IRuleTarget{awseventstargets.NewLambdaFunction(fns.Partitions, deliver)},
	})
	// No event before the function's retries and failure destination
	// exist: a first run on a new stack would get Lambda's defaults.
	s.Sweep.Node().AddDependency(invokeConfig(fns.Sweep))
	s.Partitions.Node().AddDependency(invokeConfig(fns.Partitions))
	return s
}
