package stack

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// The database every write needs is watched: free storage on an RDS
// instance (Aurora's grows by itself), CPU or ACU use, and transaction ID
// age (wraparound stops all writes), each on the writer instance.
func TestDatabaseAlarms(t *testing.T) {
	const page, notify = "arn:aws:sns:eu-west-1:111111111111:page", "arn:aws:sns:eu-west-1:111111111111:notify"
	for _, aurora := range []bool{false, true} {
		// GIVEN the stack on an RDS instance, then on Aurora
		b := setup(t, func(p *Props) { p.Aurora = aurora; p.AlarmTopicArn = page; p.NotifyTopicArn = notify })
		writer := b.writerRef(t, aurora)
		check := func(name, metric, statistic string, threshold float64, comparison, topic string) {
			t.Helper()
			a := alarmNamed(t, b, "Test-"+name)
			require.Equal(t, "AWS/RDS", a.Properties["Namespace"], name)
			require.Equal(t, metric, a.Properties["MetricName"], name)
			require.Equal(t, statistic, a.Properties["Statistic"], name)
			require.EqualValues(t, threshold, a.Properties["Threshold"], name)
			require.Equal(t, comparison, a.Properties["ComparisonOperator"], name)
			require.Equal(t, []any{topic}, a.Properties["AlarmActions"], name)
			require.Equal(t, []any{map[string]any{"Name": "DBInstanceIdentifier", "Value": writer}}, a.Properties["Dimensions"], name)
		}
		// THEN transaction ID age notifies at 1 billion and pages at 1.5
		check("db-xid-age", "MaximumUsedTransactionIDs", "Maximum", 1e9, "GreaterThanThreshold", notify)
		check("db-xid-wraparound", "MaximumUsedTransactionIDs", "Maximum", 1.5e9, "GreaterThanThreshold", page)
		if aurora {
			// AND Aurora's capacity use notifies, and no storage alarm
			// (its volume grows by itself)
			check("db-busy", "ACUUtilization", "Average", 80, "GreaterThanThreshold", notify)
			for _, a := range b.ofType("AWS::CloudWatch::Alarm") {
				require.NotEqual(t, "Test-db-free-storage", a.Properties["AlarmName"])
			}
			continue
		}
		// AND the instance's CPU notifies, and free storage under 1 GiB
		// for 10 minutes pages
		check("db-busy", "CPUUtilization", "Average", 80, "GreaterThanThreshold", notify)
		check("db-free-storage", "FreeStorageSpace", "Minimum", 1<<30, "LessThanThreshold", page)
		require.EqualValues(t, 2, alarmNamed(t, b, "Test-db-free-storage").Properties["EvaluationPeriods"])
	}
}

// writerRef is the template's reference to the writer DB instance.
func (b bundle) writerRef(t *testing.T, aurora bool) any {
	t.Helper()
	var ids []string
	for id := range b.ofType("AWS::RDS::DBInstance") {
		ids = append(ids, id)
	}
	require.Len(t, ids, 1, "one DB instance (aurora=%v)", aurora)
	return map[string]any{"Ref": ids[0]}
}
