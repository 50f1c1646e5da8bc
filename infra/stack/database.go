package stack

import (
	"fmt"

	"github.com/aws/aws-cdk-go/awscdk/v2"
	"github.com/aws/aws-cdk-go/awscdk/v2/awscloudwatch"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsec2"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsiam"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsrds"
	"github.com/aws/aws-cdk-go/awscdk/v2/awssecretsmanager"
	"github.com/aws/constructs-go/constructs/v10"
	"github.com/aws/jsii-runtime-go"
)

// Database is PostgreSQL (an RDS instance, or an Aurora Serverless v2
// cluster) behind RDS Proxy.
//
// Authentication: every client authenticates to the proxy with an IAM token
// (the proxy requires IAM and TLS). For the functions' own users the proxy
// uses end-to-end IAM authentication (DefaultAuthScheme IAM_AUTH): it connects
// to the database with IAM too, so those users have no password anywhere and
// need only `GRANT rds_iam`, which the migration does. The master user keeps
// its generated password in Secrets Manager, registered with the proxy: that is
// how the migration, connecting as the master user, can create the other users
// on a fresh database, before any of them has rds_iam.
type Database struct {
	// Construct is the scope holding the resources (a Go struct embedding a
	// jsii object cannot itself be passed to jsii as a scope).
	Construct constructs.Construct
	Proxy     awsrds.DatabaseProxy
	Secret    awssecretsmanager.ISecret
	// resourceID is the DbiResourceId (instance) or DbClusterResourceId
	// (cluster) that rds-db:connect ARNs for the database itself name.
	resourceID *string
	// writerID is the DB instance identifier of the instance that takes the
	// writes (the RDS instance, or the Aurora cluster's writer): the
	// dimension of its instance-level metrics.
	writerID *string
	// aurora tells an Aurora cluster (storage grows by itself; capacity in
	// ACUs) from an RDS instance (storage up to its maximum; fixed class).
	aurora bool
}

// Metric is one of the writer instance's AWS/RDS metrics.
func (db *Database) Metric(name, statistic string, period awscdk.Duration) awscloudwatch.Metric {
	return awscloudwatch.NewMetric(&awscloudwatch.MetricProps{
		Namespace: jsii.String("AWS/RDS"), MetricName: jsii.String(name),
		DimensionsMap: &map[string]*string{"DBInstanceIdentifier": db.writerID},
		Statistic:     jsii.String(statistic), Period: period,
	})
}

// NewDatabase builds the database and its proxy in the network's isolated
// subnets; only the proxy accepts connections from the functions.
func NewDatabase(scope constructs.Construct, id string, net *Network, p Props) *Database {
	c := constructs.NewConstruct(scope, jsii.String(id))
	db := &Database{Construct: c, aurora: p.Aurora}
	creds := awsrds.Credentials_FromGeneratedSecret(jsii.String(MasterUser), nil)
	// A final snapshot, always: when the stack is deleted (once deletion
	// protection is off, or was never on) and when a deploy replaces the
	// database (aurora switched). A test stack leaves a snapshot to delete
	// by hand; a production stack whose protection was turned off for a
	// moment never loses the archive for good.
	removal := awscdk.RemovalPolicy_SNAPSHOT

	var (
		target      awsrds.ProxyTarget
		connections awsec2.Connections
		rotate      func(*awsrds.RotationSingleUserOptions)
	)
	if p.Aurora {
		cluster := awsrds.NewDatabaseCluster(c, jsii.String("Cluster"), &awsrds.DatabaseClusterProps{
			Engine: awsrds.DatabaseClusterEngine_AuroraPostgres(&awsrds.AuroraPostgresClusterEngineProps{
				Version: awsrds.AuroraPostgresEngineVersion_VER_17_5(),
			}),
			Writer:                  awsrds.ClusterInstance_ServerlessV2(jsii.String("writer"), nil),
			ServerlessV2MinCapacity: jsii.Number(p.AuroraMinCapacity),
			ServerlessV2MaxCapacity: jsii.Number(p.AuroraMaxCapacity),
			Vpc:                     net.Vpc,
			VpcSubnets:              isolated,
			Credentials:             creds,
			DefaultDatabaseName:     jsii.String(DatabaseName),
			StorageEncrypted:        jsii.Bool(true),
			IamAuthentication:       jsii.Bool(true),
			DeletionProtection:      p.DeletionProtection,
			RemovalPolicy:           removal,
			Backup:                  &awsrds.BackupProps{Retention: awscdk.Duration_Days(jsii.Number(7))},
			CloudwatchLogsExports:   jsii.Strings("postgresql"),
			CloudwatchLogsRetention: retention(p.LogRetentionDays),
		})
		target = awsrds.ProxyTarget_FromCluster(cluster)
		connections = cluster.Connections()
		db.Secret = cluster.Secret()
		db.resourceID = cluster.ClusterResourceIdentifier()
		db.writerID = (*cluster.InstanceIdentifiers())[0]
		rotate = func(o *awsrds.RotationSingleUserOptions) { cluster.AddRotationSingleUser(o) }
	} else {
		instance := awsrds.NewDatabaseInstance(c, jsii.String("Instance"), &awsrds.DatabaseInstanceProps{
			// Major version only: RDS picks its current default minor version
			// and AutoMinorVersionUpgrade keeps it patched.
			Engine: awsrds.DatabaseInstanceEngine_Postgres(&awsrds.PostgresInstanceEngineProps{
				Version: awsrds.PostgresEngineVersion_VER_17(),
			}),
			InstanceType:            awsec2.NewInstanceType(jsii.String(p.InstanceType)),
			Vpc:                     net.Vpc,
			VpcSubnets:              isolated,
			Credentials:             creds,
			DatabaseName:            jsii.String(DatabaseName),
			MultiAz:                 jsii.Bool(p.MultiAZ),
			AllocatedStorage:        jsii.Number(20),
			MaxAllocatedStorage:     jsii.Number(1000),
			StorageType:             awsrds.StorageType_GP3,
			StorageEncrypted:        jsii.Bool(true),
			IamAuthentication:       jsii.Bool(true),
			AutoMinorVersionUpgrade: jsii.Bool(true),
			DeletionProtection:      p.DeletionProtection,
			RemovalPolicy:           removal,
			BackupRetention:         awscdk.Duration_Days(jsii.Number(7)),
			CloudwatchLogsExports:   jsii.Strings("postgresql"),
			CloudwatchLogsRetention: retention(p.LogRetentionDays),
		})
		target = awsrds.ProxyTarget_FromInstance(instance)
		connections = instance.Connections()
		db.Secret = instance.Secret()
		db.resourceID = instance.InstanceResourceId()
		db.writerID = instance.InstanceIdentifier()
		rotate = func(o *awsrds.RotationSingleUserOptions) { instance.AddRotationSingleUser(o) }
	}
	if *p.RotateMasterSecret {
		// The rotation function runs in the isolated subnets too and reaches
		// Secrets Manager through the endpoint, which lets in its group only.
		rotationSG := awsec2.NewSecurityGroup(c, jsii.String("RotationSecurityGroup"), &awsec2.SecurityGroupProps{
			Vpc:         net.Vpc,
			Description: jsii.String("Master password rotation: to the database and the Secrets Manager endpoint"),
		})
		net.SecretsManager.Connections().AllowDefaultPortFrom(rotationSG, jsii.String("master password rotation"))
		rotate(&awsrds.RotationSingleUserOptions{
			AutomaticallyAfter: awscdk.Duration_Days(jsii.Number(30)),
			Endpoint:           net.SecretsManager,
			VpcSubnets:         isolated,
			SecurityGroup:      rotationSG,
		})
	}

	proxySG := awsec2.NewSecurityGroup(c, jsii.String("ProxySecurityGroup"), &awsec2.SecurityGroupProps{
		Vpc:              net.Vpc,
		Description:      jsii.String("RDS Proxy of the idempotency archive: from the functions, to the database"),
		AllowAllOutbound: jsii.Bool(false),
	})
	// The proxy's own role: it reads the master secret (granted by the
	// construct) and signs in as the functions' users (below).
	proxyRole := awsiam.NewRole(c, jsii.String("ProxyRole"), &awsiam.RoleProps{
		AssumedBy:   awsiam.NewServicePrincipal(jsii.String("rds.amazonaws.com"), nil),
		Description: jsii.String("RDS Proxy of the idempotency archive"),
	})
	db.Proxy = awsrds.NewDatabaseProxy(c, jsii.String("Proxy"), &awsrds.DatabaseProxyProps{
		ProxyTarget:    target,
		Vpc:            net.Vpc,
		VpcSubnets:     isolated,
		SecurityGroups: &[]awsec2.ISecurityGroup{proxySG},
		Role:           proxyRole,
		// Unique per stack and account: the construct's default is "Proxy".
		DbProxyName:       awscdk.Names_UniqueResourceName(c, &awscdk.UniqueResourceNameOptions{MaxLength: jsii.Number(60), Separator: jsii.String("-")}),
		Secrets:           &[]awssecretsmanager.ISecret{db.Secret},
		RequireTLS:        jsii.Bool(true),
		IamAuth:           jsii.Bool(true),
		DefaultAuthScheme: awsrds.DefaultAuthScheme_IAM_AUTH,
		// A function that cannot get a connection within this fails fast
		// enough to be retried by the next schedule or the caller.
		BorrowTimeout: awscdk.Duration_Seconds(jsii.Number(30)),
	})
	// End-to-end IAM: the proxy's role signs in to the database as each
	// function's user.
	for _, user := range []string{SweeperUser, ReaderUser, OwnerUser, WriterUser} {
		proxyRole.AddToPrincipalPolicy(awsiam.NewPolicyStatement(&awsiam.PolicyStatementProps{
			Actions:   jsii.Strings("rds-db:connect"),
			Resources: &[]*string{db.dbUserArn(user)},
		}))
	}
	connections.AllowDefaultPortFrom(proxySG, jsii.String("RDS Proxy"))
	proxySG.Connections().AllowTo(connections, awsec2.Port_Tcp(jsii.Number(5432)), jsii.String("to the database"))
	proxySG.Connections().AllowFrom(net.Functions, awsec2.Port_Tcp(jsii.Number(5432)), jsii.String("the functions"))
	return db
}

// dbUserArn is the rds-db:connect resource of user on the database itself
// (not the proxy), which the proxy's role needs for end-to-end IAM.
func (db *Database) dbUserArn(user string) *string {
	return awscdk.Stack_Of(db.Construct).FormatArn(&awscdk.ArnComponents{
		Service:      jsii.String("rds-db"),
		Resource:     jsii.String("dbuser"),
		ResourceName: jsii.String(fmt.Sprintf("%s/%s", *db.resourceID, user)),
		ArnFormat:    awscdk.ArnFormat_COLON_RESOURCE_NAME,
	})
}

// URL is the DATABASE_URL of a function connecting through the proxy as user:
// verify-full, which the proxy's certificate (issued by a public CA) passes
// with the system roots.
func (db *Database) URL(user string) string {
	return fmt.Sprintf("postgres://%s@%s:5432/%s?sslmode=verify-full", user, *db.Proxy.Endpoint(), DatabaseName)
}

// GrantConnect lets grantee connect through the proxy as user, and as no one
// else.
func (db *Database) GrantConnect(grantee awsiam.IGrantable, user string) {
	db.Proxy.GrantConnect(grantee, jsii.String(user))
}
