package stack

import (
	"testing"

	"github.com/aws/aws-cdk-go/awscdk/v2"
	"github.com/aws/jsii-runtime-go"
	"github.com/stretchr/testify/require"
)

// stack.New refuses a setting the chosen deployment would not use, as the
// context does (propsFromContext): an instance class with Aurora, or an
// Aurora capacity without it, would otherwise deploy without a word as if
// honoured. It judges the values given, not the defaults withDefaults fills
// in whatever the deployment.
func TestSettingsTheDeploymentDoesNotUseAreRefused(t *testing.T) {
	code := placeholderCode(t)
	for name, tc := range map[string]struct {
		mutate func(*Props)
		want   string
	}{
		"InstanceType with Aurora":         {func(p *Props) { p.Aurora, p.InstanceType = true, "r7g.2xlarge" }, `InstanceType "r7g.2xlarge" is not used with Aurora`},
		"MultiAZ with Aurora":              {func(p *Props) { p.Aurora, p.MultiAZ = true, true }, "MultiAZ is not used with Aurora"},
		"AuroraMinCapacity without Aurora": {func(p *Props) { p.AuroraMinCapacity = 2 }, "AuroraMinCapacity 2 is used only with Aurora"},
		"AuroraMaxCapacity without Aurora": {func(p *Props) { p.AuroraMaxCapacity = 64 }, "AuroraMaxCapacity 64 is used only with Aurora"},
	} {
		t.Run(name, func(t *testing.T) {
			// GIVEN props that set what the deployment does not use
			p := Props{CodeDir: code}
			tc.mutate(&p)
			// WHEN the stack is built
			_, err := New(awscdk.NewApp(&awscdk.AppProps{Outdir: jsii.String(t.TempDir())}), "Test", p)
			// THEN it is refused, naming the setting
			require.ErrorContains(t, err, tc.want)
		})
	}
	// AND each setting is accepted with the deployment that uses it
	for _, p := range []Props{
		{CodeDir: code, InstanceType: "r7g.2xlarge", MultiAZ: true},
		{CodeDir: code, Aurora: true, AuroraMinCapacity: 2, AuroraMaxCapacity: 64},
	} {
		require.NoError(t, p.validate(), "%+v", p)
	}
}

// AlarmEmail is one address: SNS refuses an e-mail subscription whose
// endpoint is anything else ("Invalid parameter: Email address") at deploy,
// rolling the deploy back. Several recipients (what an operator paging two
// people tries) belong on a topic of their own, set as AlarmTopicArn.
func TestAlarmEmailIsOneAddress(t *testing.T) {
	code := placeholderCode(t)
	for _, email := range []string{
		"oncall", "@", "@example.com", "oncall@", "oncall@@example.com", "oncall@example@com",
		"oncall@example.com,second@example.com", "oncall@example.com;second@example.com", "oncall@example.com second@example.com",
		"On Call <oncall@example.com>", "on call@example.com", "oncall@example.com\n", "oncall\x00@example.com",
		"oncall@.example.com", "oncall@example..com", "oncall@example.com.",
	} {
		p := Props{CodeDir: code, AlarmEmail: email}
		_, err := New(awscdk.NewApp(&awscdk.AppProps{Outdir: jsii.String(t.TempDir())}), "Test", p)
		require.ErrorContains(t, err, "AlarmEmail (context alarmEmail) must be one e-mail address", "%q", email)
		require.ErrorContains(t, err, "set AlarmTopicArn (context alarmTopicArn)", "%q", email)
	}
	// AND an address is accepted, however unusual its parts
	for _, email := range []string{"oncall@example.com", "on-call+archive@payments.example.co.uk", "oncall@localhost", "bereitschaft@bücher.example"} {
		p := Props{CodeDir: code, AlarmEmail: email}
		require.NoError(t, p.validate(), "%q", email)
	}
}
