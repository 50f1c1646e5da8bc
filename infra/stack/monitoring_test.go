package stack

import (
	"fmt"
	"strings"
	"testing"

	"github.com/aws/aws-cdk-go/awscdk/v2/assertions"
	"github.com/aws/jsii-runtime-go"
	"github.com/stretchr/testify/require"

	"github.com/idemarchive/idemarchive/shared/metrics"
)

// metricNames lists the namespace/name of every metric an alarm reads,
// whether it alarms on one metric or on metric math.
func metricNames(alarm resource) []string {
	var out []string
	if name, ok := alarm.Properties["MetricName"].(string); ok {
		out = append(out, fmt.Sprint(alarm.Properties["Namespace"])+"/"+name)
	}
	list, _ := alarm.Properties["Metrics"].([]any)
	for _, q := range list {
		stat, _ := q.(map[string]any)["MetricStat"].(map[string]any)
		if stat == nil {
			continue
		}
		m := stat["Metric"].(map[string]any)
		out = append(out, fmt.Sprint(m["Namespace"])+"/"+fmt.Sprint(m["MetricName"]))
	}
	return out
}

// expression returns the metric math expression of an alarm, or "".
func expression(alarm resource) string {
	list, _ := alarm.Properties["Metrics"].([]any)
	for _, q := range list {
		if e, ok := q.(map[string]any)["Expression"].(string); ok {
			return e
		}
	}
	return ""
}

func TestEveryChecklistMetricHasAnAlarmOnTheCodesNames(t *testing.T) {
	// GIVEN the stack with the default namespace
	b := setup(t, nil)
	alarms := b.ofType("AWS::CloudWatch::Alarm")
	// THEN each metric of the code's checklist is read by at least one
	// alarm, under the code's default namespace
	for _, def := range metrics.Checklist {
		want := metrics.DefaultNamespace + "/" + def.Name
		found := false
		for _, a := range alarms {
			for _, n := range metricNames(a) {
				found = found || n == want
			}
		}
		require.True(t, found, "no alarm reads %s", want)
	}
	require.Len(t, b.stack.Monitoring.Checklist, len(metrics.Checklist))

	// WHEN the namespace is changed
	b = setup(t, func(p *Props) { p.MetricsNamespace = "Payments/Idem" })
	// THEN the alarms and the functions follow it
	for _, a := range b.ofType("AWS::CloudWatch::Alarm") {
		for _, n := range metricNames(a) {
			if strings.Contains(n, "idempotency_") {
				require.True(t, strings.HasPrefix(n, "Payments/Idem/"), n)
			}
		}
	}
	require.Equal(t, "Payments/Idem", b.env(b.functionID(t, "sweep"))["METRICS_NAMESPACE"])
}

func TestChecklistThresholds(t *testing.T) {
	// GIVEN the stack
	b := setup(t, nil)
	page := assertions.NewCapture(nil)
	// THEN the backlog alarm pages above 100,000, and when no sweep has
	// reported for three intervals
	b.template.HasResourceProperties(jsii.String("AWS::CloudWatch::Alarm"), map[string]any{
		"MetricName":         metrics.ExpiredBacklog,
		"Namespace":          metrics.DefaultNamespace,
		"Statistic":          "Maximum",
		"Threshold":          100000,
		"ComparisonOperator": "GreaterThanThreshold",
		"EvaluationPeriods":  3,
		"TreatMissingData":   "breaching",
		"AlarmActions":       []any{page},
	})
	// AND the partition lead pages below 30 days; a day without its one
	// report keeps the state (the run's time drifts within the day)
	b.template.HasResourceProperties(jsii.String("AWS::CloudWatch::Alarm"), map[string]any{
		"MetricName":         metrics.ArchiveNewestPartitionDays,
		"Statistic":          "Minimum",
		"Period":             86400,
		"Threshold":          30,
		"ComparisonOperator": "LessThanThreshold",
		"TreatMissingData":   "ignore",
		"AlarmActions":       []any{page.AsObject()},
	})
	// AND scheduled functions that stop being invoked page: a disabled
	// rule fails nothing
	for fn, period := range map[string]int{"sweep": 900, "partitions": 86400} {
		b.template.HasResourceProperties(jsii.String("AWS::CloudWatch::Alarm"), map[string]any{
			"AlarmName":          "Test-" + fn + "-not-running",
			"Namespace":          "AWS/Lambda",
			"MetricName":         "Invocations",
			"Period":             period,
			"Threshold":          1,
			"ComparisonOperator": "LessThanThreshold",
			"TreatMissingData":   "breaching",
			"AlarmActions":       []any{page.AsObject()},
		})
	}
	// AND lookups answered 5xx page, from the API and from the function's
	// own log lines (direct invocations answer 5xx without failing)
	b.template.HasResourceProperties(jsii.String("AWS::Logs::MetricFilter"), map[string]any{
		"FilterPattern": `{ $.msg = "lookup answered" && $.status >= 500 }`,
		"MetricTransformations": []any{map[string]any{
			"MetricName": LookupServerErrorsMetric, "MetricNamespace": metrics.DefaultNamespace, "MetricValue": "1", "DefaultValue": 0,
		}},
	})
	for _, name := range []string{"Test-lookup-5xx", "Test-api-5xx"} {
		b.template.HasResourceProperties(jsii.String("AWS::CloudWatch::Alarm"), map[string]any{
			"AlarmName": name, "Threshold": 5, "AlarmActions": []any{page.AsObject()},
		})
	}
	// AND closed months left uncompacted for a week notify
	b.template.HasResourceProperties(jsii.String("AWS::CloudWatch::Alarm"), map[string]any{
		"AlarmName":          "Test-uncompacted-partitions",
		"MetricName":         metrics.ArchiveUncompactedPartitions,
		"Namespace":          metrics.DefaultNamespace,
		"Statistic":          "Minimum",
		"Period":             86400,
		"Threshold":          0,
		"ComparisonOperator": "GreaterThanThreshold",
		"EvaluationPeriods":  7,
		"DatapointsToAlarm":  7,
		"TreatMissingData":   "ignore",
	})
	// AND any expired replay notifies
	b.template.HasResourceProperties(jsii.String("AWS::CloudWatch::Alarm"), map[string]any{
		"MetricName":         metrics.ExpiredReplayTotal,
		"Statistic":          "Sum",
		"Threshold":          0,
		"ComparisonOperator": "GreaterThanThreshold",
	})
	// AND lookup p99 above 5 ms, three windows running
	b.template.HasResourceProperties(jsii.String("AWS::CloudWatch::Alarm"), map[string]any{
		"MetricName":         metrics.ArchiveLookupDurationMs,
		"ExtendedStatistic":  "p99",
		"Threshold":          5,
		"ComparisonOperator": "GreaterThanThreshold",
		"EvaluationPeriods":  3,
		"DatapointsToAlarm":  3,
	})

	byMetric := map[string]resource{}
	for _, a := range b.ofType("AWS::CloudWatch::Alarm") {
		if e := expression(a); e != "" {
			for _, n := range metricNames(a) {
				byMetric[n] = a
			}
		}
	}
	// AND "archived flat while the backlog grows" is metric math over both
	wedged := byMetric[metrics.DefaultNamespace+"/"+metrics.ArchivedTotal]
	require.Equal(t, "IF(DIFF(backlog) > 0 AND FILL(archived, 0) == 0, 1, 0)", expression(wedged))
	require.ElementsMatch(t, []string{metrics.DefaultNamespace + "/" + metrics.ExpiredBacklog, metrics.DefaultNamespace + "/" + metrics.ArchivedTotal}, metricNames(wedged))
	require.EqualValues(t, 1, wedged.Properties["Threshold"])
	require.EqualValues(t, 2, wedged.Properties["EvaluationPeriods"])
	// AND bytes per row is metric math over bytes and rows, at twice the
	// baseline, once there are enough rows to mean something
	perRow := byMetric[metrics.DefaultNamespace+"/"+metrics.ArchiveBytes]
	require.Equal(t, "IF(rows >= 100000, bytes / rows, 0)", expression(perRow))
	require.Contains(t, metricNames(perRow), metrics.DefaultNamespace+"/"+metrics.ArchiveRows)
	require.EqualValues(t, 540, perRow.Properties["Threshold"])

	// WHEN the operator measured another baseline
	b = setup(t, func(p *Props) { p.ArchiveBytesPerRowBaseline = 200 })
	// THEN the threshold follows
	found := false
	for _, a := range b.ofType("AWS::CloudWatch::Alarm") {
		if strings.HasPrefix(expression(a), "IF(rows") {
			require.EqualValues(t, 400, a.Properties["Threshold"])
			found = true
		}
	}
	require.True(t, found)
}

func TestFunctionAlarms(t *testing.T) {
	// GIVEN the stack
	b := setup(t, nil)
	for _, name := range FunctionNames {
		fn := map[string]any{"Name": "FunctionName", "Value": map[string]any{"Ref": b.functionID(t, name)}}
		// THEN each function has an errors and a throttles alarm
		for _, metric := range []string{"Errors", "Throttles"} {
			b.template.HasResourceProperties(jsii.String("AWS::CloudWatch::Alarm"), map[string]any{
				"Namespace":          "AWS/Lambda",
				"MetricName":         metric,
				"Dimensions":         []any{fn},
				"Statistic":          "Sum",
				"Threshold":          1,
				"ComparisonOperator": "GreaterThanOrEqualToThreshold",
			})
		}
	}
	// AND the sweep's duration alarms at 90% of the 205 s it may start
	// batches in: its 240 s timeout less the 35 s deadline margin
	b.template.HasResourceProperties(jsii.String("AWS::CloudWatch::Alarm"), map[string]any{
		"Namespace":  "AWS/Lambda",
		"MetricName": "Duration",
		"Dimensions": []any{map[string]any{"Name": "FunctionName", "Value": map[string]any{"Ref": b.functionID(t, "sweep")}}},
		"Statistic":  "Maximum",
		"Threshold":  184500,
	})
	// AND every message sent to the failure queue pages, however many
	// wait unread (an alarm on the queue's depth paged for the first only)
	b.template.HasResourceProperties(jsii.String("AWS::CloudWatch::Alarm"), map[string]any{
		"Namespace":          "AWS/SQS",
		"MetricName":         "NumberOfMessagesSent",
		"Statistic":          "Sum",
		"Threshold":          1,
		"ComparisonOperator": "GreaterThanOrEqualToThreshold",
	})
	// AND a message left unread for a week of its 14 days notifies
	b.template.HasResourceProperties(jsii.String("AWS::CloudWatch::Alarm"), map[string]any{
		"Namespace":  "AWS/SQS",
		"MetricName": "ApproximateAgeOfOldestMessage",
		"Threshold":  7 * 24 * 3600,
	})
}

func TestAlarmTopics(t *testing.T) {
	// GIVEN an alarm email
	b := setup(t, func(p *Props) { p.AlarmEmail = "oncall@example.com" })
	// THEN the stack's topic has it subscribed, and every alarm acts on
	// that topic
	b.template.ResourceCountIs(jsii.String("AWS::SNS::Topic"), jsii.Number(1))
	b.template.HasResourceProperties(jsii.String("AWS::SNS::Subscription"), map[string]any{
		"Protocol": "email", "Endpoint": "oncall@example.com",
	})
	var topicID string
	for id := range b.ofType("AWS::SNS::Topic") {
		topicID = id
	}
	for id, a := range b.ofType("AWS::CloudWatch::Alarm") {
		require.Equal(t, []any{map[string]any{"Ref": topicID}}, a.Properties["AlarmActions"], id)
	}
	// AND its policy (EnforceSSL's, which replaces SNS's default one) lets
	// this account's CloudWatch alarms publish: without an Allow for the
	// service, every alarm action fails and no alarm reaches anyone
	b.template.HasResourceProperties(jsii.String("AWS::SNS::TopicPolicy"), map[string]any{
		"Topics": []any{map[string]any{"Ref": topicID}},
		"PolicyDocument": map[string]any{"Statement": assertions.Match_ArrayWith(&[]any{map[string]any{
			"Sid": "CloudWatchAlarmsPublish", "Effect": "Allow", "Action": "sns:Publish",
			"Principal": map[string]any{"Service": "cloudwatch.amazonaws.com"},
			"Resource":  map[string]any{"Ref": topicID},
			"Condition": map[string]any{
				"StringEquals": map[string]any{"aws:SourceAccount": map[string]any{"Ref": "AWS::AccountId"}},
				"ArnLike":      assertions.Match_ObjectLike(&map[string]any{"aws:SourceArn": assertions.Match_AnyValue()}),
			},
		}})},
	})
	// AND the SSL rule stays
	b.template.HasResourceProperties(jsii.String("AWS::SNS::TopicPolicy"), map[string]any{
		"PolicyDocument": map[string]any{"Statement": assertions.Match_ArrayWith(&[]any{assertions.Match_ObjectLike(&map[string]any{
			"Effect": "Deny", "Condition": map[string]any{"Bool": map[string]any{"aws:SecureTransport": "false"}},
		})})},
	})

	// WHEN existing topics are given for pages and notices
	pageArn := "arn:aws:sns:eu-west-1:123456789012:pager"
	notifyArn := "arn:aws:sns:eu-west-1:123456789012:team-channel"
	b = setup(t, func(p *Props) { p.AlarmTopicArn, p.NotifyTopicArn = pageArn, notifyArn })
	// THEN no topic is created, pages go to one and notices to the other
	b.template.ResourceCountIs(jsii.String("AWS::SNS::Topic"), jsii.Number(0))
	b.template.HasResourceProperties(jsii.String("AWS::CloudWatch::Alarm"), map[string]any{
		"MetricName": metrics.ArchiveNewestPartitionDays, "AlarmActions": []any{pageArn},
	})
	b.template.HasResourceProperties(jsii.String("AWS::CloudWatch::Alarm"), map[string]any{
		"MetricName": metrics.ExpiredReplayTotal, "AlarmActions": []any{notifyArn},
	})
	b.template.HasResourceProperties(jsii.String("AWS::CloudWatch::Alarm"), map[string]any{
		"MetricName": metrics.ArchiveUncompactedPartitions, "AlarmActions": []any{notifyArn},
	})
}

func TestDashboardShowsTheChecklistAndTheFunctions(t *testing.T) {
	// GIVEN the stack
	b := setup(t, nil)
	body := assertions.NewCapture(nil)
	b.template.HasResourceProperties(jsii.String("AWS::CloudWatch::Dashboard"), map[string]any{"DashboardBody": body})
	text := flatten(*body.AsObject())
	// THEN every checklist metric has a graph, with the functions' errors
	// and durations
	for _, def := range metrics.Checklist {
		require.Contains(t, text, fmt.Sprintf(`["%s","%s",{"stat":`, metrics.DefaultNamespace, def.Name))
	}
	require.Contains(t, text, `function errors`)
	require.Contains(t, text, `function duration`)
	require.Contains(t, text, `["AWS/Lambda","Errors"`)
	require.Contains(t, text, `["AWS/Lambda","Duration"`)
}
