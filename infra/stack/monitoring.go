package stack

import (
	"fmt"
	"strings"

	"github.com/aws/aws-cdk-go/awscdk/v2"
	"github.com/aws/aws-cdk-go/awscdk/v2/awscloudwatch"
	"github.com/aws/aws-cdk-go/awscdk/v2/awscloudwatchactions"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsiam"
	"github.com/aws/aws-cdk-go/awscdk/v2/awslambda"
	"github.com/aws/aws-cdk-go/awscdk/v2/awslogs"
	"github.com/aws/aws-cdk-go/awscdk/v2/awssns"
	"github.com/aws/aws-cdk-go/awscdk/v2/awssnssubscriptions"
	"github.com/aws/constructs-go/constructs/v10"
	"github.com/aws/jsii-runtime-go"

	"github.com/idemarchive/idemarchive/shared/metrics"
)

// Thresholds of the runbook's checklist, and the windows they are judged over.
const (
	// BacklogThreshold: "Alert above 100,000".
	BacklogThreshold = 100_000
	// PartitionDaysThreshold: "Page below 30".
	PartitionDaysThreshold = 30
	// LookupP99ThresholdMs: "Alert if p99 exceeds 5 ms".
	LookupP99ThresholdMs = 5
	// BytesPerRowFactor: "well above the modelled bytes per row" is read as
	// twice the measured baseline.
	BytesPerRowFactor = 2
	// BytesPerRowMinRows: below this many rows the fixed size of empty
	// partitions and index root pages dominates bytes per row, so the ratio
	// says nothing about a column creeping in.
	BytesPerRowMinRows = 100_000
	// DurationNearTimeout is the fraction of its window (its timeout less
	// SWEEP_DEADLINE_MARGIN, where it stops starting batches) a sweep may
	// run before its duration alarm fires.
	DurationNearTimeout = 0.9
	// LookupServerErrorsMetric counts lookups answered 5xx, from the lookup
	// function's log lines.
	LookupServerErrorsMetric = "idempotency_archive_lookup_5xx"
)

// Monitoring holds the alarms (one per checklist item, plus the functions'
// errors, throttles and sweep duration) and the dashboard.
type Monitoring struct {
	// Construct is the scope holding the resources (a Go struct embedding a
	// jsii object cannot itself be passed to jsii as a scope).
	Construct constructs.Construct
	// Page receives the alarms that need someone now; Notify those that
	// need someone this week.
	Page, Notify awssns.ITopic
	// Checklist maps every metric name of metrics.Checklist to its alarm.
	Checklist map[string]awscloudwatch.Alarm
	Dashboard awscloudwatch.Dashboard
}

// NewMonitoring builds the topics, the alarms and the dashboard. It fails
// when a checklist metric of shared/metrics has no alarm here, so that a
// metric added to the checklist cannot ship unwatched.
func NewMonitoring(scope constructs.Construct, id string, fns *Functions, api *API, db *Database, p Props) (*Monitoring, error) {
	c := constructs.NewConstruct(scope, jsii.String(id))
	m := &Monitoring{Construct: c, Checklist: map[string]awscloudwatch.Alarm{}}
	if p.AlarmTopicArn != "" {
		m.Page = awssns.Topic_FromTopicArn(c, jsii.String("PageTopic"), jsii.String(p.AlarmTopicArn))
	} else {
		topic := awssns.NewTopic(c, jsii.String("Alarms"), &awssns.TopicProps{
			DisplayName: jsii.String("Idempotency archive alarms"),
			EnforceSSL:  jsii.Bool(true),
		})
		// EnforceSSL gives the topic a policy of its own, which replaces
		// SNS's default one, the one that lets the account's alarms
		// publish: CloudWatch publishes as its service principal, which
		// needs an Allow, or every alarm action fails ("not authorized to
		// perform: SNS:Publish") and no alarm reaches anyone. Only this
		// account's alarms.
		stack := awscdk.Stack_Of(c)
		topic.AddToResourcePolicy(awsiam.NewPolicyStatement(&awsiam.PolicyStatementProps{
			Sid:        jsii.String("CloudWatchAlarmsPublish"),
			Effect:     awsiam.Effect_ALLOW,
			Principals: &[]awsiam.IPrincipal{awsiam.NewServicePrincipal(jsii.String("cloudwatch.amazonaws.com"), nil)},
			Actions:    jsii.Strings("sns:Publish"),
			Resources:  jsii.Strings(*topic.TopicArn()),
			Conditions: &map[string]any{
				"StringEquals": map[string]any{"aws:SourceAccount": stack.Account()},
				"ArnLike": map[string]any{"aws:SourceArn": fmt.Sprintf("arn:%s:cloudwatch:%s:%s:alarm:*",
					*stack.Partition(), *stack.Region(), *stack.Account())},
			},
		}))
		if p.AlarmEmail != "" {
			topic.AddSubscription(awssnssubscriptions.NewEmailSubscription(jsii.String(p.AlarmEmail), nil))
		} else {
			// Said at every synth and deploy: alarms that reach nobody
			// are a silent archive (a sweep that stopped, a lookup 5xx).
			awscdk.Annotations_Of(topic).AddWarningV2(jsii.String("idemarchive:alarmsUnrouted"),
				jsii.String("no alarmEmail or alarmTopicArn: the alarm topic has no subscriber, so no alarm reaches anyone until you subscribe to it"), nil)
		}
		m.Page = topic
	}
	m.Notify = m.Page
	if p.NotifyTopicArn != "" {
		m.Notify = awssns.Topic_FromTopicArn(c, jsii.String("NotifyTopic"), jsii.String(p.NotifyTopicArn))
	}

	metric := func(name, statistic string, period awscdk.Duration) awscloudwatch.Metric {
		return awscloudwatch.NewMetric(&awscloudwatch.MetricProps{
			Namespace: jsii.String(p.MetricsNamespace), MetricName: jsii.String(name),
			Statistic: jsii.String(statistic), Period: period,
		})
	}
	minutes := func(n float64) awscdk.Duration { return awscdk.Duration_Minutes(jsii.Number(n)) }
	day := awscdk.Duration_Days(jsii.Number(1))
	stack := *awscdk.Stack_Of(c).StackName()

	alarm := func(id string, subject awscloudwatch.IMetric, topic awssns.ITopic, o *awscloudwatch.CreateAlarmOptions) awscloudwatch.Alarm {
		o.AlarmName = jsii.String(stack + "-" + id)
		if o.TreatMissingData == "" {
			o.TreatMissingData = awscloudwatch.TreatMissingData_NOT_BREACHING
		}
		a := awscloudwatch.NewAlarm(c, jsii.String(titledID(id)), &awscloudwatch.AlarmProps{
			Metric: subject, AlarmName: o.AlarmName, AlarmDescription: o.AlarmDescription,
			Threshold: o.Threshold, EvaluationPeriods: o.EvaluationPeriods, DatapointsToAlarm: o.DatapointsToAlarm,
			ComparisonOperator: o.ComparisonOperator, TreatMissingData: o.TreatMissingData,
		})
		a.AddAlarmAction(awscloudwatchactions.NewSnsAction(topic))
		a.AddOkAction(awscloudwatchactions.NewSnsAction(topic))
		return a
	}
	describe := func(def metrics.Definition, todo string) *string {
		return jsii.String(def.Description + " What to do: " + todo)
	}

	// One builder per checklist item, keyed by the code's metric names.
	checklist := map[string]func(metrics.Definition) awscloudwatch.Alarm{
		metrics.ExpiredBacklog: func(d metrics.Definition) awscloudwatch.Alarm {
			// One window per sweep interval. Three windows in a row without
			// a report page too: every run reports the backlog, so silence
			// means no run, or a backlog too large to count in time.
			window := awscdk.Duration_Minutes(jsii.Number(max(5, p.SweepInterval.Minutes())))
			return alarm("expired-backlog", metric(d.Name, "Maximum", window), m.Page, &awscloudwatch.CreateAlarmOptions{
				AlarmDescription: describe(d, "check the sweep function's errors and duration; run archivectl sweep to drain by hand. "+
					"No report for three sweep intervals also fires this alarm: check that the sweep schedule is enabled and the function runs."),
				Threshold:          jsii.Number(BacklogThreshold),
				ComparisonOperator: awscloudwatch.ComparisonOperator_GREATER_THAN_THRESHOLD,
				EvaluationPeriods:  jsii.Number(3),
				DatapointsToAlarm:  jsii.Number(3),
				TreatMissingData:   awscloudwatch.TreatMissingData_BREACHING,
			})
		},
		metrics.ArchivedTotal: func(d metrics.Definition) awscloudwatch.Alarm {
			// 1 in a window where the backlog grew and nothing was archived;
			// two such windows in a row page. FILL: a window without any
			// sweep report counts as nothing archived. A window is at least
			// one sweep interval: a sweep reports once a run, and two
			// windows shorter than the interval never both hold a report,
			// so the alarm could never fire.
			window := minutes(max(15, p.SweepInterval.Minutes()))
			wedged := awscloudwatch.NewMathExpression(&awscloudwatch.MathExpressionProps{
				Expression: jsii.String("IF(DIFF(backlog) > 0 AND FILL(archived, 0) == 0, 1, 0)"),
				UsingMetrics: &map[string]awscloudwatch.IMetric{
					"backlog":  metric(metrics.ExpiredBacklog, "Maximum", window),
					"archived": metric(d.Name, "Sum", window),
				},
				Label:  jsii.String("sweeper wedged (backlog grows, nothing archived)"),
				Period: window,
			})
			return alarm("sweeper-wedged", wedged, m.Page, &awscloudwatch.CreateAlarmOptions{
				AlarmDescription:   describe(d, "the sweeper runs but moves nothing: look for lock timeouts or a missing partition in its logs."),
				Threshold:          jsii.Number(1),
				ComparisonOperator: awscloudwatch.ComparisonOperator_GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
				EvaluationPeriods:  jsii.Number(2),
			})
		},
		metrics.ArchiveNewestPartitionDays: func(d metrics.Definition) awscloudwatch.Alarm {
			return alarm("partition-lead", metric(d.Name, "Minimum", day), m.Page, &awscloudwatch.CreateAlarmOptions{
				AlarmDescription: describe(d, "invoke the partitions function (or archivectl partitions) and read its error."),
				Threshold:        jsii.Number(PartitionDaysThreshold),
				// One report a day: a daily window may hold none while the
				// run's time drifts, so a missing day keeps the state. The
				// partitions-not-running alarm below catches a manager
				// that stopped.
				TreatMissingData:   awscloudwatch.TreatMissingData_IGNORE,
				ComparisonOperator: awscloudwatch.ComparisonOperator_LESS_THAN_THRESHOLD,
				EvaluationPeriods:  jsii.Number(1),
			})
		},
		metrics.ExpiredReplayTotal: func(d metrics.Definition) awscloudwatch.Alarm {
			return alarm("expired-replay", metric(d.Name, "Sum", minutes(5)), m.Notify, &awscloudwatch.CreateAlarmOptions{
				AlarmDescription:   describe(d, "nothing is broken: find the client in the services' logs and tell it its retries outlive the window."),
				Threshold:          jsii.Number(0),
				ComparisonOperator: awscloudwatch.ComparisonOperator_GREATER_THAN_THRESHOLD,
				EvaluationPeriods:  jsii.Number(1),
			})
		},
		metrics.ArchiveLookupDurationMs: func(d metrics.Definition) awscloudwatch.Alarm {
			return alarm("lookup-p99", metric(d.Name, "p99", minutes(5)), m.Page, &awscloudwatch.CreateAlarmOptions{
				// Three windows in a row: one cold start's connection setup
				// is not a regression.
				AlarmDescription:   describe(d, "EXPLAIN the lookup (archivectl lookup) for a scan of every partition; check the proxy's and the database's CPU."),
				Threshold:          jsii.Number(LookupP99ThresholdMs),
				ComparisonOperator: awscloudwatch.ComparisonOperator_GREATER_THAN_THRESHOLD,
				EvaluationPeriods:  jsii.Number(3),
				DatapointsToAlarm:  jsii.Number(3),
			})
		},
		metrics.ArchiveBytes: func(d metrics.Definition) awscloudwatch.Alarm {
			perRow := awscloudwatch.NewMathExpression(&awscloudwatch.MathExpressionProps{
				Expression: jsii.String(fmt.Sprintf("IF(rows >= %d, bytes / rows, 0)", BytesPerRowMinRows)),
				UsingMetrics: &map[string]awscloudwatch.IMetric{
					"bytes": metric(d.Name, "Maximum", day),
					"rows":  metric(metrics.ArchiveRows, "Maximum", day),
				},
				Label:  jsii.String("archive bytes per row"),
				Period: day,
			})
			return alarm("bytes-per-row", perRow, m.Notify, &awscloudwatch.CreateAlarmOptions{
				AlarmDescription:   describe(d, "compare the archive's columns with the schema (archivectl verify); a payload column must never be there."),
				Threshold:          jsii.Number(BytesPerRowFactor * p.ArchiveBytesPerRowBaseline),
				ComparisonOperator: awscloudwatch.ComparisonOperator_GREATER_THAN_THRESHOLD,
				EvaluationPeriods:  jsii.Number(1),
			})
		},
	}
	for _, def := range metrics.Checklist {
		build, ok := checklist[def.Name]
		if !ok {
			return nil, fmt.Errorf("checklist metric %s has no alarm", def.Name)
		}
		m.Checklist[def.Name] = build(def)
	}

	// The functions themselves.
	fnList := []struct {
		name string
		fn   awslambda.Function
	}{{"sweep", fns.Sweep}, {"partitions", fns.Partitions}, {"lookup", fns.Lookup}, {"migrate", fns.Migrate}}
	for _, f := range fnList {
		topic := m.Page
		if f.name == "migrate" {
			// A refused migration answers FAILED to CloudFormation and
			// fails its deploy without failing the invocation; this
			// counts the crashes and timeouts that answer nothing.
			topic = m.Notify
		}
		alarm(f.name+"-errors", f.fn.MetricErrors(&awscloudwatch.MetricOptions{Period: minutes(5), Statistic: jsii.String("Sum")}), topic,
			&awscloudwatch.CreateAlarmOptions{
				AlarmDescription:   jsii.String(fmt.Sprintf("The %s function failed. What to do: read its log group for the error.", f.name)),
				Threshold:          jsii.Number(1),
				ComparisonOperator: awscloudwatch.ComparisonOperator_GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
				EvaluationPeriods:  jsii.Number(1),
			})
		throttled := m.Notify
		if f.name == "lookup" {
			// A throttled lookup counts in no Errors and no API 5xx, and
			// the payment waiting on it is refused: it pages.
			throttled = m.Page
		}
		alarm(f.name+"-throttles", f.fn.MetricThrottles(&awscloudwatch.MetricOptions{Period: minutes(5), Statistic: jsii.String("Sum")}), throttled,
			&awscloudwatch.CreateAlarmOptions{
				AlarmDescription:   jsii.String(fmt.Sprintf("The %s function was throttled. What to do: check the account's concurrency and its reservations.", f.name)),
				Threshold:          jsii.Number(1),
				ComparisonOperator: awscloudwatch.ComparisonOperator_GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
				EvaluationPeriods:  jsii.Number(1),
			})
	}
	// Scheduled functions that stopped running (a disabled rule, a broken
	// target) invoke nothing and so fail nothing: watch their invocations.
	for _, n := range []struct {
		name    string
		fn      awslambda.Function
		period  awscdk.Duration
		periods float64
	}{
		{"sweep", fns.Sweep, awscdk.Duration_Minutes(jsii.Number(max(15, 3*p.SweepInterval.Minutes()))), 1},
		{"partitions", fns.Partitions, day, 2},
	} {
		alarm(n.name+"-not-running", n.fn.MetricInvocations(&awscloudwatch.MetricOptions{Period: n.period, Statistic: jsii.String("Sum")}), m.Page,
			&awscloudwatch.CreateAlarmOptions{
				AlarmDescription: jsii.String(fmt.Sprintf("The %s function was not invoked on schedule. "+
					"What to do: check that its EventBridge rule is enabled and targets the function, and the failed-invocations queue.", n.name)),
				Threshold:          jsii.Number(1),
				ComparisonOperator: awscloudwatch.ComparisonOperator_LESS_THAN_THRESHOLD,
				EvaluationPeriods:  jsii.Number(n.periods),
				DatapointsToAlarm:  jsii.Number(n.periods),
				TreatMissingData:   awscloudwatch.TreatMissingData_BREACHING,
			})
	}

	// Lookups that fail answer a 5xx problem rather than failing the
	// invocation, so Errors does not count them: the API's 5xx and the
	// lookup function's own "lookup answered" lines with a 5xx status (direct
	// invocations by the middleware included) do.
	lookup5xx := awslogs.NewMetricFilter(c, jsii.String("LookupServerErrors"), &awslogs.MetricFilterProps{
		LogGroup:        fns.Lookup.LogGroup(),
		FilterPattern:   awslogs.FilterPattern_Literal(jsii.String(`{ $.msg = "lookup answered" && $.status >= 500 }`)),
		MetricNamespace: jsii.String(p.MetricsNamespace),
		MetricName:      jsii.String(LookupServerErrorsMetric),
		MetricValue:     jsii.String("1"),
		DefaultValue:    jsii.Number(0),
	})
	alarm("lookup-5xx", lookup5xx.Metric(&awscloudwatch.MetricOptions{Period: minutes(5), Statistic: jsii.String("Sum")}), m.Page,
		&awscloudwatch.CreateAlarmOptions{
			AlarmDescription: jsii.String("Lookups answered 5xx (database or proxy unreachable, timeouts): the middleware is failing closed (503) for fresh keys. " +
				"What to do: read the lookup function's \"lookup answered unavailable\", \"lookup answered timeout\" and \"lookup failed\" lines; check the proxy's and the database's health."),
			Threshold:          jsii.Number(5),
			ComparisonOperator: awscloudwatch.ComparisonOperator_GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
			EvaluationPeriods:  jsii.Number(1),
		})
	alarm("api-5xx", api.HTTPAPI.MetricServerError(&awscloudwatch.MetricOptions{Period: minutes(5), Statistic: jsii.String("Sum")}), m.Page,
		&awscloudwatch.CreateAlarmOptions{
			AlarmDescription:   jsii.String("The lookup HTTP API answered 5xx. What to do: read the API's access log and the lookup function's log group."),
			Threshold:          jsii.Number(5),
			ComparisonOperator: awscloudwatch.ComparisonOperator_GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
			EvaluationPeriods:  jsii.Number(1),
		})

	// Closed months still uncompacted for a week: a rebuild that never fits
	// the partitions run. A notification, not a page: lookups are as fast,
	// only storage is larger. After an upgrade of an archive with many months
	// it drains by PARTITION_COMPACT_PER_RUN a day.
	alarm("uncompacted-partitions", metric(metrics.ArchiveUncompactedPartitions, "Minimum", day), m.Notify,
		&awscloudwatch.CreateAlarmOptions{
			AlarmDescription: jsii.String("Closed months have waited a week for compaction of their primary key (see compact_pending in the partitions run's log). " +
				"What to do: if an upgrade left many months, raise PartitionCompactPerRun (PARTITION_COMPACT_PER_RUN) or wait; if one month's rebuild times out, rebuild it by hand (README, Partition manager)."),
			Threshold:          jsii.Number(0),
			ComparisonOperator: awscloudwatch.ComparisonOperator_GREATER_THAN_THRESHOLD,
			EvaluationPeriods:  jsii.Number(7),
			DatapointsToAlarm:  jsii.Number(7),
			TreatMissingData:   awscloudwatch.TreatMissingData_IGNORE,
		})

	// A sweep the backlog keeps busy stops starting batches once less than
	// its deadline margin is left, so it lasts about its timeout less the
	// margin (205 s of 240 s by default): the alarm is judged against that
	// window, or a run that used all of it would stay under the threshold.
	fs, err := p.functionSettings()
	if err != nil {
		return nil, fmt.Errorf("function configuration: %w", err)
	}
	windowMs := float64((p.sweepTimeout() - fs.Sweep.WithDefaults().DeadlineMargin).Milliseconds())
	alarm("sweep-duration", fns.Sweep.MetricDuration(&awscloudwatch.MetricOptions{Period: minutes(15), Statistic: jsii.String("Maximum")}), m.Notify,
		&awscloudwatch.CreateAlarmOptions{
			AlarmDescription: jsii.String("A sweep ran until close to its deadline margin, where it stops starting batches: the backlog outgrows what one run moves. " +
				"What to do: raise SweepBatchSize or lower SweepPause or SweepPauseRatio, or look for slow batches (lock waits, batch_timeouts) in its logs."),
			Threshold:          jsii.Number(DurationNearTimeout * windowMs),
			ComparisonOperator: awscloudwatch.ComparisonOperator_GREATER_THAN_THRESHOLD,
			EvaluationPeriods:  jsii.Number(1),
		})
	// Every failure that reaches the queue pages, however many are still
	// unread: an alarm on the queue's depth stayed in ALARM from the first
	// unpurged message on and never paged for the next failure. Lambda's
	// on-failure destination and EventBridge's dead-letter queue both
	// SendMessage, which NumberOfMessagesSent counts.
	alarm("failed-invocations", fns.Failures.MetricNumberOfMessagesSent(&awscloudwatch.MetricOptions{Period: minutes(5), Statistic: jsii.String("Sum")}), m.Page,
		&awscloudwatch.CreateAlarmOptions{
			AlarmDescription: jsii.String("A scheduled sweep, partitions or migrate run failed after its retries, or its event was never delivered. " +
				"What to do: read the messages in the failed-invocations queue (each names the function and the error), fix, then purge them."),
			Threshold:          jsii.Number(1),
			ComparisonOperator: awscloudwatch.ComparisonOperator_GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
			EvaluationPeriods:  jsii.Number(1),
		})
	// The queue keeps a message 14 days: one unread for a week is a failure
	// nobody looked at, about to be lost.
	alarm("failed-invocations-unread", fns.Failures.MetricApproximateAgeOfOldestMessage(&awscloudwatch.MetricOptions{Period: minutes(60), Statistic: jsii.String("Maximum")}), m.Notify,
		&awscloudwatch.CreateAlarmOptions{
			AlarmDescription: jsii.String("A message has waited a week in the failed-invocations queue, which drops messages after 14 days. " +
				"What to do: read it (it names the function and the error), fix, then purge the queue."),
			Threshold:          jsii.Number(FailedInvocationUnreadSeconds),
			ComparisonOperator: awscloudwatch.ComparisonOperator_GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
			EvaluationPeriods:  jsii.Number(1),
		})

	if fns.LookupLive != nil {
		// Lookups past the provisioned instances run on new ones, cold:
		// the wait the provisioned concurrency was bought to spare the
		// payment path.
		alarm("lookup-spillover", fns.LookupLive.Metric(jsii.String("ProvisionedConcurrencySpilloverInvocations"),
			&awscloudwatch.MetricOptions{Period: minutes(5), Statistic: jsii.String("Sum")}), m.Notify,
			&awscloudwatch.CreateAlarmOptions{
				AlarmDescription: jsii.String("Lookups ran past the provisioned instances of the lookup's alias, with cold starts. " +
					"What to do: raise LookupProvisionedConcurrency (and LookupReservedConcurrency, which must stay above it)."),
				Threshold:          jsii.Number(1),
				ComparisonOperator: awscloudwatch.ComparisonOperator_GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
				EvaluationPeriods:  jsii.Number(1),
			})
	}

	databaseAlarms(db, alarm, m)

	m.Dashboard = newDashboard(c, fns, p, metric)
	return m, nil
}

// Database thresholds.
const (
	// FreeStorageBytesThreshold pages when the RDS instance has less free
	// storage. Storage autoscaling grows it once free space is under 10%
	// for 5 minutes, at least 6 hours apart (and after the last storage
	// optimization ended), up to 1000 GB: under 1 GiB
	// means it could not keep up or reached its maximum.
	FreeStorageBytesThreshold = 1 << 30
	// DatabaseBusyPercent: CPU (instance) or ACU (Aurora, of its maximum)
	// utilization above this for 15 minutes notifies.
	DatabaseBusyPercent = 80
	// TransactionIDsNotify and TransactionIDsPage bound the age of the
	// oldest unfrozen transaction ID (MaximumUsedTransactionIDs).
	// PostgreSQL stops taking writes at about 2.1 billion; AWS advises
	// acting at 1 billion. An archive's closed partitions are never
	// updated, but each must still be frozen by an anti-wraparound vacuum,
	// and a long transaction or a forgotten replication slot blocks it.
	TransactionIDsNotify = 1_000_000_000
	TransactionIDsPage   = 1_500_000_000
	// FailedInvocationUnreadSeconds is a week.
	FailedInvocationUnreadSeconds = 7 * 24 * 3600
)

type alarmFunc func(id string, subject awscloudwatch.IMetric, topic awssns.ITopic, o *awscloudwatch.CreateAlarmOptions) awscloudwatch.Alarm

// databaseAlarms watches the writer instance: the storage every write
// needs, its CPU or capacity, and transaction ID wraparound.
func databaseAlarms(db *Database, alarm alarmFunc, m *Monitoring) {
	five := awscdk.Duration_Minutes(jsii.Number(5))
	if !db.aurora {
		alarm("db-free-storage", db.Metric("FreeStorageSpace", "Minimum", five), m.Page, &awscloudwatch.CreateAlarmOptions{
			AlarmDescription: jsii.String("The database instance has under 1 GiB of free storage, and storage autoscaling (up to 1000 GB, at least 6 hours apart and after the last storage optimization) has not grown it. " +
				"With none left every write stops: the sweep's, and the services' live store where it shares the database. " +
				"What to do: modify the instance's allocated storage (or its maximum); look for bloat (the live table's dead rows, a stuck replication slot's WAL)."),
			Threshold:          jsii.Number(FreeStorageBytesThreshold),
			ComparisonOperator: awscloudwatch.ComparisonOperator_LESS_THAN_THRESHOLD,
			EvaluationPeriods:  jsii.Number(2),
			DatapointsToAlarm:  jsii.Number(2),
		})
	}
	busy, what := "CPUUtilization", "CPU"
	if db.aurora {
		busy, what = "ACUUtilization", "capacity (of AuroraMaxCapacity)"
	}
	alarm("db-busy", db.Metric(busy, "Average", five), m.Notify, &awscloudwatch.CreateAlarmOptions{
		AlarmDescription: jsii.String(fmt.Sprintf("The database's %s has been over %d%% for 15 minutes: lookups on the payment path slow down with it. "+
			"What to do: check the sweep's pace (SweepPause, SweepPauseRatio, SweepBatchSize: a higher ratio makes it yield more) and the heaviest queries (pg_stat_statements, or Performance Insights once enabled on the database: the stack does not enable it); move to a larger instance class or raise AuroraMaxCapacity.", what, DatabaseBusyPercent)),
		Threshold:          jsii.Number(DatabaseBusyPercent),
		ComparisonOperator: awscloudwatch.ComparisonOperator_GREATER_THAN_THRESHOLD,
		EvaluationPeriods:  jsii.Number(3),
		DatapointsToAlarm:  jsii.Number(3),
	})
	for _, x := range []struct {
		id        string
		threshold float64
		topic     awssns.ITopic
	}{{"db-xid-age", TransactionIDsNotify, m.Notify}, {"db-xid-wraparound", TransactionIDsPage, m.Page}} {
		alarm(x.id, db.Metric("MaximumUsedTransactionIDs", "Maximum", awscdk.Duration_Minutes(jsii.Number(15))), x.topic, &awscloudwatch.CreateAlarmOptions{
			AlarmDescription: jsii.String(fmt.Sprintf("The oldest unfrozen transaction ID is over %.1f billion transactions old; at about 2.1 billion PostgreSQL stops taking writes. "+
				"What to do: find what holds vacuum back (a long transaction in pg_stat_activity, a prepared transaction, an unused replication slot) and end it; "+
				"then check that autovacuum's anti-wraparound runs finish (pg_stat_progress_vacuum) on the archive's partitions.", x.threshold/1e9)),
			Threshold:          jsii.Number(x.threshold),
			ComparisonOperator: awscloudwatch.ComparisonOperator_GREATER_THAN_THRESHOLD,
			EvaluationPeriods:  jsii.Number(1),
		})
	}
}

func newDashboard(c constructs.Construct, fns *Functions, p Props, metric func(string, string, awscdk.Duration) awscloudwatch.Metric) awscloudwatch.Dashboard {
	five := awscdk.Duration_Minutes(jsii.Number(5))
	graph := func(title string, left ...awscloudwatch.IMetric) awscloudwatch.IWidget {
		return awscloudwatch.NewGraphWidget(&awscloudwatch.GraphWidgetProps{Title: jsii.String(title), Left: &left, Width: jsii.Number(8), Height: jsii.Number(6)})
	}
	stat := map[string]string{
		metrics.ExpiredBacklog: "Maximum", metrics.ArchivedTotal: "Sum", metrics.ArchiveNewestPartitionDays: "Minimum",
		metrics.ExpiredReplayTotal: "Sum", metrics.ArchiveLookupDurationMs: "p99", metrics.ArchiveBytes: "Maximum",
	}
	var checklist []awscloudwatch.IWidget
	for _, def := range metrics.Checklist {
		s := stat[def.Name]
		if s == "" {
			s = "Average"
		}
		checklist = append(checklist, graph(fmt.Sprintf("%s (%s)", def.Name, strings.ToLower(s)), metric(def.Name, s, five)))
	}
	fnMetric := func(get func(*awscloudwatch.MetricOptions) awscloudwatch.Metric, name, s string) awscloudwatch.IMetric {
		return get(&awscloudwatch.MetricOptions{Period: five, Statistic: jsii.String(s), Label: jsii.String(name)})
	}
	errors := graph("function errors",
		fnMetric(fns.Sweep.MetricErrors, "sweep", "Sum"), fnMetric(fns.Partitions.MetricErrors, "partitions", "Sum"),
		fnMetric(fns.Lookup.MetricErrors, "lookup", "Sum"), fnMetric(fns.Migrate.MetricErrors, "migrate", "Sum"))
	durations := graph("function duration (max)",
		fnMetric(fns.Sweep.MetricDuration, "sweep", "Maximum"), fnMetric(fns.Partitions.MetricDuration, "partitions", "Maximum"),
		fnMetric(fns.Lookup.MetricDuration, "lookup", "Maximum"))
	lookupLatency := graph("lookup function duration (p99)", fnMetric(fns.Lookup.MetricDuration, "lookup", "p99"))
	return awscloudwatch.NewDashboard(c, jsii.String("Dashboard"), &awscloudwatch.DashboardProps{
		DashboardName: jsii.String(*awscdk.Stack_Of(c).StackName()),
		Widgets: &[]*[]awscloudwatch.IWidget{
			&checklist,
			{errors, durations, lookupLatency},
		},
	})
}

// titledID turns "expired-backlog" into "ExpiredBacklog" for construct ids.
func titledID(s string) string {
	var b strings.Builder
	for _, part := range strings.Split(s, "-") {
		b.WriteString(titled(part))
	}
	return b.String()
}
