package main

import (
	"github.com/aws/aws-cdk-go/awscdk/v2"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsapigateway"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsec2"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsiam"
	"github.com/aws/aws-cdk-go/awscdk/v2/awslambda"
	"github.com/aws/aws-cdk-go/awscdk/v2/awslogs"
	"github.com/aws/jsii-runtime-go"
)

// The stages: the public API's URL ends in /prod, the private API's in
// /internal; routes then start with /v1 and /internal/v1 as in the
// embedded server.
const (
	publicStage  = "prod"
	privateStage = "internal"
)

// streamTimeout is how long API Gateway keeps a streamed response open:
// REST response streaming's limit. The stream function closes the event
// stream before it (DESIGN.md "Time limits"). A function, not a package
// variable: a jsii call at package init would start the jsii runtime before
// main (or a test) picks its Node.
func streamTimeout() awscdk.Duration { return awscdk.Duration_Minutes(jsii.Number(15)) }

// api builds the two REST APIs.
//
// The public API (regional): the event stream routes of runs and sessions,
// streamed, to the stream function; every other /v1 route, buffered, to
// the api function.
// Callers present the control-plane token (checked by the functions), or,
// with -c auth=sigv4, an AWS signature that API Gateway checks (IAM).
//
// The private API: the internal routes the sandbox calls, reachable only
// through the VPC's execute-api endpoint (its resource policy refuses any
// other source). The model route goes to modelproxy, the rest to
// sandboxapi; both authenticate the sandbox by its claim and run tokens.
func (s *belayStack) api() {
	auth := awsapigateway.AuthorizationType_NONE
	if s.cfg.Auth == authSigV4 {
		auth = awsapigateway.AuthorizationType_IAM
	}
	s.publicAPI = awsapigateway.NewRestApi(s.stack, jsii.String("PublicApi"), &awsapigateway.RestApiProps{
		RestApiName:           jsii.String("belay"),
		Description:           jsii.String("belay public API (DESIGN.md API contract v1)"),
		EndpointConfiguration: &awsapigateway.EndpointConfiguration{Types: &[]awsapigateway.EndpointType{awsapigateway.EndpointType_REGIONAL}},
		DeployOptions:         s.stageOptions("PublicApiAccessLogs", publicStage),
		CloudWatchRole:        jsii.Bool(false),
		DefaultMethodOptions: &awsapigateway.MethodOptions{
			AuthorizationType: auth,
		},
	})
	s.requestValidator(s.publicAPI)
	s.gatewayResponses(s.publicAPI, "Public")

	buffered := awsapigateway.NewLambdaIntegration(s.fns[fnAPI], &awsapigateway.LambdaIntegrationOptions{})
	streamed := awsapigateway.NewLambdaIntegration(s.fns[fnStream], &awsapigateway.LambdaIntegrationOptions{
		ResponseTransferMode: awsapigateway.ResponseTransferMode_STREAM,
		Timeout:              streamTimeout(),
	})
	// API Gateway matches the most specific resource and never falls back
	// to a greedy one, so each resource on the way to the streamed route
	// also gets ANY → api.
	v1 := s.publicAPI.Root().AddResource(jsii.String("v1"), nil)
	v1.AddProxy(&awsapigateway.ProxyResourceOptions{DefaultIntegration: buffered, AnyMethod: jsii.Bool(true)})
	runs := v1.AddResource(jsii.String("runs"), nil)
	runs.AddMethod(jsii.String("ANY"), buffered, nil)
	run := runs.AddResource(jsii.String("{id}"), nil)
	run.AddMethod(jsii.String("ANY"), buffered, nil)
	run.AddProxy(&awsapigateway.ProxyResourceOptions{DefaultIntegration: buffered, AnyMethod: jsii.Bool(true)})
	run.AddResource(jsii.String("events"), nil).AddMethod(jsii.String("GET"), streamed, nil)
	sessions := v1.AddResource(jsii.String("sessions"), nil)
	sessions.AddMethod(jsii.String("ANY"), buffered, nil)
	sess := sessions.AddResource(jsii.String("{id}"), nil)
	sess.AddMethod(jsii.String("ANY"), buffered, nil)
	sess.AddProxy(&awsapigateway.ProxyResourceOptions{DefaultIntegration: buffered, AnyMethod: jsii.Bool(true)})
	sess.AddResource(jsii.String("events"), nil).AddMethod(jsii.String("GET"), streamed, nil)

	if s.cfg.Auth == authSigV4 {
		// Attach this policy to the roles (or groups) allowed to call belay.
		s.callerPolicy = awsiam.NewManagedPolicy(s.stack, jsii.String("CallerPolicy"), &awsiam.ManagedPolicyProps{
			Description: jsii.String("belay: call the public API (attach to the identities that use the belay CLI with BELAY_AUTH=sigv4)"),
			Statements: &[]awsiam.PolicyStatement{awsiam.NewPolicyStatement(&awsiam.PolicyStatementProps{
				Actions:   jsii.Strings("execute-api:Invoke"),
				Resources: &[]*string{s.publicAPI.ArnForExecuteApi(jsii.String("*"), jsii.String("/v1/*"), jsii.String(publicStage))},
			})},
		})
	}

	vpce := s.executeAPIVpce.VpcEndpointId()
	policy := awsiam.NewPolicyDocument(&awsiam.PolicyDocumentProps{
		Statements: &[]awsiam.PolicyStatement{
			awsiam.NewPolicyStatement(&awsiam.PolicyStatementProps{
				Sid:        jsii.String("FromTheSandboxEndpoint"),
				Principals: &[]awsiam.IPrincipal{awsiam.NewAnyPrincipal()},
				Actions:    jsii.Strings("execute-api:Invoke"),
				Resources:  jsii.Strings("execute-api:/*"),
				Conditions: &map[string]any{"StringEquals": map[string]any{"aws:SourceVpce": vpce}},
			}),
			awsiam.NewPolicyStatement(&awsiam.PolicyStatementProps{
				Sid:        jsii.String("NothingElse"),
				Effect:     awsiam.Effect_DENY,
				Principals: &[]awsiam.IPrincipal{awsiam.NewAnyPrincipal()},
				Actions:    jsii.Strings("execute-api:Invoke"),
				Resources:  jsii.Strings("execute-api:/*"),
				Conditions: &map[string]any{"StringNotEquals": map[string]any{"aws:SourceVpce": vpce}},
			}),
		},
	})
	s.privateAPI = awsapigateway.NewRestApi(s.stack, jsii.String("PrivateApi"), &awsapigateway.RestApiProps{
		RestApiName: jsii.String("belay-internal"),
		Description: jsii.String("belay internal routes, for the sandbox tasks only (through the VPC's execute-api endpoint)"),
		EndpointConfiguration: &awsapigateway.EndpointConfiguration{
			Types:        &[]awsapigateway.EndpointType{awsapigateway.EndpointType_PRIVATE},
			VpcEndpoints: &[]awsec2.IVpcEndpoint{s.executeAPIVpce},
		},
		Policy:         policy,
		DeployOptions:  s.stageOptions("PrivateApiAccessLogs", privateStage),
		CloudWatchRole: jsii.Bool(false),
	})
	s.requestValidator(s.privateAPI)
	s.gatewayResponses(s.privateAPI, "Private")
	internal := s.privateAPI.Root().AddResource(jsii.String("internal"), nil).AddResource(jsii.String("v1"), nil)
	internal.AddProxy(&awsapigateway.ProxyResourceOptions{
		DefaultIntegration: awsapigateway.NewLambdaIntegration(s.fns[fnSandboxAPI], nil),
		AnyMethod:          jsii.Bool(true),
	})
	internal.AddResource(jsii.String("chat"), nil).AddResource(jsii.String("completions"), nil).
		AddMethod(jsii.String("POST"), s.modelIntegration(s.fns[fnModelProxy]), nil)
}

// modelIntegration is the model route's integration: a model call with
// 4,096 tokens of output can outlast a buffered route's 29 seconds, so the
// route streams the function's answer, which REST APIs keep open for up to
// 15 minutes.
func (s *belayStack) modelIntegration(fn awslambda.Function) awsapigateway.Integration {
	return awsapigateway.NewLambdaIntegration(fn, &awsapigateway.LambdaIntegrationOptions{
		ResponseTransferMode: awsapigateway.ResponseTransferMode_STREAM,
		Timeout:              streamTimeout(),
	})
}

// privateAPIBaseURL is BELAY_API_URL for the sandbox task:
// https://<id>.execute-api.<region>.<suffix>/<stage>, without a trailing
// slash (the entry appends /internal/v1/...).
func (s *belayStack) privateAPIBaseURL() *string {
	return awscdk.Fn_Sub(jsii.String("https://${Api}.execute-api.${AWS::Region}.${AWS::URLSuffix}/"+privateStage),
		&map[string]*string{"Api": s.privateAPI.RestApiId()})
}

// stageOptions: JSON access logs of every request to a log group of the
// API's own, and throttling of every method.
func (s *belayStack) stageOptions(logsID, stage string) *awsapigateway.StageOptions {
	logs := awslogs.NewLogGroup(s.stack, jsii.String(logsID), &awslogs.LogGroupProps{
		Retention:     retention(s.cfg.LogRetentionDays),
		RemovalPolicy: awscdk.RemovalPolicy_DESTROY,
	})
	return &awsapigateway.StageOptions{
		StageName:            jsii.String(stage),
		AccessLogDestination: awsapigateway.NewLogGroupLogDestination(logs),
		AccessLogFormat: awsapigateway.AccessLogFormat_JsonWithStandardFields(&awsapigateway.JsonWithStandardFieldProps{
			Caller: jsii.Bool(true), HttpMethod: jsii.Bool(true), Ip: jsii.Bool(true), Protocol: jsii.Bool(true),
			RequestTime: jsii.Bool(true), ResourcePath: jsii.Bool(true), ResponseLength: jsii.Bool(true),
			Status: jsii.Bool(true), User: jsii.Bool(true),
		}),
		ThrottlingRateLimit:  jsii.Number(float64(s.cfg.ThrottleRate)),
		ThrottlingBurstLimit: jsii.Number(float64(s.cfg.ThrottleBurst)),
		TracingEnabled:       jsii.Bool(false),
	}
}

// requestValidator checks required parameters at the gateway; bodies are
// validated, field by field, by the handler.
func (s *belayStack) requestValidator(api awsapigateway.RestApi) {
	api.AddRequestValidator(jsii.String("Validator"), &awsapigateway.RequestValidatorOptions{
		ValidateRequestBody:       jsii.Bool(true),
		ValidateRequestParameters: jsii.Bool(true),
	})
}

// gatewayResponses make the answers API Gateway gives by itself (unknown
// route, refused signature, throttling, a too large body, a timed-out
// integration) belay's error shape {"error": {"code", "message",
// "requestId"}}, with the stable codes the client maps back.
func (s *belayStack) gatewayResponses(api awsapigateway.RestApi, prefix string) {
	body := func(code string) *map[string]*string {
		return &map[string]*string{"application/json": jsii.String(
			`{"error":{"code":"` + code + `","message":$context.error.messageString,"requestId":"$context.requestId"}}`)}
	}
	// Under IAM auth an unsigned request also gets MISSING_AUTHENTICATION_TOKEN;
	// without it, that answer can only mean an unknown route.
	missing := struct{ status, code string }{"404", "not_found"}
	if s.cfg.Auth == authSigV4 {
		missing = struct{ status, code string }{"403", "unauthorized"}
	}
	for _, r := range []struct {
		id     string
		typ    awsapigateway.ResponseType
		status string
		code   string
	}{
		{"MissingRoute", awsapigateway.ResponseType_MISSING_AUTHENTICATION_TOKEN(), missing.status, missing.code},
		{"AccessDenied", awsapigateway.ResponseType_ACCESS_DENIED(), "403", "forbidden"},
		{"Unauthorized", awsapigateway.ResponseType_UNAUTHORIZED(), "401", "unauthorized"},
		{"BadSignature", awsapigateway.ResponseType_INVALID_SIGNATURE(), "401", "unauthorized"},
		{"Throttled", awsapigateway.ResponseType_THROTTLED(), "429", "unavailable"},
		{"TooLarge", awsapigateway.ResponseType_REQUEST_TOO_LARGE(), "413", "too_large"},
		{"Timeout", awsapigateway.ResponseType_INTEGRATION_TIMEOUT(), "504", "unavailable"},
		{"Default4xx", awsapigateway.ResponseType_DEFAULT_4XX(), "", "invalid"},
		{"Default5xx", awsapigateway.ResponseType_DEFAULT_5XX(), "", "internal"},
	} {
		opts := &awsapigateway.GatewayResponseOptions{Type: r.typ, Templates: body(r.code)}
		if r.status != "" {
			opts.StatusCode = jsii.String(r.status)
		}
		api.AddGatewayResponse(jsii.String(prefix+r.id), opts)
	}
}
