package main

import (
	"github.com/aws/aws-cdk-go/awscdk/v2"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsdynamodb"
	"github.com/aws/aws-cdk-go/awscdk/v2/awss3"
	"github.com/aws/aws-cdk-go/awscdk/v2/awssecretsmanager"
	"github.com/aws/jsii-runtime-go"
)

// The table's key and index names: internal/dynamo's (client.go), which
// reads and writes them. The local execution test creates its DynamoDB
// Local table from the synthesized template, so the two cannot drift.
const (
	tablePK       = "PK"
	tableSK       = "SK"
	tableTTL      = "ttl"
	indexAllRuns  = "GSI1"
	indexByStatus = "GSI2"
)

// artifactPrefix is where internal/s3 keeps run artifacts ("runs/<id>/").
const artifactPrefix = "runs/"

// data builds what holds state: the table (runs, capabilities, events,
// approvals, claims), the artifact bucket, and the three secrets.
//
// The table and the buckets are retained when the stack is deleted: they
// hold the runs' history and results. The README's teardown step deletes
// them on purpose.
func (s *belayStack) data() {
	s.table = awsdynamodb.NewTable(s.stack, jsii.String("Table"), &awsdynamodb.TableProps{
		PartitionKey: &awsdynamodb.Attribute{Name: jsii.String(tablePK), Type: awsdynamodb.AttributeType_STRING},
		SortKey:      &awsdynamodb.Attribute{Name: jsii.String(tableSK), Type: awsdynamodb.AttributeType_STRING},
		BillingMode:  awsdynamodb.BillingMode_PAY_PER_REQUEST,
		Encryption:   awsdynamodb.TableEncryption_AWS_MANAGED,
		PointInTimeRecoverySpecification: &awsdynamodb.PointInTimeRecoverySpecification{
			PointInTimeRecoveryEnabled: jsii.Bool(true),
		},
		TimeToLiveAttribute: jsii.String(tableTTL),
		RemovalPolicy:       awscdk.RemovalPolicy_RETAIN,
		// The ws function pushes sessions' new events from the stream
		// (websocket.go); keys are all it reads.
		Stream: awsdynamodb.StreamViewType_KEYS_ONLY,
	})
	// The listing indexes hold keys and the request's chunk count only, as
	// internal/dynamo creates them: updates of a run's usage or last event
	// never write to an index.
	for _, ix := range []struct{ name, pk string }{{indexAllRuns, "GSI1PK"}, {indexByStatus, "GSI2PK"}} {
		s.table.AddGlobalSecondaryIndex(&awsdynamodb.GlobalSecondaryIndexProps{
			IndexName:        jsii.String(ix.name),
			PartitionKey:     &awsdynamodb.Attribute{Name: jsii.String(ix.pk), Type: awsdynamodb.AttributeType_STRING},
			SortKey:          &awsdynamodb.Attribute{Name: jsii.String("GSI1SK"), Type: awsdynamodb.AttributeType_STRING},
			ProjectionType:   awsdynamodb.ProjectionType_INCLUDE,
			NonKeyAttributes: jsii.Strings("reqChunks"),
		})
	}

	accessLogs := awss3.NewBucket(s.stack, jsii.String("AccessLogBucket"), &awss3.BucketProps{
		BlockPublicAccess: awss3.BlockPublicAccess_BLOCK_ALL(),
		Encryption:        awss3.BucketEncryption_S3_MANAGED,
		EnforceSSL:        jsii.Bool(true),
		ObjectOwnership:   awss3.ObjectOwnership_BUCKET_OWNER_PREFERRED,
		LifecycleRules: &[]*awss3.LifecycleRule{{
			Expiration: awscdk.Duration_Days(jsii.Number(90)),
		}},
		RemovalPolicy: awscdk.RemovalPolicy_RETAIN,
	})
	s.bucket = awss3.NewBucket(s.stack, jsii.String("ArtifactBucket"), &awss3.BucketProps{
		BlockPublicAccess:      awss3.BlockPublicAccess_BLOCK_ALL(),
		Encryption:             awss3.BucketEncryption_S3_MANAGED,
		EnforceSSL:             jsii.Bool(true),
		MinimumTLSVersion:      jsii.Number(1.2),
		ObjectOwnership:        awss3.ObjectOwnership_BUCKET_OWNER_ENFORCED,
		ServerAccessLogsBucket: accessLogs,
		ServerAccessLogsPrefix: jsii.String("artifacts/"),
		LifecycleRules: &[]*awss3.LifecycleRule{{
			Id:                                  jsii.String("expire-artifacts"),
			Expiration:                          awscdk.Duration_Days(jsii.Number(float64(s.cfg.ArtifactExpiryDays))),
			AbortIncompleteMultipartUploadAfter: awscdk.Duration_Days(jsii.Number(1)),
		}},
		RemovalPolicy: awscdk.RemovalPolicy_RETAIN,
	})

	// The provider key is the operator's to put (README, "Deploy"); until
	// then it holds a random value the provider refuses, never a real key
	// written into the template.
	s.providerKey = awssecretsmanager.NewSecret(s.stack, jsii.String("ProviderKey"), &awssecretsmanager.SecretProps{
		Description: jsii.String("belay: the model provider's API key, read only by the modelproxy function; put it with aws secretsmanager put-secret-value"),
	})
	// The control-plane token callers present (auth=token); CloudFormation
	// generates it, so it appears in no template or log.
	s.controlToken = awssecretsmanager.NewSecret(s.stack, jsii.String("ControlToken"), &awssecretsmanager.SecretProps{
		Description: jsii.String("belay: the control-plane token of the public API"),
		GenerateSecretString: &awssecretsmanager.SecretStringGenerator{
			PasswordLength:     jsii.Number(48),
			ExcludePunctuation: jsii.Bool(true),
		},
	})
	// The run tokens' HMAC-SHA256 key: 64 hex digits, 32 bytes of entropy
	// (the token package requires at least 32 bytes).
	s.signingKey = awssecretsmanager.NewSecret(s.stack, jsii.String("SigningKey"), &awssecretsmanager.SecretProps{
		Description: jsii.String("belay: the run tokens' HMAC-SHA256 key (hex)"),
		GenerateSecretString: &awssecretsmanager.SecretStringGenerator{
			PasswordLength:     jsii.Number(64),
			ExcludePunctuation: jsii.Bool(true),
			ExcludeUppercase:   jsii.Bool(true),
			ExcludeCharacters:  jsii.String("ghijklmnopqrstuvwxyz"),
			IncludeSpace:       jsii.Bool(false),
		},
	})
}
