package stack

import (
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-cdk-go/awscdk/v2"
	"github.com/aws/aws-cdk-go/awscdk/v2/assertions"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsiam"
	"github.com/aws/jsii-runtime-go"
	"github.com/stretchr/testify/require"

	"github.com/idemarchive/idemarchive/shared/settings"
)

func TestFunctionsRunTheZipsOnArm64WithTracingAndJSONLogs(t *testing.T) {
	// GIVEN the stack with default props
	b := setup(t, nil)

	// THEN there are exactly the four functions of this repository (no
	// helper function the CDK adds runs our runtime) ...
	b.template.ResourcePropertiesCountIs(jsii.String("AWS::Lambda::Function"), map[string]any{"Runtime": "provided.al2023"}, jsii.Number(4))
	for _, name := range FunctionNames {
		id := b.functionID(t, name)
		// ... each on provided.al2023, arm64, traced, logging JSON into its
		// own log group with a retention
		b.template.HasResourceProperties(jsii.String("AWS::Lambda::Function"), map[string]any{
			"Description":   b.json.Resources[id].Properties["Description"],
			"Runtime":       "provided.al2023",
			"Handler":       "bootstrap",
			"Architectures": []any{"arm64"},
			"TracingConfig": map[string]any{"Mode": "Active"},
			"LoggingConfig": map[string]any{"LogFormat": "JSON", "LogGroup": assertions.Match_AnyValue()},
			"VpcConfig":     assertions.Match_ObjectLike(&map[string]any{"SubnetIds": assertions.Match_AnyValue()}),
		})
		group := b.json.Resources[id].Properties["LoggingConfig"].(map[string]any)["LogGroup"].(map[string]any)["Ref"].(string)
		require.EqualValues(t, 90, b.json.Resources[group].Properties["RetentionInDays"], "%s logs retention", name)
	}
}

func TestEveryFunctionConnectsThroughTheProxyAsItsOwnUser(t *testing.T) {
	// GIVEN the stack
	b := setup(t, nil)
	users := map[string]string{"sweep": SweeperUser, "partitions": OwnerUser, "lookup": ReaderUser, "migrate": MasterUser}
	for name, user := range users {
		id := b.functionID(t, name)
		env := b.env(id)
		// THEN its DATABASE_URL names its user at the proxy endpoint, with
		// verify-full, IAM authentication and the exec mode for the proxy
		url := flatten(env["DATABASE_URL"])
		require.Regexp(t, `^postgres://`+user+`@\{"Fn::GetAtt":\["DatabaseProxy[0-9A-F]+","Endpoint"\]\}:5432/idemarchive\?sslmode=verify-full$`, url, name)
		require.Equal(t, "true", env["DATABASE_IAM_AUTH"], name)
		require.Equal(t, "exec", env["DATABASE_EXEC_MODE"], name)

		// AND its role may connect as that user only, on the proxy (the
		// migration as the partitions function's user too: the deploy's
		// migrations and partition run sign in as it, never as the master user)
		want := []string{user}
		if name == "migrate" {
			want = append(want, OwnerUser)
		}
		var connects []string
		for _, s := range b.statements(b.roleOf(t, id)) {
			if slices.Contains(actions(s), "rds-db:connect") {
				connects = append(connects, flatten(s["Resource"]))
			}
		}
		require.Len(t, connects, len(want), name)
		for i, c := range connects {
			require.Contains(t, c, ":dbuser:")
			require.Contains(t, c, "DBProxyArn", "%s connects to the proxy, not to the database directly", name)
			require.True(t, strings.HasSuffix(c, "/"+want[i]), "%s: %s", name, c)
		}
	}
}

func TestFunctionEnvironmentUsesOnlyVariablesTheCodeReads(t *testing.T) {
	// GIVEN the stack and the variables shared/settings reads
	b := setup(t, nil)
	known := map[string]bool{}
	for _, v := range settings.Variables {
		known[v.Name] = true
	}
	// THEN no function sets a variable the code does not read (a typo
	// would silently leave the default in force)
	for _, name := range FunctionNames {
		for k := range b.env(b.functionID(t, name)) {
			require.True(t, known[k], "%s sets %s, which shared/settings does not read", name, k)
		}
	}
}

func TestNoFunctionRoleHasAWildcardAction(t *testing.T) {
	// GIVEN the stack
	b := setup(t, nil)
	for _, name := range FunctionNames {
		role := b.roleOf(t, b.functionID(t, name))
		stmts := b.statements(role)
		require.NotEmpty(t, stmts, name)
		for _, s := range stmts {
			// THEN every action names one API call
			for _, a := range actions(s) {
				require.NotContains(t, a, "*", "%s: action %s", name, a)
			}
			// AND "*" resources appear only for the APIs without
			// resource-level permissions (X-Ray, ENI management)
			if s["Resource"] == "*" {
				for _, a := range actions(s) {
					require.True(t, strings.HasPrefix(a, "xray:") || strings.HasPrefix(a, "ec2:"), "%s: %s on *", name, a)
				}
			}
		}
		// AND no managed policy is attached (FullAccess or otherwise)
		require.Nil(t, b.json.Resources[role].Properties["ManagedPolicyArns"], name)
	}
}

func TestDatabaseIsEncryptedPostgresWithGeneratedSecretBehindIAMAndTLSProxy(t *testing.T) {
	// GIVEN the stack with default props
	b := setup(t, nil)

	// THEN one PostgreSQL 17 instance, encrypted, IAM auth on, protected
	b.template.ResourceCountIs(jsii.String("AWS::RDS::DBInstance"), jsii.Number(1))
	b.template.HasResourceProperties(jsii.String("AWS::RDS::DBInstance"), map[string]any{
		"Engine":                          "postgres",
		"EngineVersion":                   "17",
		"DBInstanceClass":                 "db.t4g.small",
		"StorageEncrypted":                true,
		"EnableIAMDatabaseAuthentication": true,
		"DeletionProtection":              true,
	})
	// AND its master password is generated into Secrets Manager and rotated
	b.template.HasResourceProperties(jsii.String("AWS::SecretsManager::Secret"), map[string]any{
		"GenerateSecretString": assertions.Match_ObjectLike(&map[string]any{
			"SecretStringTemplate": fmt.Sprintf(`{"username":"%s"}`, MasterUser),
			"GenerateStringKey":    "password",
		}),
	})
	b.template.HasResourceProperties(jsii.String("AWS::SecretsManager::RotationSchedule"), map[string]any{
		"RotationRules": map[string]any{"ScheduleExpression": "rate(30 days)"},
	})
	// AND the proxy requires TLS and IAM from every client, and signs in to
	// the database with IAM for the functions' users
	b.template.HasResourceProperties(jsii.String("AWS::RDS::DBProxy"), map[string]any{
		"EngineFamily":      "POSTGRESQL",
		"RequireTLS":        true,
		"DefaultAuthScheme": "IAM_AUTH",
		"Auth":              []any{assertions.Match_ObjectLike(&map[string]any{"IAMAuth": "REQUIRED", "AuthScheme": "SECRETS"})},
	})
	var proxyRole string
	for _, r := range b.ofType("AWS::RDS::DBProxy") {
		proxyRole = r.Properties["RoleArn"].(map[string]any)["Fn::GetAtt"].([]any)[0].(string)
	}
	var users []string
	for _, s := range b.statements(proxyRole) {
		if slices.Contains(actions(s), "rds-db:connect") {
			res := flatten(s["Resource"])
			require.Contains(t, res, "DbiResourceId", "end-to-end IAM names the database's users")
			users = append(users, res[strings.LastIndex(res, "/")+1:])
		}
	}
	slices.Sort(users)
	require.Equal(t, []string{WriterUser, OwnerUser, ReaderUser, SweeperUser}, users)
}

func TestNetworkIsIsolatedWithTheEndpointsInUse(t *testing.T) {
	// GIVEN the stack
	b := setup(t, nil)
	// THEN no NAT gateway, no internet gateway, no public subnet
	b.template.ResourceCountIs(jsii.String("AWS::EC2::NatGateway"), jsii.Number(0))
	b.template.ResourceCountIs(jsii.String("AWS::EC2::InternetGateway"), jsii.Number(0))
	b.template.ResourcePropertiesCountIs(jsii.String("AWS::EC2::Subnet"), map[string]any{"MapPublicIpOnLaunch": true}, jsii.Number(0))
	// AND an S3 gateway endpoint (custom resource answers) and a Secrets
	// Manager interface endpoint (rotation), and nothing else
	b.template.ResourceCountIs(jsii.String("AWS::EC2::VPCEndpoint"), jsii.Number(2))
	b.template.HasResourceProperties(jsii.String("AWS::EC2::VPCEndpoint"), map[string]any{
		"VpcEndpointType": "Gateway",
		"ServiceName":     assertions.Match_ObjectLike(&map[string]any{"Fn::Join": assertions.Match_ArrayWith(&[]any{assertions.Match_ArrayWith(&[]any{".s3"})})}),
	})
	b.template.HasResourceProperties(jsii.String("AWS::EC2::VPCEndpoint"), map[string]any{
		"VpcEndpointType":   "Interface",
		"ServiceName":       assertions.Match_ObjectLike(&map[string]any{"Fn::Join": assertions.Match_ArrayWith(&[]any{assertions.Match_ArrayWith(&[]any{".secretsmanager"})})}),
		"PrivateDnsEnabled": true,
	})

	// AND only the rotation function may reach the Secrets Manager endpoint
	var endpointSG string
	for id, r := range b.ofType("AWS::EC2::SecurityGroup") {
		if strings.Contains(fmt.Sprint(r.Properties["GroupDescription"]), "SecretsManager") {
			endpointSG = id
		}
	}
	require.NotEmpty(t, endpointSG)
	b.template.HasResourceProperties(jsii.String("AWS::EC2::SecurityGroupIngress"), map[string]any{
		"GroupId":               getAtt(endpointSG, "GroupId"),
		"FromPort":              443,
		"SourceSecurityGroupId": getAtt(b.rotationSG(t), "GroupId"),
	})
	b.template.ResourcePropertiesCountIs(jsii.String("AWS::EC2::SecurityGroupIngress"), map[string]any{"GroupId": getAtt(endpointSG, "GroupId")}, jsii.Number(1))

	// WHEN rotation is off (LocalStack)
	b = setup(t, func(p *Props) { p.RotateMasterSecret = ptr(false) })
	// THEN nothing needs Secrets Manager from the VPC
	b.template.ResourceCountIs(jsii.String("AWS::EC2::VPCEndpoint"), jsii.Number(1))
	b.template.ResourceCountIs(jsii.String("AWS::SecretsManager::RotationSchedule"), jsii.Number(0))
}

func TestAuroraServerlessV2Option(t *testing.T) {
	// GIVEN Aurora selected, with its capacity range
	b := setup(t, func(p *Props) { p.Aurora, p.AuroraMinCapacity, p.AuroraMaxCapacity = true, 1, 8 })

	// THEN an encrypted Aurora PostgreSQL cluster with a serverless writer
	b.template.HasResourceProperties(jsii.String("AWS::RDS::DBCluster"), map[string]any{
		"Engine":                           "aurora-postgresql",
		"StorageEncrypted":                 true,
		"EnableIAMDatabaseAuthentication":  true,
		"ServerlessV2ScalingConfiguration": map[string]any{"MinCapacity": 1, "MaxCapacity": 8},
		"DeletionProtection":               true,
		"EnableCloudwatchLogsExports":      []any{"postgresql"},
		"DatabaseName":                     DatabaseName,
		"EngineVersion":                    assertions.Match_StringLikeRegexp(jsii.String(`^1[6-9]\.`)),
		"BackupRetentionPeriod":            7,
	})
	b.template.ResourcePropertiesCountIs(jsii.String("AWS::RDS::DBInstance"), map[string]any{"DBInstanceClass": "db.serverless"}, jsii.Number(1))
	b.template.ResourcePropertiesCountIs(jsii.String("AWS::RDS::DBInstance"), map[string]any{"Engine": "postgres"}, jsii.Number(0))
	// AND the proxy targets the cluster, with end-to-end IAM on its users
	b.template.HasResourceProperties(jsii.String("AWS::RDS::DBProxyTargetGroup"), map[string]any{
		"DBClusterIdentifiers": []any{assertions.Match_AnyValue()},
	})
	b.template.HasResourceProperties(jsii.String("AWS::RDS::DBProxy"), map[string]any{"DefaultAuthScheme": "IAM_AUTH", "RequireTLS": true})
}

func TestDeletionProtectionCanBeTurnedOff(t *testing.T) {
	// GIVEN a throwaway stack
	b := setup(t, func(p *Props) { p.DeletionProtection = ptr(false) })
	// THEN the instance is not protected, and still snapshotted when the
	// stack is deleted or a deploy replaces it
	b.template.HasResourceProperties(jsii.String("AWS::RDS::DBInstance"), map[string]any{"DeletionProtection": false})
	b.template.HasResource(jsii.String("AWS::RDS::DBInstance"), map[string]any{"DeletionPolicy": "Snapshot", "UpdateReplacePolicy": "Snapshot"})
	// AND so is a protected one, and an Aurora cluster
	b = setup(t, nil)
	b.template.HasResource(jsii.String("AWS::RDS::DBInstance"), map[string]any{"DeletionPolicy": "Snapshot", "UpdateReplacePolicy": "Snapshot"})
	b = setup(t, func(p *Props) { p.Aurora, p.DeletionProtection = true, ptr(false) })
	b.template.HasResource(jsii.String("AWS::RDS::DBCluster"), map[string]any{"DeletionPolicy": "Snapshot", "UpdateReplacePolicy": "Snapshot"})
}

func TestSchedulesFitTheSweepTimeout(t *testing.T) {
	for _, tc := range []struct {
		interval time.Duration
		rate     string
		timeout  int
	}{
		{0, "rate(5 minutes)", 240}, // the default
		{10 * time.Minute, "rate(10 minutes)", 540},
		{30 * time.Minute, "rate(30 minutes)", 900}, // Lambda's limit
	} {
		t.Run(tc.rate, func(t *testing.T) {
			// GIVEN a sweep interval
			b := setup(t, func(p *Props) { p.SweepInterval = tc.interval })
			sweep := b.functionID(t, "sweep")
			// THEN a rule fires the sweeper at that rate, and whatever it
			// cannot deliver goes to the failure queue
			b.template.HasResourceProperties(jsii.String("AWS::Events::Rule"), map[string]any{
				"ScheduleExpression": tc.rate,
				"State":              "ENABLED",
				"Targets": []any{assertions.Match_ObjectLike(&map[string]any{
					"Arn":              getAtt(sweep, "Arn"),
					"DeadLetterConfig": map[string]any{"Arn": assertions.Match_AnyValue()},
				})},
			})
			// AND a run times out before the next one starts
			timeout := b.json.Resources[sweep].Properties["Timeout"].(float64)
			require.EqualValues(t, tc.timeout, timeout)
			require.Less(t, timeout, max(tc.interval, 5*time.Minute).Seconds())
		})
	}
	// AND the partition manager runs daily
	b := setup(t, nil)
	b.template.HasResourceProperties(jsii.String("AWS::Events::Rule"), map[string]any{
		"ScheduleExpression": "cron(17 3 * * ? *)",
		"Targets":            []any{assertions.Match_ObjectLike(&map[string]any{"Arn": getAtt(b.functionID(t, "partitions"), "Arn")})},
	})
	b.template.ResourceCountIs(jsii.String("AWS::Events::Rule"), jsii.Number(2))
}

func TestFailedScheduledInvocationsGoToTheFailureQueue(t *testing.T) {
	// GIVEN the stack
	b := setup(t, nil)
	queue := assertions.NewCapture(nil)
	// THEN the sweeper, invoked asynchronously, is not retried (the next
	// run is) and sends its failures to a queue ...
	b.template.HasResourceProperties(jsii.String("AWS::Lambda::EventInvokeConfig"), map[string]any{
		"FunctionName":         map[string]any{"Ref": b.functionID(t, "sweep")},
		"MaximumRetryAttempts": 0,
		"DestinationConfig":    map[string]any{"OnFailure": map[string]any{"Destination": queue}},
		// an event not started within an interval is superseded by the
		// next run, never run late beside it
		"MaximumEventAgeInSeconds": 300,
	})
	b.template.HasResourceProperties(jsii.String("AWS::Events::Rule"), map[string]any{
		"ScheduleExpression": "rate(5 minutes)",
		"Targets": []any{assertions.Match_ObjectLike(&map[string]any{
			"RetryPolicy": map[string]any{"MaximumRetryAttempts": 2, "MaximumEventAgeInSeconds": 300},
		})},
	})
	// ... the partitions function retries twice, to the same queue
	b.template.HasResourceProperties(jsii.String("AWS::Lambda::EventInvokeConfig"), map[string]any{
		"FunctionName":         map[string]any{"Ref": b.functionID(t, "partitions")},
		"MaximumRetryAttempts": 2,
		"DestinationConfig":    map[string]any{"OnFailure": map[string]any{"Destination": queue.AsObject()}},
	})
	// AND an encrypted queue it is
	id := queue.AsObject()
	queueID := (*id)["Fn::GetAtt"].([]any)[0].(string)
	require.Equal(t, "AWS::SQS::Queue", b.json.Resources[queueID].Type)
	require.Equal(t, true, b.json.Resources[queueID].Properties["SqsManagedSseEnabled"])
}

func TestAPIAuthorizesEveryRouteWithIAM(t *testing.T) {
	// GIVEN the stack
	b := setup(t, nil)
	// THEN one route per lookup API path, each GET and each AWS_IAM
	b.template.ResourceCountIs(jsii.String("AWS::ApiGatewayV2::Route"), jsii.Number(len(Routes)))
	for _, path := range Routes {
		b.template.HasResourceProperties(jsii.String("AWS::ApiGatewayV2::Route"), map[string]any{
			"RouteKey":          "GET " + path,
			"AuthorizationType": "AWS_IAM",
		})
	}
	for id, r := range b.ofType("AWS::ApiGatewayV2::Route") {
		require.Equal(t, "AWS_IAM", r.Properties["AuthorizationType"], id)
	}
	// AND the integration is the lookup function with payload format 2.0
	b.template.HasResourceProperties(jsii.String("AWS::ApiGatewayV2::Integration"), map[string]any{
		"IntegrationType":      "AWS_PROXY",
		"PayloadFormatVersion": "2.0",
		"IntegrationUri":       getAtt(b.functionID(t, "lookup"), "Arn"),
	})
	// AND the stage throttles and writes JSON access logs naming the caller
	format := assertions.NewCapture(assertions.Match_StringLikeRegexp(jsii.String(`identity\.userArn`)))
	b.template.HasResourceProperties(jsii.String("AWS::ApiGatewayV2::Stage"), map[string]any{
		"StageName":            "$default",
		"DefaultRouteSettings": map[string]any{"ThrottlingRateLimit": 200, "ThrottlingBurstLimit": 400},
		"AccessLogSettings":    map[string]any{"DestinationArn": assertions.Match_AnyValue(), "Format": format},
	})
	require.Contains(t, *format.AsString(), `"requestId":"$context.requestId"`)
}

func TestGrantLookupInvoke(t *testing.T) {
	// GIVEN a service's role in the stack
	// WHEN it is granted the lookup function
	b := setupWith(t, nil, func(s *Stack) {
		role := awsiam.NewRole(s.Stack, jsii.String("ServiceRole"), &awsiam.RoleProps{
			AssumedBy: awsiam.NewServicePrincipal(jsii.String("ecs-tasks.amazonaws.com"), nil),
		})
		s.GrantLookupInvoke(role)
	})
	// THEN its policy allows lambda:InvokeFunction on that function only
	b.template.HasResourceProperties(jsii.String("AWS::IAM::Policy"), map[string]any{
		"PolicyDocument": map[string]any{"Statement": []any{map[string]any{
			"Action":   "lambda:InvokeFunction",
			"Effect":   "Allow",
			"Resource": assertions.Match_ArrayWith(&[]any{getAtt(b.functionID(t, "lookup"), "Arn")}),
		}}, "Version": "2012-10-17"},
	})
}

func TestMigrationCustomResource(t *testing.T) {
	// GIVEN the stack
	b := setup(t, nil)
	// THEN one schema resource, served by the migrate function, naming the
	// three users to create and the package digest that re-runs it
	b.template.ResourceCountIs(jsii.String(SchemaResourceType), jsii.Number(1))
	digest := assertions.NewCapture(assertions.Match_StringLikeRegexp(jsii.String(`^[0-9a-f]{64}$`)))
	b.template.HasResource(jsii.String(SchemaResourceType), map[string]any{
		"Properties": map[string]any{
			"ServiceToken":    getAtt(b.functionID(t, "migrate"), "Arn"),
			"SweeperUser":     SweeperUser,
			"ReaderUser":      ReaderUser,
			"OwnerUser":       OwnerUser,
			"PackageSha256":   digest,
			"LeadMonths":      "3",
			"RetentionMonths": "0",
			"DatabaseId":      getAtt(b.onlyID(t, "AWS::RDS::DBInstance"), "DbiResourceId"),
		},
		"DeletionPolicy": "Retain",
		// It waits for the proxy's target (and the database) to exist.
		"DependsOn": assertions.Match_ArrayWith(&[]any{assertions.Match_StringLikeRegexp(jsii.String("^DatabaseProxyProxyTargetGroup"))}),
	})
	first := *digest.AsString()

	// WHEN the migrate package changes (a new migration shipped)
	changed := setup(t, func(p *Props) {
		require.NoError(t, os.WriteFile(filepath.Join(p.CodeDir, "migrate.zip"), []byte("migrate with 004"), 0o644))
	})
	// THEN the property changes, so CloudFormation sends an Update and the
	// new migration runs
	again := assertions.NewCapture(nil)
	changed.template.HasResourceProperties(jsii.String(SchemaResourceType), map[string]any{"PackageSha256": again})
	require.NotEqual(t, first, *again.AsString())

	// WHEN the database is replaced by another (aurora switched on)
	aurora := setup(t, func(p *Props) { p.Aurora = true })
	// THEN the property names the new one, so the same deploy migrates it
	aurora.template.HasResourceProperties(jsii.String(SchemaResourceType), map[string]any{
		"DatabaseId": getAtt(aurora.onlyID(t, "AWS::RDS::DBCluster"), "DBClusterResourceId"),
	})
}

// onlyID returns the logical id of the one resource of a type.
func (b bundle) onlyID(t *testing.T, typ string) string {
	t.Helper()
	var ids []string
	for id := range b.ofType(typ) {
		ids = append(ids, id)
	}
	require.Len(t, ids, 1, "one %s", typ)
	return ids[0]
}

func TestPropsAreValidatedAtSynth(t *testing.T) {
	code := placeholderCode(t)
	for name, tc := range map[string]struct {
		props Props
		want  string
	}{
		"missing package":        {Props{CodeDir: t.TempDir()}, "sweep.zip is missing (run make build)"},
		"no code dir":            {Props{}, "CodeDir is required"},
		"interval too short":     {Props{CodeDir: code, SweepInterval: time.Minute}, "whole minutes from 2 to 60"},
		"interval not whole":     {Props{CodeDir: code, SweepInterval: 150 * time.Second}, "whole minutes from 2 to 60"},
		"batch the code refuses": {Props{CodeDir: code, SweepBatchSize: 60000}, "SWEEP_BATCH_SIZE: sweep batch size must be between 1 and 50000"},
		"lead too short":         {Props{CodeDir: code, PartitionLeadMonths: 1}, "lead must be at least 2 months"},
		"odd retention":          {Props{CodeDir: code, LogRetentionDays: 45}, "LogRetentionDays 45"},
		"aurora range":           {Props{CodeDir: code, Aurora: true, AuroraMinCapacity: 8, AuroraMaxCapacity: 2}, "above AuroraMaxCapacity"},
		"aurora below 0.5":       {Props{CodeDir: code, Aurora: true, AuroraMinCapacity: 0.25}, "AuroraMinCapacity must be at least 0.5 ACU"},
		"NaN baseline":           {Props{CodeDir: code, ArchiveBytesPerRowBaseline: math.NaN()}, "ArchiveBytesPerRowBaseline must be a positive finite number"},
		"infinite rate":          {Props{CodeDir: code, APIRateLimit: math.Inf(1)}, "APIRateLimit must be a positive finite number"},
		"negative burst":         {Props{CodeDir: code, APIBurstLimit: -1}, "APIBurstLimit must be a positive finite number"},
		"fractional burst":       {Props{CodeDir: code, APIBurstLimit: 0.5}, "APIBurstLimit must be a whole number of requests"},
		"aurora above 256":       {Props{CodeDir: code, Aurora: true, AuroraMaxCapacity: 1000}, "AuroraMaxCapacity must be a multiple of 0.5 ACU, at most 256, got 1000"},
		"aurora off the steps":   {Props{CodeDir: code, Aurora: true, AuroraMinCapacity: 0.75}, "AuroraMinCapacity must be a multiple of 0.5 ACU"},
		"aurora max below 1":     {Props{CodeDir: code, Aurora: true, AuroraMaxCapacity: 0.5}, "AuroraMaxCapacity must be at least 1 ACU"},
	} {
		t.Run(name, func(t *testing.T) {
			// The same message every time: where two values are refused
			// (a fractional stage burst that the investigations' follows),
			// the first named in a fixed order, not a map's.
			for range 5 {
				_, err := New(awscdk.NewApp(&awscdk.AppProps{Outdir: jsii.String(t.TempDir())}), "Test", tc.props)
				require.ErrorContains(t, err, tc.want)
			}
		})
	}
}
