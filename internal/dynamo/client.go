package dynamo

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/aws/ratelimit"
	"github.com/aws/aws-sdk-go-v2/aws/retry"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/aws/smithy-go"
)

// MaxAttempts is how many times the SDK tries one DynamoDB call that fails
// with a throttling or transient error before giving up. Eight attempts with
// capped exponential, jittered backoff ride out a few seconds of throttling.
const MaxAttempts = 8

// ClientOptions configures a DynamoDB client for this store: the SDK's
// standard retryer with MaxAttempts, backoff capped at two seconds, single-item
// writes that collide with a transaction (TransactionConflictException)
// retried like throttling, and no client-side retry quota (the quota would turn
// a burst of conflicts on one hot run into hard failures). Pass it to
// dynamodb.NewFromConfig on AWS.
func ClientOptions(o *dynamodb.Options) {
	o.Retryer = retry.NewStandard(func(so *retry.StandardOptions) {
		so.MaxAttempts = MaxAttempts
		so.MaxBackoff = 2 * time.Second
		so.RateLimiter = ratelimit.None
		so.Retryables = append(so.Retryables, retry.RetryableErrorCode{
			Codes: map[string]struct{}{"TransactionConflictException": {}},
		})
	})
}

// NewLocalClient returns a client for DynamoDB Local (tests, and `belay serve
// --store dynamodb` against a local peer) at endpoint, for example
// "http://127.0.0.1:8000". It signs with static dummy credentials in
// us-east-1 and skips response checksum validation, which DynamoDB Local's
// responses fail; clients for the real service keep validation on.
func NewLocalClient(ctx context.Context, endpoint string) (*dynamodb.Client, error) {
	u, err := url.Parse(endpoint)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("dynamodb local endpoint %q: want http(s)://host:port", endpoint)
	}
	return dynamodb.New(dynamodb.Options{
		Region:                          "us-east-1",
		BaseEndpoint:                    aws.String(endpoint),
		Credentials:                     credentials.NewStaticCredentialsProvider("local", "local", ""),
		DisableValidateResponseChecksum: true,
	}, ClientOptions), nil
}

// The table's key and index attribute names.
const (
	attrPK     = "PK"
	attrSK     = "SK"
	attrGSI1PK = "GSI1PK"
	attrGSI1SK = "GSI1SK"
	attrGSI2PK = "GSI2PK"
	attrTTL    = "ttl"

	// indexAllRuns lists every run newest first (partition "RUNS");
	// indexRunsByStatus lists the runs of one status ("STATUS#running").
	indexAllRuns      = "GSI1"
	indexRunsByStatus = "GSI2"
)

// listProjection is what the listing indexes hold besides keys: only the
// request's chunk count, which never changes. Updates of lastSeq, usage and
// outcome therefore never write to an index (with ALL, every event append
// would also write the hot "RUNS" index partition).
var listProjection = &types.Projection{
	ProjectionType:   types.ProjectionTypeInclude,
	NonKeyAttributes: []string{"reqChunks"},
}

// CreateTable creates the store's table (on-demand billing, the two listing
// indexes, TTL on the "ttl" attribute) and waits until it is active. It is
// for tests and for `belay serve --store dynamodb`; on AWS the CDK stack
// creates the same table. An existing table is an error.
func CreateTable(ctx context.Context, client *dynamodb.Client, table string) error {
	str := types.ScalarAttributeTypeS
	key := func(name string, kt types.KeyType) types.KeySchemaElement {
		return types.KeySchemaElement{AttributeName: aws.String(name), KeyType: kt}
	}
	_, err := client.CreateTable(ctx, &dynamodb.CreateTableInput{
		TableName:   aws.String(table),
		BillingMode: types.BillingModePayPerRequest,
		AttributeDefinitions: []types.AttributeDefinition{
			{AttributeName: aws.String(attrPK), AttributeType: str},
			{AttributeName: aws.String(attrSK), AttributeType: str},
			{AttributeName: aws.String(attrGSI1PK), AttributeType: str},
			{AttributeName: aws.String(attrGSI1SK), AttributeType: str},
			{AttributeName: aws.String(attrGSI2PK), AttributeType: str},
		},
		KeySchema: []types.KeySchemaElement{key(attrPK, types.KeyTypeHash), key(attrSK, types.KeyTypeRange)},
		GlobalSecondaryIndexes: []types.GlobalSecondaryIndex{
			{
				IndexName:  aws.String(indexAllRuns),
				KeySchema:  []types.KeySchemaElement{key(attrGSI1PK, types.KeyTypeHash), key(attrGSI1SK, types.KeyTypeRange)},
				Projection: listProjection,
			},
			{
				IndexName:  aws.String(indexRunsByStatus),
				KeySchema:  []types.KeySchemaElement{key(attrGSI2PK, types.KeyTypeHash), key(attrGSI1SK, types.KeyTypeRange)},
				Projection: listProjection,
			},
		},
	})
	if err != nil {
		return fmt.Errorf("create table %s: %w", table, err)
	}
	waiter := dynamodb.NewTableExistsWaiter(client, func(o *dynamodb.TableExistsWaiterOptions) {
		o.MinDelay = 100 * time.Millisecond
		o.MaxDelay = time.Second
	})
	if err := waiter.Wait(ctx, &dynamodb.DescribeTableInput{TableName: aws.String(table)}, 2*time.Minute); err != nil {
		return fmt.Errorf("wait for table %s: %w", table, err)
	}
	_, err = client.UpdateTimeToLive(ctx, &dynamodb.UpdateTimeToLiveInput{
		TableName: aws.String(table),
		TimeToLiveSpecification: &types.TimeToLiveSpecification{
			AttributeName: aws.String(attrTTL),
			Enabled:       aws.Bool(true),
		},
	})
	if err != nil {
		return fmt.Errorf("enable ttl on table %s: %w", table, err)
	}
	return nil
}

// isAPICode reports whether err is a DynamoDB API error with the given code.
func isAPICode(err error, code string) bool {
	var ae smithy.APIError
	return errors.As(err, &ae) && ae.ErrorCode() == code
}
