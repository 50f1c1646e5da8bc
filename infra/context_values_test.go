package main

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemarchive/idemarchive/infra/stack"
)

func placeholderZips(t *testing.T) string {
	t.Helper()
	code := t.TempDir()
	for _, fn := range stack.FunctionNames {
		require.NoError(t, os.WriteFile(filepath.Join(code, fn+".zip"), []byte(fn), 0o644))
	}
	return code
}

// A value set is honoured or refused, never replaced by the default or
// deployed as something else: an empty string (-c instanceType=), a string
// with blanks around it (which the functions would read trimmed and the
// alarms would not), a list where one value goes, a key spelt in another
// case style, a stack name or topic ARN the CDK would panic on, and values
// the template cannot hold. Each is an error line naming the setting.
func TestEveryContextValueSetIsHonouredOrRefused(t *testing.T) {
	code := placeholderZips(t)
	for _, tc := range []struct {
		context map[string]any
		want    string
	}{
		{map[string]any{"instanceType": ""}, "context instanceType: is set to an empty value: unset it for the default, or give it one"},
		{map[string]any{"metricsNamespace": ""}, "context metricsNamespace: is set to an empty value"},
		{map[string]any{"sweepResourceIdPath": ""}, "context sweepResourceIdPath: is set to an empty value"},
		{map[string]any{"metricsNamespace": " Payments "}, `context metricsNamespace: " Payments " has blanks around it`},
		{map[string]any{"alarmEmail": []any{"a@example.com", "b@example.com"}}, "context alarmEmail: must be a string, a number or a boolean, got []interface {}"},
		{map[string]any{"sweepBatchSize": float64(1000000)}, "1000000"},
		{map[string]any{"sweep_interval": "10m"}, "context sweep_interval: no such setting: did you mean sweepInterval?"},
		{map[string]any{"sweep-interval": "10m"}, "context sweep-interval: no such setting: did you mean sweepInterval?"},
		{map[string]any{"stackName": "bad name!"}, `context stackName: "bad name!" is no CloudFormation stack name`},
		{map[string]any{"stackName": "Prod_Archive"}, "is no CloudFormation stack name"},
		{map[string]any{"alarmTopicArn": "not-an-arn"}, `AlarmTopicArn must be an SNS topic's ARN, arn:<partition>:sns:<region>:<account>:<name>, got "not-an-arn"`},
		{map[string]any{"notifyTopicArn": "arn:aws:sqs:eu-west-1:123456789012:q"}, "NotifyTopicArn must be an SNS topic's ARN"},
		{map[string]any{"archiveBytesPerRowBaseline": "1e308"}, "ArchiveBytesPerRowBaseline must be at most 100000 bytes"},
		{map[string]any{"instanceType": "db.t4g.small"}, `InstanceType must be an instance class without its db. prefix, such as t4g.small or r7g.large, got "db.t4g.small"`},
		{map[string]any{"metricsNamespace": "Payments:prod"}, `MetricsNamespace "Payments:prod" holds a ':'`},
		{map[string]any{"metricsNamespace": "Pay ments"}, "MetricsNamespace: CloudWatch namespace"},
		// A setting the chosen deployment does not use is refused, not
		// deployed as if honoured.
		{map[string]any{"aurora": true, "multiAz": true}, "context multiAz: is not used with aurora=true"},
		{map[string]any{"aurora": true, "instanceType": "r7g.large"}, "context instanceType: is not used with aurora=true"},
		{map[string]any{"auroraMaxCapacity": float64(64)}, "context auroraMaxCapacity: is used only with aurora=true"},
		{map[string]any{"aurora": "false", "auroraMinCapacity": float64(1)}, "context auroraMinCapacity: is used only with aurora=true"},
		{map[string]any{"alarmTopicArn": "arn:aws:sns:eu-west-1:123456789012:page", "alarmEmail": "oncall@example.com"}, "context alarmEmail: is not subscribed with alarmTopicArn set"},
	} {
		ctx := map[string]any{"codeDir": code}
		for k, v := range tc.context {
			ctx[k] = v
		}
		err := run(t.TempDir(), ctx)
		require.ErrorContains(t, err, tc.want, "%v", tc.context)
		require.NotContains(t, err.Error(), "goroutine", "%v", tc.context)
	}
	// Well-formed values of the same settings synthesize.
	require.NoError(t, run(t.TempDir(), map[string]any{
		"codeDir": code, "stackName": "Archive-Prod", "instanceType": "r7g.2xlarge", "metricsNamespace": "Payments/Archive",
		"alarmTopicArn": "arn:aws:sns:eu-west-1:123456789012:page", "notifyTopicArn": "arn:aws-cn:sns:cn-north-1:123456789012:notify.fifo",
		"archiveBytesPerRowBaseline": float64(300), "sweepBatchSize": float64(20000),
	}))
	require.NoError(t, run(t.TempDir(), map[string]any{
		"codeDir": code, "aurora": true, "multiAz": false, "auroraMinCapacity": float64(1), "auroraMaxCapacity": float64(8), "alarmEmail": "oncall@example.com",
	}))
}

// An alarmEmail that is no address, or several in one (what an operator
// paging two people tries), is refused at synth naming the setting and the
// way to page several people: SNS would refuse the subscription at deploy,
// rolling the deploy back.
func TestAnAlarmEmailThatIsNotOneAddressIsRefused(t *testing.T) {
	code := placeholderZips(t)
	for _, email := range []string{"oncall", "@", "oncall@example.com,second@example.com", "oncall@example.com second@example.com", "On Call <oncall@example.com>"} {
		err := run(t.TempDir(), map[string]any{"codeDir": code, "alarmEmail": email})
		require.ErrorContains(t, err, "(context alarmEmail) must be one e-mail address", "%q", email)
		require.ErrorContains(t, err, "alarmTopicArn", "%q", email)
	}
}
