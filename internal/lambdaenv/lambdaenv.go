// Package lambdaenv builds belay's Lambda functions from their environment:
// the names of resources the stack created (table, bucket, state machine,
// cluster), secrets by Secrets Manager ARN (read through the cached source
// of internal/secrets), and AWS clients for the real services or for local
// peers. For local runs and tests each secret can instead be given directly
// (BELAY_TOKEN, BELAY_SIGNING_KEY, BELAY_MODEL_API_KEY), and each service's
// endpoint pointed at a peer on this machine (BELAY_AWS_ENDPOINT and the
// per-service overrides). The README lists every variable of every
// function; this package is where they are read, so each functions/<name>
// main.go stays a few lines of wiring.
//
// Errors name the variable to set and never quote a secret.
package lambdaenv

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"os"
	"reflect"
	"strconv"
	"strings"
	"time"

	"github.com/aws/aws-lambda-go/lambda"
	"github.com/aws/aws-sdk-go-v2/aws"
	awsconfig "github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/ecs"
	awss3 "github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/secretsmanager"
	"github.com/aws/aws-sdk-go-v2/service/sfn"

	"github.com/belay-dev/belay/internal/belay"
	"github.com/belay-dev/belay/internal/dynamo"
	"github.com/belay-dev/belay/internal/httpapi"
	belays3 "github.com/belay-dev/belay/internal/s3"
	"github.com/belay-dev/belay/internal/secrets"
	"github.com/belay-dev/belay/internal/token"
)

// The environment variables the CDK stack sets (see CONTRACTS.md, "Function
// names and environment").
const (
	EnvTable                 = "BELAY_TABLE"
	EnvBucket                = "BELAY_BUCKET"
	EnvModel                 = "BELAY_MODEL"
	EnvStateMachineARN       = "BELAY_STATE_MACHINE_ARN"
	EnvClusterARN            = "BELAY_CLUSTER_ARN"
	EnvPrivateAPIURL         = "BELAY_PRIVATE_API_URL"
	EnvControlTokenSecretARN = "BELAY_CONTROL_TOKEN_SECRET_ARN"
	EnvSigningKeySecretARN   = "BELAY_SIGNING_KEY_SECRET_ARN"
	EnvModelAPIURL           = "BELAY_MODEL_API_URL"
	EnvModelAPIKeySecretARN  = "BELAY_MODEL_API_KEY_SECRET_ARN"
	EnvModelProvider         = "BELAY_MODEL_PROVIDER"
)

// Tuning variables, each with a default the stack need not set.
const (
	// EnvLogLevel is debug, info (default), warn or error.
	EnvLogLevel = "BELAY_LOG_LEVEL"
	// EnvModelTimeoutSeconds bounds one upstream model call (default 120).
	EnvModelTimeoutSeconds = "BELAY_MODEL_TIMEOUT_SECONDS"
	// EnvStreamMaxSeconds is how long the stream function keeps one event
	// stream open before it closes it with a retry hint (default 840).
	EnvStreamMaxSeconds = "BELAY_STREAM_MAX_SECONDS"
	// EnvSandboxEvents and EnvSandboxEventBytes cap what one run's
	// sandbox may append to its log, as for belay serve (defaults
	// belay.DefaultSandboxEventLimits).
	EnvSandboxEvents     = "BELAY_SANDBOX_EVENTS"
	EnvSandboxEventBytes = "BELAY_SANDBOX_EVENT_BYTES"
	// EnvExtensions and EnvChecks add to the run limits as for belay
	// serve (belay.ParseOperatorLimits): more file extensions
	// (".kt,.swift") and more allowlisted checks ("go test ./...;cargo
	// test"). Every function that validates runs must get the same.
	EnvExtensions = "BELAY_EXTENSIONS"
	EnvChecks     = "BELAY_CHECKS"
)

// The direct variables for local runs and tests: a secret's value instead
// of its ARN, and endpoints of local peers.
const (
	EnvToken       = "BELAY_TOKEN"
	EnvSigningKey  = "BELAY_SIGNING_KEY"
	EnvModelAPIKey = "BELAY_MODEL_API_KEY"
	// EnvAWSEndpoint points every AWS client at one local peer; the
	// per-service variables below override it for their service.
	EnvAWSEndpoint            = "BELAY_AWS_ENDPOINT"
	EnvS3Endpoint             = "BELAY_S3_ENDPOINT"
	EnvSFNEndpoint            = "BELAY_SFN_ENDPOINT"
	EnvECSEndpoint            = "BELAY_ECS_ENDPOINT"
	EnvSecretsManagerEndpoint = "BELAY_SECRETSMANAGER_ENDPOINT"
	// EnvGitLoopbackHTTP, set to 1, lets a caller's git source be a
	// plain-http URL on a loopback host: a git server of a local test, as
	// belay serve allows; deployed, git sources are https only.
	EnvGitLoopbackHTTP = "BELAY_GIT_LOOPBACK_HTTP"
)

// DefaultStreamMax is how long one event stream stays open by default:
// under the 15 minutes API Gateway allows a streamed response, with room
// for the last events and the retry hint.
const DefaultStreamMax = 14 * time.Minute

// initTimeout bounds what a function does at start (reading secrets).
const initTimeout = 20 * time.Second

// Env reads a function's configuration. The zero value is not usable; use
// FromOS, or New in tests.
type Env struct {
	get func(string) string
	// Function names the function in logs and metrics.
	Function string

	awsCfg *aws.Config
}

// FromOS returns the Env of the running process for the named function.
func FromOS(function string) *Env { return New(function, os.Getenv) }

// New returns an Env that reads variables through get.
func New(function string, get func(string) string) *Env {
	return &Env{get: get, Function: function}
}

// Get returns a variable's value, trimmed.
func (e *Env) Get(name string) string { return strings.TrimSpace(e.get(name)) }

// Require returns a variable's value, or an error naming it when unset.
func (e *Env) Require(name, what string) (string, error) {
	v := e.Get(name)
	if v == "" {
		return "", fmt.Errorf("%s is not set: %s", name, what)
	}
	return v, nil
}

// Start is a function's main: it builds the handler with build (bounded by
// InitContext), logging the error and exiting 1 when that fails (Lambda
// then reports the init error), and hands it to the Lambda runtime.
func Start[H any](function string, build func(ctx context.Context, env *Env, log *slog.Logger) (H, error)) {
	env := FromOS(function)
	log := env.Logger(os.Stdout)
	ctx, cancel := InitContext()
	h, err := build(ctx, env, log)
	cancel()
	if err == nil && reflect.TypeOf(h).Kind() != reflect.Func {
		// lambda.Start would only say so at the first event.
		err = fmt.Errorf("the handler is a %T, not a function", h)
	}
	if err != nil {
		log.Error(function+": start", "err", err.Error())
		os.Exit(1)
	}
	lambda.Start(h)
}

// Logger returns the function's JSON logger on w (os.Stdout in Lambda, where
// CloudWatch Logs collects it), at EnvLogLevel, with the function's name on
// every line. An unknown level is reported on the logger and info applies.
func (e *Env) Logger(w io.Writer) *slog.Logger {
	level := slog.LevelInfo
	v := e.Get(EnvLogLevel)
	bad := v != "" && level.UnmarshalText([]byte(v)) != nil
	if bad {
		level = slog.LevelInfo
	}
	log := slog.New(slog.NewJSONHandler(w, &slog.HandlerOptions{Level: level})).With("function", e.Function)
	if bad {
		log.Warn(EnvLogLevel+" is not debug, info, warn or error; logging at info", "value", v)
	}
	return log
}

// InitContext bounds a function's start-up work.
func InitContext() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), initTimeout)
}

// endpoint is the local peer for a service, if any.
func (e *Env) endpoint(service string) (string, string, error) {
	name := EnvAWSEndpoint
	v := e.Get(EnvAWSEndpoint)
	if service != "" {
		if s := e.Get(service); s != "" {
			name, v = service, s
		}
	}
	if v == "" {
		return "", "", nil
	}
	u, err := url.Parse(v)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return "", "", fmt.Errorf("%s is %q; want http(s)://host:port of a local peer", name, v)
	}
	return v, name, nil
}

// config is the default AWS configuration (region, credentials from the
// function's role), loaded once, for clients of the real services.
func (e *Env) config(ctx context.Context) (aws.Config, error) {
	if e.awsCfg != nil {
		return *e.awsCfg, nil
	}
	cfg, err := awsconfig.LoadDefaultConfig(ctx)
	if err != nil {
		return aws.Config{}, fmt.Errorf("load AWS configuration: %w", err)
	}
	e.awsCfg = &cfg
	return cfg, nil
}

// localCredentials sign requests to local peers, which accept any.
var localCredentials = credentials.NewStaticCredentialsProvider("belay-local", "belay-local-secret", "")

// localRegion is the region local peers are addressed in.
const localRegion = "us-east-1"

// DynamoDB returns a DynamoDB client: DynamoDB Local at the endpoint
// variable, else the real service, with the store's retry options.
func (e *Env) DynamoDB(ctx context.Context) (*dynamodb.Client, error) {
	ep, _, err := e.endpoint("")
	if err != nil {
		return nil, err
	}
	if ep != "" {
		return dynamo.NewLocalClient(ctx, ep)
	}
	cfg, err := e.config(ctx)
	if err != nil {
		return nil, err
	}
	return dynamodb.NewFromConfig(cfg, dynamo.ClientOptions), nil
}

// S3 returns an S3 client: the S3 peer at EnvS3Endpoint (else
// EnvAWSEndpoint), else the real service.
func (e *Env) S3(ctx context.Context) (*awss3.Client, error) {
	ep, _, err := e.endpoint(EnvS3Endpoint)
	if err != nil {
		return nil, err
	}
	if ep != "" {
		return belays3.NewLocalClient(ep), nil
	}
	cfg, err := e.config(ctx)
	if err != nil {
		return nil, err
	}
	return awss3.NewFromConfig(cfg), nil
}

// SFN returns a Step Functions client: at EnvSFNEndpoint (else
// EnvAWSEndpoint) when set, else the real service.
func (e *Env) SFN(ctx context.Context) (*sfn.Client, error) {
	return client(ctx, e, EnvSFNEndpoint,
		func(o aws.Config) *sfn.Client { return sfn.NewFromConfig(o) })
}

// ECS returns an ECS client: at EnvECSEndpoint (else EnvAWSEndpoint) when
// set, else the real service.
func (e *Env) ECS(ctx context.Context) (*ecs.Client, error) {
	return client(ctx, e, EnvECSEndpoint,
		func(o aws.Config) *ecs.Client { return ecs.NewFromConfig(o) })
}

// secretsManager returns a Secrets Manager client: at
// EnvSecretsManagerEndpoint (else EnvAWSEndpoint) when set, else the real
// service.
func (e *Env) secretsManager(ctx context.Context) (*secretsmanager.Client, error) {
	return client(ctx, e, EnvSecretsManagerEndpoint,
		func(o aws.Config) *secretsmanager.Client { return secretsmanager.NewFromConfig(o) })
}

// client builds a service's client from a configuration: the default one
// for the real service, or, when the service's endpoint variable (or
// EnvAWSEndpoint) is set, one for that local peer in localRegion with
// local credentials. The local configuration is built by hand, not
// loaded, so nothing of the machine's AWS setup (AWS_CA_BUNDLE, profiles)
// applies to it.
func client[C any](ctx context.Context, e *Env, endpointVar string, build func(aws.Config) C) (C, error) {
	var zero C
	ep, _, err := e.endpoint(endpointVar)
	if err != nil {
		return zero, err
	}
	if ep != "" {
		return build(aws.Config{Region: localRegion, BaseEndpoint: aws.String(ep), Credentials: localCredentials}), nil
	}
	cfg, err := e.config(ctx)
	if err != nil {
		return zero, err
	}
	return build(cfg), nil
}

// Store returns the DynamoDB store on EnvTable.
func (e *Env) Store(ctx context.Context, log *slog.Logger) (*dynamo.Store, error) {
	table, err := e.Require(EnvTable, "name the DynamoDB table of runs")
	if err != nil {
		return nil, err
	}
	client, err := e.DynamoDB(ctx)
	if err != nil {
		return nil, err
	}
	return dynamo.New(client, table, dynamo.Options{Logger: log}), nil
}

// Artifacts returns the S3 artifact store on EnvBucket.
func (e *Env) Artifacts(ctx context.Context) (*belays3.Store, error) {
	bucket, err := e.Require(EnvBucket, "name the S3 bucket of artifacts")
	if err != nil {
		return nil, err
	}
	client, err := e.S3(ctx)
	if err != nil {
		return nil, err
	}
	return belays3.New(client, bucket, ""), nil
}

// Model returns the one model runs may use.
func (e *Env) Model() (string, error) {
	return e.Require(EnvModel, "name the one model runs may use")
}

// Limits returns the run-creation limits for EnvModel, with the
// operator's additions from EnvExtensions and EnvChecks, read as belay
// serve reads them.
func (e *Env) Limits() (belay.Limits, error) {
	model, err := e.Model()
	if err != nil {
		return belay.Limits{}, err
	}
	lim, err := belay.ParseOperatorLimits(e.Get(EnvExtensions), e.Get(EnvChecks)).
		Apply(belay.DefaultLimits(model), EnvExtensions, EnvChecks)
	if err != nil {
		return belay.Limits{}, err
	}
	switch v := e.Get(EnvGitLoopbackHTTP); v {
	case "", "0":
	case "1":
		lim.GitURLs.AllowLoopbackHTTP = true
	default:
		return belay.Limits{}, fmt.Errorf("%s is %q; want 1 (allow http git sources on loopback, for local tests) or unset", EnvGitLoopbackHTTP, v)
	}
	return lim, nil
}

// SecretSource is the Source of a secret given directly (the variable
// direct) or by ARN (the variable arn); exactly one must be set. what names
// the secret in errors.
func (e *Env) SecretSource(ctx context.Context, direct, arn, what string) (secrets.Source, error) {
	v, id := e.Get(direct), e.Get(arn)
	switch {
	case v != "" && id != "":
		return nil, fmt.Errorf("both %s and %s are set; set one (%s)", direct, arn, what)
	case v != "":
		return secrets.NewStaticSource(v), nil
	case id != "":
		client, err := e.secretsManager(ctx)
		if err != nil {
			return nil, err
		}
		return secrets.NewSecretsManagerSource(client, id), nil
	}
	return nil, fmt.Errorf("neither %s nor %s is set: %s", arn, direct, what)
}

// Secret reads a secret (see SecretSource) once, at start.
func (e *Env) Secret(ctx context.Context, direct, arn, what string) (string, error) {
	src, err := e.SecretSource(ctx, direct, arn, what)
	if err != nil {
		return "", err
	}
	v, err := src.Fetch(ctx)
	if err != nil {
		return "", fmt.Errorf("%s: %w", what, err)
	}
	return v, nil
}

// ControlTokens returns the control-plane token (EnvToken, or the secret
// at EnvControlTokenSecretARN), read once at start. A secret may hold
// several tokens, one a line, so an operator can rotate without downtime.
func (e *Env) ControlTokens(ctx context.Context) ([]string, error) {
	v, err := e.Secret(ctx, EnvToken, EnvControlTokenSecretARN, "the control-plane token")
	if err != nil {
		return nil, err
	}
	var tokens []string
	for line := range strings.SplitSeq(v, "\n") {
		if t := strings.TrimSpace(line); t != "" {
			if len(t) < httpapi.MinControlTokenLen {
				return nil, fmt.Errorf("the control-plane token (%s or %s) is shorter than %d characters", EnvToken, EnvControlTokenSecretARN, httpapi.MinControlTokenLen)
			}
			tokens = append(tokens, t)
		}
	}
	return tokens, nil
}

// Signer returns the run-token signer over the signing key (EnvSigningKey,
// or the secret at EnvSigningKeySecretARN): hex, at least
// token.MinSecretLen bytes.
func (e *Env) Signer(ctx context.Context, now func() time.Time) (*token.Signer, error) {
	v, err := e.Secret(ctx, EnvSigningKey, EnvSigningKeySecretARN, "the run-token signing key")
	if err != nil {
		return nil, err
	}
	key, err := hex.DecodeString(v)
	if err != nil || len(key) < token.MinSecretLen {
		return nil, fmt.Errorf("the run-token signing key (%s or %s) must be at least %d hex-encoded bytes", EnvSigningKey, EnvSigningKeySecretARN, token.MinSecretLen)
	}
	return token.NewSigner(key, now)
}

// ModelKey returns the provider key's source: EnvModelAPIKey, or the
// secret at EnvModelAPIKeySecretARN (internal/modelprovider caches it and
// drops it when the provider answers 401). ok is false when neither is
// set, for a provider that takes no key (Bedrock). Only the modelproxy
// function calls it: it is the one reader of the provider key.
func (e *Env) ModelKey(ctx context.Context) (src secrets.Source, ok bool, err error) {
	if e.Get(EnvModelAPIKey) == "" && e.Get(EnvModelAPIKeySecretARN) == "" {
		return nil, false, nil
	}
	src, err = e.SecretSource(ctx, EnvModelAPIKey, EnvModelAPIKeySecretARN, "the model provider's key")
	return src, err == nil, err
}

// AWSConfig returns the default AWS configuration (the function role's
// credentials), for a client that builds its own (Bedrock's).
func (e *Env) AWSConfig(ctx context.Context) (aws.Config, error) { return e.config(ctx) }

// Lookup reads a variable the way os.LookupEnv does, for packages that
// read their own (internal/modelprovider).
func (e *Env) Lookup(name string) (string, bool) {
	v := e.Get(name)
	return v, v != ""
}

// Seconds reads a positive whole number of seconds, or def when unset.
func (e *Env) Seconds(name string, def time.Duration) (time.Duration, error) {
	n, err := e.Count(name, int(def/time.Second))
	if err != nil {
		return 0, fmt.Errorf("%w of seconds", err)
	}
	return time.Duration(n) * time.Second, nil
}

// Count reads a positive whole number, or def when unset.
func (e *Env) Count(name string, def int) (int, error) {
	v := e.Get(name)
	if v == "" {
		return def, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n <= 0 {
		return 0, fmt.Errorf("%s is %q; want a positive whole number", name, v)
	}
	return n, nil
}

// ErrNoProvider is the key source of functions that do not hold the
// provider key: every function but modelproxy.
var ErrNoProvider = errors.New("this function does not hold the provider key; model calls go to the modelproxy function")
