package stack

import (
	"fmt"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/aws/aws-cdk-go/awscdk/v2"
	"github.com/aws/aws-cdk-go/awscdk/v2/assertions"
	"github.com/aws/aws-cdk-go/awscdk/v2/cxapi"
	"github.com/aws/jsii-runtime-go"
	"github.com/cdklabs/cdk-nag-go/cdknag/v2"
	"github.com/stretchr/testify/require"
)

// findings runs cdk-nag's AwsSolutions and Serverless packs on a stack built
// with props and returns every unsuppressed finding, errors and warnings.
func findings(t *testing.T, mutate func(*Props)) []string {
	t.Helper()
	p := Props{CodeDir: placeholderCode(t), AlarmEmail: "oncall@example.com"}
	if mutate != nil {
		mutate(&p)
	}
	app := awscdk.NewApp(&awscdk.AppProps{Outdir: jsii.String(t.TempDir())})
	s, err := New(app, "Nag", p)
	require.NoError(t, err)
	awscdk.Aspects_Of(app).Add(cdknag.NewAwsSolutionsChecks(&cdknag.NagPackProps{Verbose: jsii.Bool(true)}), nil)
	awscdk.Aspects_Of(app).Add(cdknag.NewServerlessChecks(&cdknag.NagPackProps{Verbose: jsii.Bool(true)}), nil)
	annotations := assertions.Annotations_FromStack(s.Stack)
	var out []string
	for _, list := range [][]*cxapi.SynthesisMessage{
		*annotations.FindError(jsii.String("*"), assertions.Match_AnyValue()),
		*annotations.FindWarning(jsii.String("*"), assertions.Match_AnyValue()),
	} {
		for _, m := range list {
			out = append(out, fmt.Sprintf("%s: %v", *m.Id, m.Entry.Data))
		}
	}
	sort.Strings(out)
	return out
}

// A stack whose alarms reach nobody says so at synth.
func TestAlarmsThatReachNobodyAreAWarning(t *testing.T) {
	warning := "/Nag/Monitoring/Alarms: no alarmEmail or alarmTopicArn: the alarm topic has no subscriber, so no alarm reaches anyone until you subscribe to it [ack: idemarchive:alarmsUnrouted]"
	require.Contains(t, findings(t, func(p *Props) { p.AlarmEmail = "" }), warning)
	require.NotContains(t, findings(t, nil), warning)
	require.NotContains(t, findings(t, func(p *Props) { p.AlarmEmail, p.AlarmTopicArn = "", "arn:aws:sns:eu-west-1:123456789012:pager" }), warning)
}

func TestNagPacksFindNothingUnsuppressed(t *testing.T) {
	for name, mutate := range map[string]func(*Props){
		"rds instance": nil,
		"aurora":       func(p *Props) { p.Aurora = true },
		"localstack": func(p *Props) {
			p.RotateMasterSecret, p.DeletionProtection, p.AlarmEmail = ptr(false), ptr(false), ""
		},
		"existing topic": func(p *Props) { p.AlarmTopicArn, p.AlarmEmail = "arn:aws:sns:eu-west-1:123456789012:pager", "" },
	} {
		t.Run(name, func(t *testing.T) {
			// GIVEN the stack, WHEN the AwsSolutions and Serverless packs
			// run, THEN every finding is fixed or suppressed with a reason
			// (the stack's own warning that alarms reach nobody is not
			// cdk-nag's: TestAlarmsThatReachNobodyAreAWarning)
			got := slices.DeleteFunc(findings(t, mutate), func(f string) bool { return strings.Contains(f, "[ack: idemarchive:alarmsUnrouted]") })
			require.Empty(t, got, "unsuppressed cdk-nag findings:\n%s", strings.Join(got, "\n"))
		})
	}
}
