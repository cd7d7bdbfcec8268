// Package bedrock is the model proxy's provider for Amazon Bedrock's
// Converse API, through aws-sdk-go-v2's bedrockruntime client. The sandbox
// keeps speaking chat completions; Request and Completion translate (pure
// functions, see their rules), and Provider sends one call signed with
// SigV4 by the caller's AWS credentials: the Lambda's IAM role on AWS, the
// default credential chain on one machine. There is no provider key at
// all: a Bedrock API key in AWS_BEARER_TOKEN_BEDROCK is ignored, and the
// SDK never retries (the run paid for one call).
package bedrock

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awsmiddleware "github.com/aws/aws-sdk-go-v2/aws/middleware"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	awsconfig "github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/bedrockruntime"
	"github.com/aws/smithy-go"
	"github.com/aws/smithy-go/logging"

	"github.com/belay-dev/belay/internal/upstream"
)

// SigningName is the SigV4 service name of Bedrock's runtime API.
const SigningName = "bedrock"

// msgNoCredentials is the caller's message when no AWS credentials could be
// had; the log gets why.
const msgNoCredentials = "the AWS credentials for Bedrock are unavailable"

// Config configures the provider.
type Config struct {
	// Region is the AWS region of the Bedrock runtime; when empty, the AWS
	// configuration's (AWS_REGION, a profile's region).
	Region string
	// Endpoint overrides the runtime's endpoint (a VPC endpoint's DNS
	// name, or a loopback test server with AllowLoopbackHTTP); empty
	// means the region's public endpoint.
	Endpoint          string
	AllowLoopbackHTTP bool
	// AWS is the AWS configuration whose credentials sign the calls; nil
	// loads the default one (environment, shared files, the Lambda's or
	// instance's role).
	AWS *aws.Config
	// Client sends the calls; nil means a client of its own. Redirects are
	// never followed.
	Client *http.Client
	// Logger receives the SDK's own log lines; nil discards them.
	Logger *slog.Logger
	// Now stamps the answers' "created"; nil means time.Now.
	Now func() time.Time
}

// Provider sends chat-completions calls to Bedrock's Converse API.
type Provider struct {
	client *bedrockruntime.Client
	creds  aws.CredentialsProvider
	region string
	now    func() time.Time
}

// New checks cfg, loads the default AWS configuration when cfg.AWS is nil,
// and builds the client. It fails without a region; missing credentials
// are found at the first call (they may come later, from a role).
func New(ctx context.Context, cfg Config) (*Provider, error) {
	if cfg.Endpoint != "" {
		if err := upstream.ValidateBaseURL(cfg.Endpoint, cfg.AllowLoopbackHTTP); err != nil {
			return nil, fmt.Errorf("bedrock endpoint: %w", err)
		}
	}
	var ac aws.Config
	if cfg.AWS != nil {
		ac = cfg.AWS.Copy()
	} else {
		loaded, err := awsconfig.LoadDefaultConfig(ctx)
		if err != nil {
			return nil, fmt.Errorf("load the default AWS configuration: %w", err)
		}
		ac = loaded
	}
	if cfg.Region != "" {
		ac.Region = cfg.Region
	}
	if ac.Region == "" {
		return nil, errors.New("no AWS region for Bedrock")
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	p := &Provider{creds: ac.Credentials, region: ac.Region, now: cfg.Now}
	base := cfg.Client
	if bc, ok := ac.HTTPClient.(*awshttp.BuildableClient); ok && base == nil {
		// The configuration's transport carries AWS_CA_BUNDLE and the
		// proxy settings; keep them under the provider's tracking.
		base = &http.Client{Transport: bc.GetTransport(), Timeout: bc.GetTimeout()}
	}
	p.client = bedrockruntime.NewFromConfig(ac, func(o *bedrockruntime.Options) {
		// Set per service, never on the configuration: with AWS_CA_BUNDLE
		// set, a client given to the configuration is refused.
		o.HTTPClient = upstream.NewHTTPClient(base)
		// One attempt, whatever AWS_MAX_ATTEMPTS or a profile says.
		o.Retryer = aws.NopRetryer{}
		o.RetryMaxAttempts = 0
		// SigV4 with the IAM credentials only: a Bedrock API key
		// (AWS_BEARER_TOKEN_BEDROCK) is a key, and belay keeps keys out
		// of this path.
		o.BearerAuthTokenProvider = nil
		o.AuthSchemePreference = []string{"sigv4"}
		if cfg.Endpoint != "" {
			o.BaseEndpoint = aws.String(cfg.Endpoint)
		}
		if cfg.Logger != nil {
			o.Logger = sdkLogger(cfg.Logger)
		}
	})
	return p, nil
}

// Region returns the region the provider calls.
func (p *Provider) Region() string { return p.region }

// Complete translates the call, sends it signed, and translates the answer
// back.
func (p *Provider) Complete(ctx context.Context, call upstream.Call) ([]byte, error) {
	chat, err := upstream.ParseChatRequest(call.Body)
	if err != nil {
		return nil, err
	}
	in, err := Request(chat)
	if err != nil {
		return nil, err
	}
	// The credentials first, so a missing role or chain is said as such
	// (nothing is sent without them); the SDK then reuses the cached set.
	if p.creds == nil {
		return nil, upstream.KeyUnavailable(msgNoCredentials, errors.New("no credentials provider"))
	}
	creds, err := p.creds.Retrieve(ctx)
	if err != nil {
		return nil, upstream.KeyUnavailable(msgNoCredentials, err)
	}
	if creds.AccessKeyID == "" || creds.SecretAccessKey == "" {
		return nil, upstream.KeyUnavailable(msgNoCredentials, errors.New("anonymous or empty credentials"))
	}
	limit := call.Limit()
	tracked, x := upstream.Track(ctx, limit)
	out, err := p.client.Converse(tracked, in)
	status := x.Status()
	switch {
	case x.Exceeded():
		return nil, upstream.TooLarge(status, limit)
	case status != 0 && (status < 200 || status > 299):
		return nil, upstream.StatusError(status, apiDetail(err))
	case status == 0:
		if err == nil {
			err = errors.New("no answer")
		}
		// No answer came, so the error holds no body; the SDK's text names
		// the operation and the URL.
		return nil, upstream.Unreachable(err)
	case err != nil || out == nil:
		if !upstream.IsJSONObject(x.Body()) {
			return nil, upstream.NotJSON(status)
		}
		return nil, upstream.Malformed(status, fmt.Errorf("decode the Converse answer: %T", err))
	}
	id, _ := awsmiddleware.GetRequestIDMetadata(out.ResultMetadata)
	if id == "" {
		id = randomID()
	}
	c, err := Completion(out, "chatcmpl-bedrock-"+id, chat.Model, p.now())
	if err != nil {
		return nil, upstream.Malformed(status, err)
	}
	return c.Answer(status, limit)
}

// apiDetail is what the log may say of a Bedrock error: its code (such as
// ThrottlingException) and request id, never its message.
func apiDetail(err error) error {
	var detail string
	if e, ok := errors.AsType[smithy.APIError](err); ok {
		detail = "bedrock error " + e.ErrorCode()
	}
	if e, ok := errors.AsType[*awshttp.ResponseError](err); ok && e.ServiceRequestID() != "" {
		detail += ", request id " + e.ServiceRequestID()
	}
	if detail == "" {
		return nil
	}
	return errors.New(detail)
}

func randomID() string {
	var b [12]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// sdkLogger sends the SDK's own log lines to log as warnings.
func sdkLogger(log *slog.Logger) logging.Logger {
	return logging.LoggerFunc(func(c logging.Classification, format string, v ...any) {
		level := slog.LevelWarn
		if c == logging.Debug {
			level = slog.LevelDebug
		}
		log.Log(context.Background(), level, "aws sdk: "+fmt.Sprintf(format, v...))
	})
}
