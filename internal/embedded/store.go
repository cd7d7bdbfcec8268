package embedded

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"path/filepath"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awsconfig "github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	dynamodbtypes "github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	awss3 "github.com/aws/aws-sdk-go-v2/service/s3"
	s3types "github.com/aws/aws-sdk-go-v2/service/s3/types"
	"github.com/aws/smithy-go"
	"github.com/aws/smithy-go/logging"
	smithyhttp "github.com/aws/smithy-go/transport/http"

	"github.com/belay-dev/belay/internal/belay"
	"github.com/belay-dev/belay/internal/dynamo"
	"github.com/belay-dev/belay/internal/httpapi"
	"github.com/belay-dev/belay/internal/localdir"
	belays3 "github.com/belay-dev/belay/internal/s3"
	"github.com/belay-dev/belay/internal/sqlite"
)

// The environment variables that choose where `belay serve` keeps runs and
// artifacts.
const (
	EnvStore         = "BELAY_STORE"
	EnvDynamoDBTable = "BELAY_DYNAMODB_TABLE"
	EnvS3Bucket      = "BELAY_S3_BUCKET"
	EnvAWSEndpoint   = "BELAY_AWS_ENDPOINT"
	EnvS3Endpoint    = "BELAY_S3_ENDPOINT"
)

// The stores StorageConfig.Store names.
const (
	// StoreSQLite keeps runs in <data dir>/belay.db: the default.
	StoreSQLite = "sqlite"
	// StoreDynamoDB keeps runs in a DynamoDB table, the AWS deployment's
	// store, so one machine can serve on the same adapters as AWS.
	StoreDynamoDB = "dynamodb"
)

// storageCheckTimeout bounds the start-up check of each AWS peer, so a
// wrong or unreachable endpoint stops the start with a message rather than
// the first run; storageCheckAttempts keeps the SDK's retries inside it.
const (
	storageCheckTimeout  = 10 * time.Second
	storageCheckAttempts = 2
)

// StorageConfig chooses where the control plane keeps runs (with their
// events, capabilities and approvals) and artifacts. The zero value is
// the one-machine default: SQLite and a folder, both in the data
// directory.
type StorageConfig struct {
	// Store is StoreSQLite (when empty) or StoreDynamoDB.
	Store string
	// Table is the DynamoDB table of StoreDynamoDB; required with it.
	// One `belay serve` at a time per table: at start it ends the runs a
	// previous process left running, and it would end another live
	// process's runs too.
	Table string
	// CreateTable creates Table (as dynamo.CreateTable shapes it) when it
	// does not exist. Off, a missing table stops the start: on AWS the
	// CDK stack creates it.
	CreateTable bool
	// Bucket, when set, keeps artifacts in this S3 bucket (which must
	// exist) instead of <data dir>/artifacts. It works with either store.
	Bucket string
	// AWSEndpoint overrides the AWS endpoint for a local peer such as
	// DynamoDB Local ("http://127.0.0.1:8000"): clients then sign with
	// dummy credentials in us-east-1 and skip DynamoDB's response checksum
	// validation, which DynamoDB Local fails. Empty means the real service,
	// with the default AWS configuration (environment, shared files,
	// instance role).
	AWSEndpoint string
	// S3Endpoint overrides the S3 endpoint alone (gofakes3, for example);
	// AWSEndpoint when empty.
	S3Endpoint string
}

// storageConfigFromEnv reads the storage variables through get.
func storageConfigFromEnv(get func(string) string) StorageConfig {
	return StorageConfig{
		Store:       get(EnvStore),
		Table:       get(EnvDynamoDBTable),
		Bucket:      get(EnvS3Bucket),
		AWSEndpoint: get(EnvAWSEndpoint),
		S3Endpoint:  get(EnvS3Endpoint),
	}
}

// s3Endpoint is the endpoint override of S3, if any.
func (c StorageConfig) s3Endpoint() string {
	if c.S3Endpoint != "" {
		return c.S3Endpoint
	}
	return c.AWSEndpoint
}

// check fills in the default store and refuses a combination that would
// leave a setting unused, naming the variable and the flag to change.
func (c *StorageConfig) check() error {
	if c.Store == "" {
		c.Store = StoreSQLite
	}
	switch c.Store {
	case StoreSQLite:
		switch {
		case c.Table != "":
			return fmt.Errorf("%s (--table) is set but the store is %s; set %s=%s (--store %s) or unset it",
				EnvDynamoDBTable, StoreSQLite, EnvStore, StoreDynamoDB, StoreDynamoDB)
		case c.CreateTable:
			return fmt.Errorf("--create-table is for --store %s; the store is %s", StoreDynamoDB, StoreSQLite)
		}
	case StoreDynamoDB:
		if c.Table == "" {
			return fmt.Errorf("%s (--table) is not set: name the DynamoDB table of the %s store", EnvDynamoDBTable, StoreDynamoDB)
		}
	default:
		return fmt.Errorf("%s (--store) is %q; want %s or %s", EnvStore, c.Store, StoreSQLite, StoreDynamoDB)
	}
	usesAWS := c.Store == StoreDynamoDB || c.Bucket != ""
	for _, e := range []struct{ value, env, flag string }{
		{c.AWSEndpoint, EnvAWSEndpoint, "--aws-endpoint"},
		{c.S3Endpoint, EnvS3Endpoint, "--s3-endpoint"},
	} {
		if e.value == "" {
			continue
		}
		if !usesAWS {
			return fmt.Errorf("%s (%s) is set but nothing uses AWS: the store is %s and no bucket (%s) is set",
				e.env, e.flag, c.Store, EnvS3Bucket)
		}
		if err := checkEndpoint(e.value); err != nil {
			return fmt.Errorf("%s (%s): %w", e.env, e.flag, err)
		}
	}
	if c.S3Endpoint != "" && c.Bucket == "" {
		return fmt.Errorf("%s (--s3-endpoint) is set but no bucket (%s, --bucket) is", EnvS3Endpoint, EnvS3Bucket)
	}
	return nil
}

// checkEndpoint accepts http(s)://host[:port] with nothing after the host
// but an optional "/".
func checkEndpoint(endpoint string) error {
	u, err := url.Parse(endpoint)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return errors.New("want http(s)://host:port")
	}
	if u.User != nil || (u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.Fragment != "" {
		return errors.New("want http(s)://host:port, with no user, path, query or fragment")
	}
	return nil
}

// Storage describes where runs and artifacts are kept, for the operator:
// a path, or a table or bucket and the endpoint that serves it.
func (m *Main) Storage() (runs, artifacts string) { return describeStorage(m.cfg) }

func describeStorage(cfg Config) (runs, artifacts string) {
	c := cfg.Storage
	switch c.Store {
	case StoreDynamoDB:
		runs = fmt.Sprintf("DynamoDB table %s at %s", c.Table, endpointName(c.AWSEndpoint))
	default:
		runs = filepath.Join(cfg.DataDir, databaseFile)
	}
	if c.Bucket != "" {
		artifacts = fmt.Sprintf("S3 bucket %s at %s", c.Bucket, endpointName(c.s3Endpoint()))
	} else {
		artifacts = filepath.Join(cfg.DataDir, artifactsDir)
	}
	return runs, artifacts
}

// endpointName names an endpoint override, or the real service.
func endpointName(endpoint string) string {
	if endpoint == "" {
		return "AWS (default configuration)"
	}
	return endpoint
}

// storage is what openStorage opened, and how to close it.
type storage struct {
	store     belay.Store
	artifacts belay.ArtifactStore
	close     func() error
}

// openStorage opens the configured store and artifact store. Each AWS
// peer is checked within storageCheckTimeout before use: the table must
// answer DescribeTable (or be created, with CreateTable) and the bucket
// HeadBucket, so a wrong endpoint, region, credentials or name stops the
// start with a message that names it.
func openStorage(ctx context.Context, cfg Config, log *slog.Logger) (st storage, err error) {
	c := cfg.Storage
	var closers []func() error
	st.close = func() error {
		var errs []error
		for i := len(closers) - 1; i >= 0; i-- {
			errs = append(errs, closers[i]())
		}
		return errors.Join(errs...)
	}
	defer func() {
		if err != nil {
			err = errors.Join(err, st.close())
		}
	}()
	var awsCfg *aws.Config
	defaultConfig := func() (aws.Config, error) {
		if awsCfg != nil {
			return *awsCfg, nil
		}
		loaded, err := awsconfig.LoadDefaultConfig(ctx, awsconfig.WithLogger(sdkLogger(log)))
		if err != nil {
			return aws.Config{}, fmt.Errorf("load the default AWS configuration: %w", err)
		}
		if loaded.Region == "" {
			return aws.Config{}, fmt.Errorf("no AWS region: set AWS_REGION (or a profile's region), or %s (--aws-endpoint) for a local peer", EnvAWSEndpoint)
		}
		awsCfg = &loaded
		return loaded, nil
	}

	switch c.Store {
	case StoreDynamoDB:
		var client *dynamodb.Client
		where := endpointName(c.AWSEndpoint)
		if c.AWSEndpoint != "" {
			if client, err = dynamo.NewLocalClient(ctx, c.AWSEndpoint); err != nil {
				return st, fmt.Errorf("%s (--aws-endpoint): %w", EnvAWSEndpoint, err)
			}
			warnPlainHTTP(log, c.AWSEndpoint)
		} else {
			ac, err := defaultConfig()
			if err != nil {
				return st, err
			}
			client = dynamodb.NewFromConfig(ac, dynamo.ClientOptions)
			where = "AWS region " + ac.Region
		}
		if err := ensureTable(ctx, client, c.Table, c.CreateTable, where, log); err != nil {
			return st, err
		}
		st.store = dynamo.New(client, c.Table, dynamo.Options{EventBufferSize: cfg.EventBufferSize, Logger: log})
	default:
		store, err := sqlite.Open(ctx, filepath.Join(cfg.DataDir, databaseFile),
			sqlite.Options{EventBufferSize: cfg.EventBufferSize, Logger: log})
		if err != nil {
			return st, err
		}
		closers = append(closers, store.Close)
		st.store = store
	}

	if c.Bucket != "" {
		var client *awss3.Client
		where := endpointName(c.s3Endpoint())
		if e := c.s3Endpoint(); e != "" {
			client = belays3.NewLocalClient(e)
			warnPlainHTTP(log, e)
		} else {
			ac, err := defaultConfig()
			if err != nil {
				return st, err
			}
			client = awss3.NewFromConfig(ac)
			where = "AWS region " + ac.Region
		}
		if err := checkBucket(ctx, client, c.Bucket, where); err != nil {
			return st, err
		}
		st.artifacts = belays3.New(client, c.Bucket, "")
	} else {
		artifacts, err := localdir.New(filepath.Join(cfg.DataDir, artifactsDir))
		if err != nil {
			return st, err
		}
		closers = append(closers, artifacts.Close)
		st.artifacts = artifacts
	}
	runs, arts := describeStorage(cfg)
	log.Info("storage open", "runs", runs, "artifacts", arts)
	return st, nil
}

// ensureTable checks that table answers DescribeTable within
// storageCheckTimeout and, when it does not exist and create is set,
// creates it.
func ensureTable(ctx context.Context, client *dynamodb.Client, table string, create bool, where string, log *slog.Logger) error {
	check, cancel := context.WithTimeout(ctx, storageCheckTimeout)
	defer cancel()
	_, err := client.DescribeTable(check, &dynamodb.DescribeTableInput{TableName: aws.String(table)},
		func(o *dynamodb.Options) { o.RetryMaxAttempts = storageCheckAttempts })
	var missing *dynamodbtypes.ResourceNotFoundException
	switch {
	case err == nil:
		return nil
	case !errors.As(err, &missing):
		return peerFailure("DynamoDB", where, "table "+table, EnvAWSEndpoint, "--aws-endpoint", err)
	case !create:
		return fmt.Errorf("DynamoDB table %s does not exist at %s: create it (on AWS the CDK stack does), or pass --create-table", table, where)
	}
	if err := dynamo.CreateTable(ctx, client, table); err != nil {
		return fmt.Errorf("DynamoDB at %s: %w", where, err)
	}
	log.Info("created the DynamoDB table", "table", table, "endpoint", where)
	return nil
}

// checkBucket checks that bucket answers HeadBucket within
// storageCheckTimeout.
func checkBucket(ctx context.Context, client *awss3.Client, bucket, where string) error {
	check, cancel := context.WithTimeout(ctx, storageCheckTimeout)
	defer cancel()
	_, err := client.HeadBucket(check, &awss3.HeadBucketInput{Bucket: aws.String(bucket)},
		func(o *awss3.Options) { o.RetryMaxAttempts = storageCheckAttempts })
	if err == nil {
		return nil
	}
	var notFound *s3types.NotFound
	var noBucket *s3types.NoSuchBucket
	var apiErr smithy.APIError
	if errors.As(err, &notFound) || errors.As(err, &noBucket) || (errors.As(err, &apiErr) && apiErr.ErrorCode() == "NotFound") {
		return fmt.Errorf("S3 bucket %s (%s, --bucket) does not exist at %s: create it first", bucket, EnvS3Bucket, where)
	}
	return peerFailure("S3", where, "bucket "+bucket, EnvS3Endpoint, "--s3-endpoint", err)
}

// peerFailure says how the start-up check of an AWS peer failed for what
// (a table or bucket): refused, when the peer answered with an error (a bad
// name, region or credentials); unanswered, when the request could not be
// sent or got no answer within storageCheckTimeout (a wrong or unreachable
// endpoint); or not even sent, for want of credentials.
func peerFailure(service, where, what, env, flag string, err error) error {
	var apiErr smithy.APIError
	var sendErr *smithyhttp.RequestSendError
	switch {
	case errors.As(err, &apiErr):
		return fmt.Errorf("%s at %s refused the check of %s (check the name, the AWS region and credentials): %w", service, where, what, err)
	case errors.As(err, &sendErr), errors.Is(err, context.DeadlineExceeded):
		return fmt.Errorf("%s at %s did not answer for %s within %v (check %s, %s, and the network): %w",
			service, where, what, storageCheckTimeout, env, flag, err)
	}
	return fmt.Errorf("%s at %s: the check of %s failed (check the AWS region and credentials): %w", service, where, what, err)
}

// sdkLogger sends the AWS SDK's own log lines (such as an instance
// metadata fallback) to log as warnings, rather than to stderr in the SDK's
// format.
func sdkLogger(log *slog.Logger) logging.Logger {
	return logging.LoggerFunc(func(c logging.Classification, format string, v ...any) {
		level := slog.LevelWarn
		if c == logging.Debug {
			level = slog.LevelDebug
		}
		log.Log(context.Background(), level, "aws sdk: "+fmt.Sprintf(format, v...))
	})
}

// warnPlainHTTP warns when run data would cross the network in clear.
func warnPlainHTTP(log *slog.Logger, endpoint string) {
	u, err := url.Parse(endpoint)
	if err != nil || u.Scheme != "http" || httpapi.IsLoopbackHost(u.Hostname()) {
		return
	}
	log.Warn("AWS endpoint over plain HTTP beyond loopback: run requests and artifacts cross the network in clear", "endpoint", endpoint)
}
