package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/aws/aws-lambda-go/cfn"

	"github.com/idemarchive/idemarchive/shared/cfnresponse"
	"github.com/idemarchive/idemarchive/shared/fnenv"
	"github.com/idemarchive/idemarchive/shared/provision"
	"github.com/idemarchive/idemarchive/shared/schema"
	"github.com/idemarchive/idemarchive/shared/strictjson"
)

// PhysicalID names the one schema the resource stands for. It never changes,
// so an Update is never taken by CloudFormation for a replacement (which
// would be followed by a Delete of the old id).
const PhysicalID = "idempotency-archive-schema"

// answerMargin is kept free before the invocation's deadline to send the
// answer (Handle's context ends that much earlier): a handler cut off by its
// timeout never answers, and CloudFormation waits its ServiceTimeout.
const answerMargin = 15 * time.Second

// lambdaHandler is the function: Handle, answered to CloudFormation.
func lambdaHandler(env *fnenv.Env) func(context.Context, cfn.Event) error {
	return cfnresponse.Wrap((&handler{env: env}).Handle, cfnresponse.Options{Logger: env.Logger, SendMargin: answerMargin})
}

// maxReason bounds the reason sent back: CloudFormation rejects a response
// over 4096 bytes, and then shows no reason at all.
const maxReason = 1500

type handler struct {
	env *fnenv.Env
}

// properties are the custom resource's properties that the handler reads.
type properties struct {
	SweeperUser string
	ReaderUser  string
	OwnerUser   string
	// WriterUser (optional) is the API services' user.
	WriterUser string
}

// triggers are properties that exist only to make CloudFormation send an
// Update when they change (a new package, another partition lead, a
// database replaced by a new one); the run reads its configuration from the
// environment.
var triggers = []string{"PackageSha256", "LeadMonths", "RetentionMonths", "DatabaseId"}

// readByCloudFormation are the properties CloudFormation itself reads and passes
// on in every event: the function's ARN, and how long it waits for an answer
// (the stack sets it; CloudFormation may pass it as a number).
var readByCloudFormation = []string{"ServiceToken", "ServiceTimeout"}

// Handle adapts a CloudFormation custom resource event to provision.Run. The
// archive is permanent: Delete changes nothing in the database.
func (h *handler) Handle(ctx context.Context, ev cfn.Event) (physicalID string, data map[string]any, err error) {
	log := h.env.RequestLogger(ctx).With("request_type", ev.RequestType, "logical_id", ev.LogicalResourceID)
	// Every answer, failures too, carries a physical id: without one
	// CloudFormation replaces the reason with "Invalid PhysicalResourceId".
	physicalID = cmp.Or(ev.PhysicalResourceID, PhysicalID)
	defer func() {
		if err != nil {
			log.ErrorContext(ctx, "schema provisioning failed", "error", err)
			err = reason(err)
		}
	}()
	switch ev.RequestType {
	case cfn.RequestDelete:
		log.InfoContext(ctx, "delete: the archive is kept")
		return physicalID, nil, nil
	case cfn.RequestCreate, cfn.RequestUpdate:
	default:
		return physicalID, nil, fmt.Errorf("unknown request type %q", ev.RequestType)
	}
	props, err := decode(ev.ResourceProperties)
	if err != nil {
		return physicalID, nil, err
	}
	pool, err := h.env.DB.Get(ctx)
	if err != nil {
		return physicalID, nil, err
	}
	res, err := provision.Run(ctx, pool, provision.Config{
		Users:      provision.Users{Sweeper: props.SweeperUser, Reader: props.ReaderUser, Owner: props.OwnerUser, Writer: props.WriterUser},
		Previous:   previousUsers(ev),
		Partitions: h.env.Settings.Partitions,
	}, log, h.env.Metrics)
	if errors.Is(err, schema.ErrSchemaAhead) && ev.RequestType == cfn.RequestUpdate {
		// The rollback of a deploy that migrated further (or this older
		// package deployed over a newer schema): migrations only add, so
		// the newer schema serves this code. Failing here would leave the
		// stack in UPDATE_ROLLBACK_FAILED.
		log.WarnContext(ctx, "the schema is newer than this package: left as it is (a rollback?)", "error", err)
		return physicalID, map[string]any{"SchemaVersion": res.Schema.FromVersion, "PartitionsCreated": 0, "NewestPartition": ""}, nil
	}
	if err != nil {
		return physicalID, nil, err
	}
	log.InfoContext(ctx, "schema provisioned", "from_version", res.Schema.FromVersion, "to_version", res.Schema.ToVersion,
		"users", res.Users, "partitions_created", res.Partitions.Created, "newest_partition_days", res.Partitions.NewestPartitionDays)
	// Data is readable with Fn::GetAtt by other resources of the stack.
	return physicalID, map[string]any{
		"SchemaVersion":     res.Schema.ToVersion,
		"PartitionsCreated": len(res.Partitions.Created),
		"NewestPartition":   res.Partitions.NewestUpperBound.Format(time.RFC3339),
	}, nil
}

// decode reads the properties, refusing names it does not know so that a
// misspelt user property fails the deploy instead of creating no user.
// previousUsers are the users an Update's old properties named, read
// leniently (an older package may have sent other properties): a name
// that is not a string names no one.
func previousUsers(ev cfn.Event) provision.Users {
	if ev.RequestType != cfn.RequestUpdate {
		return provision.Users{}
	}
	name := func(k string) string {
		s, _ := ev.OldResourceProperties[k].(string)
		return s
	}
	return provision.Users{Sweeper: name("SweeperUser"), Reader: name("ReaderUser"), Owner: name("OwnerUser"), Writer: name("WriterUser")}
}

func decode(raw map[string]any) (properties, error) {
	var p properties
	known := slices.Concat([]string{"SweeperUser", "ReaderUser", "OwnerUser", "WriterUser"}, triggers, readByCloudFormation)
	for k, v := range raw {
		if !slices.Contains(known, k) {
			return p, fmt.Errorf("unknown resource property %q (want %s)", k, strings.Join(known, ", "))
		}
		if slices.Contains(readByCloudFormation, k) {
			continue
		}
		if _, ok := v.(string); !ok {
			got := "null"
			if v != nil {
				got = strictjson.Kind(reflect.TypeOf(v))
			}
			return p, fmt.Errorf("resource property %s must be a string, got %s", k, got)
		}
	}
	b, err := json.Marshal(raw)
	if err != nil {
		return p, err
	}
	if err := json.Unmarshal(b, &p); err != nil {
		return p, fmt.Errorf("resource properties: %w", err)
	}
	// A function whose user is left out would be deployed with a user that
	// does not exist, and fail every invocation after a deploy that
	// succeeded. WriterUser is optional: API services may connect as
	// another user.
	for _, r := range []struct{ prop, user, function string }{
		{"SweeperUser", p.SweeperUser, "sweep"}, {"ReaderUser", p.ReaderUser, "lookup"}, {"OwnerUser", p.OwnerUser, "partitions"},
	} {
		if r.user == "" {
			return p, fmt.Errorf("resource property %s is required (the user the %s function connects as)", r.prop, r.function)
		}
	}
	return p, nil
}

var functionOf = map[string]string{"SweeperUser": "sweep", "ReaderUser": "lookup", "OwnerUser": "partitions"}

// reason bounds an error's text for the CloudFormation response.
func reason(err error) error {
	msg := err.Error()
	if len(msg) <= maxReason {
		return err
	}
	cut := maxReason
	for cut > 0 && !utf8.RuneStart(msg[cut]) {
		cut-- // between characters, or CloudFormation shows U+FFFD
	}
	return errors.New(msg[:cut] + "... (the function's log has the rest)")
}
