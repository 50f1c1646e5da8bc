package stack

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// The middleware's Lambda archive client invokes the lookup function
// directly on every fresh key and fails closed (503) when it cannot get an
// answer. A throttled direct invocation is neither an Errors datapoint nor a
// "lookup answered" 5xx line, and never reaches the HTTP API's 5xx metric:
// the only alarm that sees it, lookup-throttles, pages.
func TestLookupThrottlesPage(t *testing.T) {
	pageArn := "arn:aws:sns:eu-west-1:123456789012:pager"
	notifyArn := "arn:aws:sns:eu-west-1:123456789012:team-channel"
	b := setup(t, func(p *Props) { p.AlarmTopicArn, p.NotifyTopicArn = pageArn, notifyArn })
	a := alarmNamed(t, b, "Test-lookup-throttles")
	require.Equal(t, []any{pageArn}, a.Properties["AlarmActions"],
		"a throttled lookup is a payment refused: it must page, not notify")
}
