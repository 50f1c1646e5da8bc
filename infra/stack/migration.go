package stack

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/aws/aws-cdk-go/awscdk/v2"
	"github.com/aws/constructs-go/constructs/v10"
	"github.com/aws/jsii-runtime-go"
)

// SchemaResourceType is the CloudFormation type of the migration custom
// resource.
const SchemaResourceType = "Custom::IdempotencyArchiveSchema"

// Migration is the custom resource that leaves every deploy with the schema
// migrated, the least-privilege roles granted, one login user per function
// and the archive partitions created. It is backed by the migrate function
// (functions/migrate), which answers CloudFormation itself: a failed
// migration fails the deploy with the reason in the stack's events.
type Migration struct {
	// Construct is the scope holding the resources (a Go struct embedding a
	// jsii object cannot itself be passed to jsii as a scope).
	Construct constructs.Construct
	Resource  awscdk.CustomResource
}

// NewMigration builds the custom resource. CloudFormation sends Update only
// when a property changes, so the properties carry a digest of the migrate
// package, which embeds the migrations: a new migration runs on the deploy
// that ships it, and an unchanged deploy runs nothing. They also carry the
// database's resource id: a deploy that replaces the database (switching
// aurora, say) migrates the new one in the same deploy, instead of leaving
// every function on a database without a schema or users.
func NewMigration(scope constructs.Construct, id string, net *Network, db *Database, fns *Functions, p Props) (*Migration, error) {
	c := constructs.NewConstruct(scope, jsii.String(id))
	digest, err := fileDigest(filepath.Join(p.CodeDir, "migrate.zip"))
	if err != nil {
		return nil, err
	}
	res := awscdk.NewCustomResource(c, jsii.String("Schema"), &awscdk.CustomResourceProps{
		ServiceToken: fns.Migrate.FunctionArn(),
		ResourceType: jsii.String(SchemaResourceType),
		Properties: &map[string]any{
			"SweeperUser":     SweeperUser,
			"ReaderUser":      ReaderUser,
			"OwnerUser":       OwnerUser,
			"WriterUser":      WriterUser,
			"PackageSha256":   digest,
			"LeadMonths":      fmt.Sprint(p.PartitionLeadMonths),
			"RetentionMonths": fmt.Sprint(p.PartitionRetentionMonths),
			"DatabaseId":      db.resourceID,
		},
		// The archive is permanent: deleting the stack never drops it (the
		// database's own removal policy decides what remains).
		RemovalPolicy: awscdk.RemovalPolicy_RETAIN,
		// Beyond the function's 15-minute timeout: a function that dies
		// before answering (a bad configuration at init) fails the deploy
		// after this, not after CloudFormation's default hour.
		ServiceTimeout: awscdk.Duration_Minutes(jsii.Number(serviceTimeoutMinutes)),
	})
	// The function connects through the proxy once the proxy has its target,
	// and answers through the S3 gateway endpoint. CloudFormation invokes it
	// only once its no-retry setting exists: on a new stack, a failed Create
	// would otherwise be retried by Lambda after CloudFormation gave up.
	res.Node().AddDependency(db.Construct, net.Construct, invokeConfig(fns.Migrate))
	return &Migration{Construct: c, Resource: res}, nil
}

func fileDigest(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("read %s: %w", path, err)
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:]), nil
}

// serviceTimeoutMinutes is how long CloudFormation waits for the migrate
// function's answer.
const serviceTimeoutMinutes = 20

// migrateTimeout is the migrate function's timeout, the longest Lambda
// allows, and migrateMaxEventAge how long its event may wait in Lambda's
// queue: a run that starts then still ends before ServiceTimeout, while
// CloudFormation waits for its answer (Lambda's floor is a minute).
const (
	migrateTimeout     = 15 * time.Minute
	migrateMaxEventAge = serviceTimeoutMinutes*time.Minute - migrateTimeout
)
