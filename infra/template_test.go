package main

import (
	"encoding/json"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/aws/aws-cdk-go/awscdk/v2/assertions"
	"github.com/aws/jsii-runtime-go"

	"github.com/belay-dev/belay/internal/hardening"
)

// These tests read the synthesized template (synth_test.go) with CDK's
// assertions module and, where a property spans resources (who may read
// what), with the template's JSON.

var (
	like  = assertions.Match_ObjectLike
	exact = assertions.Match_ObjectEquals
	with  = assertions.Match_ArrayWith
)

func TestSandboxTaskDefinitionIsMadeFromHardening(t *testing.T) {
	st := synthesized(t).token
	h := hardening.Sandbox
	logs := st.logicalID(t, "SandboxLogs/Resource")
	limit := func(name string, n int) map[string]any {
		return map[string]any{"Name": name, "SoftLimit": n, "HardLimit": n}
	}
	check(t, "sandbox task definition", func() {
		st.tpl.HasResourceProperties(jsii.String("AWS::ECS::TaskDefinition"), like(&map[string]any{
			"RequiresCompatibilities": []any{"FARGATE"},
			"NetworkMode":             "awsvpc",
			"Cpu":                     strconv.Itoa(h.CPUUnits),
			"Memory":                  strconv.Itoa(h.MemoryMiB),
			"EphemeralStorage":        map[string]any{"SizeInGiB": h.EphemeralStorageGiB},
			"RuntimePlatform":         map[string]any{"CpuArchitecture": "ARM64", "OperatingSystemFamily": "LINUX"},
			"Volumes":                 []any{map[string]any{"Name": volumeWorkspace}, map[string]any{"Name": volumeTmp}},
			"ContainerDefinitions": []any{like(&map[string]any{
				"Name":                   sandboxContainer,
				"Essential":              true,
				"EntryPoint":             h.Entrypoint,
				"User":                   fmt.Sprintf("%d:%d", h.UID, h.GID),
				"ReadonlyRootFilesystem": h.ReadOnlyRootFS,
				"Privileged":             false,
				// Every capability dropped, none added; an init process.
				"LinuxParameters": exact(&map[string]any{
					"Capabilities":       exact(&map[string]any{"Drop": []any{"ALL"}}),
					"InitProcessEnabled": h.InitProcess,
				}),
				"MountPoints": []any{
					map[string]any{"SourceVolume": volumeWorkspace, "ContainerPath": h.WorkspaceDir, "ReadOnly": false},
					map[string]any{"SourceVolume": volumeTmp, "ContainerPath": h.TmpDir, "ReadOnly": false},
				},
				"Ulimits": []any{
					limit("nproc", h.Processes), limit("nofile", h.OpenFiles), limit("fsize", h.FileSizeMiB<<20),
				},
				// Its own log group.
				"LogConfiguration": like(&map[string]any{
					"LogDriver": "awslogs",
					"Options":   like(&map[string]any{"awslogs-group": ref(logs)}),
				}),
				// No secret reaches the task's environment: its one
				// variable is the private API's URL; the claim comes as a
				// RunTask override.
				"Environment": []any{like(&map[string]any{"Name": "BELAY_API_URL"})},
				"Secrets":     assertions.Match_Absent(),
				"Image":       assertions.Match_AnyValue(),
			})},
		}))
	})
	// The log group is the sandbox's alone: no function logs to it.
	for id, fn := range st.resources("AWS::Lambda::Function") {
		if mentions(props(fn)["LoggingConfig"], logs) {
			t.Errorf("function %s logs to the sandbox's log group", id)
		}
	}
	// The image is pinned by digest: repository@<SandboxImageDigest>.
	td := props(st.resources("AWS::ECS::TaskDefinition")[st.logicalID(t, "SandboxTask/Resource")])
	img, _ := json.Marshal(td["ContainerDefinitions"].([]any)[0].(map[string]any)["Image"])
	if !strings.Contains(string(img), `"@",{"Ref":"SandboxImageDigest"}`) {
		t.Errorf("the image is not pinned by the SandboxImageDigest parameter: %s", img)
	}
	check(t, "digest parameter", func() {
		st.tpl.HasParameter(jsii.String("SandboxImageDigest"), like(&map[string]any{
			"Default": placeholderDigest, "AllowedPattern": "^sha256:[0-9a-f]{64}$",
		}))
	})
}

func TestNoECSExec(t *testing.T) {
	st := synthesized(t).token
	// The task role holds no SSM messages channel (ECS Exec's), and the
	// RunTask state never enables it (TestStateMachineDefinition).
	for _, stmt := range st.statementsOf(t, st.logicalID(t, "SandboxTaskRole/Resource")) {
		for _, a := range stmt.actions {
			if strings.HasPrefix(strings.ToLower(a), "ssmmessages:") || strings.HasPrefix(strings.ToLower(a), "ssm:") {
				t.Errorf("the task role may %s: ECS Exec would work", a)
			}
		}
	}
}

func TestSandboxSubnetsHaveNoRouteOut(t *testing.T) {
	st := synthesized(t).token
	for _, typ := range []string{"AWS::EC2::InternetGateway", "AWS::EC2::NatGateway", "AWS::EC2::EgressOnlyInternetGateway",
		"AWS::EC2::VPCGatewayAttachment", "AWS::EC2::TransitGatewayAttachment", "AWS::EC2::VPCPeeringConnection"} {
		check(t, typ, func() { st.tpl.ResourceCountIs(jsii.String(typ), jsii.Number(0)) })
	}
	subnets := st.resources("AWS::EC2::Subnet")
	if got, want := len(subnets), int(synthesized(t).token.s.cfg.AZCount); got != want {
		t.Errorf("%d sandbox subnets, want one per AZ (azCount=%d)", got, want)
	}
	tables := map[string]bool{}
	for _, a := range st.resources("AWS::EC2::SubnetRouteTableAssociation") {
		p := props(a)
		for id := range subnets {
			if mentions(p["SubnetId"], id) {
				tables[p["RouteTableId"].(map[string]any)["Ref"].(string)] = true
			}
		}
	}
	if len(tables) != len(subnets) {
		t.Fatalf("route tables of the sandbox subnets: %v", tables)
	}
	for id, r := range st.resources("AWS::EC2::Route") {
		p := props(r)
		for rt := range tables {
			if !mentions(p["RouteTableId"], rt) {
				continue
			}
			for _, k := range []string{"GatewayId", "NatGatewayId", "EgressOnlyInternetGatewayId", "TransitGatewayId",
				"VpcPeeringConnectionId", "InstanceId", "NetworkInterfaceId", "CarrierGatewayId", "LocalGatewayId"} {
				if _, ok := p[k]; ok {
					t.Errorf("route %s of sandbox route table %s goes out through %s", id, rt, k)
				}
			}
		}
	}
	// The S3 gateway endpoint is the one extra route of those tables.
	var gateways int
	for _, e := range st.resources("AWS::EC2::VPCEndpoint") {
		p := props(e)
		if p["VpcEndpointType"] == "Gateway" {
			gateways++
			for rt := range tables {
				if !mentions(p["RouteTableIds"], rt) {
					t.Errorf("the S3 gateway endpoint is not routed from %s", rt)
				}
			}
		}
	}
	if gateways != 1 {
		t.Errorf("%d gateway endpoints, want 1 (S3)", gateways)
	}
}

func TestVPCEndpoints(t *testing.T) {
	st := synthesized(t).token
	want := map[string]string{".ecr.api": "Interface", ".ecr.dkr": "Interface", ".logs": "Interface", ".execute-api": "Interface", ".s3": "Gateway"}
	got := map[string]string{}
	for id, e := range st.resources("AWS::EC2::VPCEndpoint") {
		p := props(e)
		name, _ := json.Marshal(p["ServiceName"])
		for suffix := range want {
			if strings.Contains(string(name), suffix+`"`) {
				got[suffix] = p["VpcEndpointType"].(string)
				if p["VpcEndpointType"] == "Interface" && p["PrivateDnsEnabled"] != true {
					t.Errorf("endpoint %s (%s) has no private DNS: the task would resolve the public service", id, suffix)
				}
				if p["PolicyDocument"] == nil {
					t.Errorf("endpoint %s (%s) has no policy: it would reach any account's resources", id, suffix)
				}
			}
		}
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("VPC endpoints %v, want %v", got, want)
	}
	// The sandbox's security group: nothing in, HTTPS out only.
	sg := st.logicalID(t, "SandboxSecurityGroup/Resource")
	p := props(st.resources("AWS::EC2::SecurityGroup")[sg])
	if p["SecurityGroupIngress"] != nil {
		t.Errorf("the sandbox security group admits traffic: %v", p["SecurityGroupIngress"])
	}
	egress := p["SecurityGroupEgress"].([]any)
	for _, r := range st.resources("AWS::EC2::SecurityGroupEgress") {
		if mentions(props(r)["GroupId"], sg) {
			egress = append(egress, props(r))
		}
	}
	for _, e := range egress {
		e := e.(map[string]any)
		if e["IpProtocol"] != "tcp" || fmt.Sprint(e["FromPort"]) != "443" || fmt.Sprint(e["ToPort"]) != "443" {
			t.Errorf("sandbox egress rule beyond TCP 443: %v", e)
		}
	}
}

func TestDataAtRest(t *testing.T) {
	st := synthesized(t).token
	check(t, "table", func() {
		st.tpl.HasResourceProperties(jsii.String("AWS::DynamoDB::Table"), like(&map[string]any{
			"BillingMode":                      "PAY_PER_REQUEST",
			"SSESpecification":                 like(&map[string]any{"SSEEnabled": true}),
			"PointInTimeRecoverySpecification": map[string]any{"PointInTimeRecoveryEnabled": true},
			"TimeToLiveSpecification":          map[string]any{"AttributeName": tableTTL, "Enabled": true},
			"KeySchema": []any{
				map[string]any{"AttributeName": tablePK, "KeyType": "HASH"},
				map[string]any{"AttributeName": tableSK, "KeyType": "RANGE"},
			},
		}))
	})
	check(t, "table retained", func() {
		st.tpl.HasResource(jsii.String("AWS::DynamoDB::Table"), like(&map[string]any{"DeletionPolicy": "Retain"}))
	})
	bucket := st.logicalID(t, "ArtifactBucket/Resource")
	days := st.s.cfg.ArtifactExpiryDays
	check(t, "artifact bucket", func() {
		st.tpl.HasResourceProperties(jsii.String("AWS::S3::Bucket"), like(&map[string]any{
			"PublicAccessBlockConfiguration": map[string]any{
				"BlockPublicAcls": true, "BlockPublicPolicy": true, "IgnorePublicAcls": true, "RestrictPublicBuckets": true,
			},
			"BucketEncryption": like(&map[string]any{"ServerSideEncryptionConfiguration": with(&[]any{
				like(&map[string]any{"ServerSideEncryptionByDefault": map[string]any{"SSEAlgorithm": "AES256"}}),
			})}),
			"LifecycleConfiguration": like(&map[string]any{"Rules": with(&[]any{
				like(&map[string]any{"ExpirationInDays": days, "Status": "Enabled"}),
			})}),
			"LoggingConfiguration": assertions.Match_AnyValue(),
		}))
	})
	// TLS only: the bucket policy refuses any request without it.
	check(t, "artifact bucket TLS only", func() {
		st.tpl.HasResourceProperties(jsii.String("AWS::S3::BucketPolicy"), like(&map[string]any{
			"Bucket": ref(bucket),
			"PolicyDocument": like(&map[string]any{"Statement": with(&[]any{like(&map[string]any{
				"Effect":    "Deny",
				"Condition": map[string]any{"Bool": map[string]any{"aws:SecureTransport": "false"}},
			})})}),
		}))
	})

	// The secrets: two generated, the provider key left for the operator,
	// and the repository events' three (webhook secret generated, git
	// credentials and GitHub token left for the operator); none holds a
	// value written in the template.
	secrets := st.resources("AWS::SecretsManager::Secret")
	if len(secrets) != 6 {
		t.Fatalf("%d secrets, want 6", len(secrets))
	}
	for id, s := range secrets {
		if _, ok := props(s)["SecretString"]; ok {
			t.Errorf("secret %s has its value in the template", id)
		}
	}
	gen := func(path string) map[string]any {
		g, _ := props(secrets[st.logicalID(t, path)])["GenerateSecretString"].(map[string]any)
		return g
	}
	if g := gen("SigningKey/Resource"); fmt.Sprint(g["PasswordLength"]) != "64" || g["ExcludeUppercase"] != true ||
		g["ExcludePunctuation"] != true || g["ExcludeCharacters"] != "ghijklmnopqrstuvwxyz" {
		t.Errorf("the signing key is not 64 hex digits (32 bytes): %v", g)
	}
	if g := gen("ControlToken/Resource"); fmt.Sprint(g["PasswordLength"]) != "48" {
		t.Errorf("the control-plane token generator: %v", g)
	}
}

func TestPublicAPIRoutes(t *testing.T) {
	for _, tc := range []struct {
		name string
		st   *synthStack
		auth string
	}{{"token", synthesized(t).token, "NONE"}, {"sigv4", synthesized(t).sigv4, "AWS_IAM"}} {
		t.Run(tc.name, func(t *testing.T) {
			st := tc.st
			api := st.logicalID(t, "PublicApi/Resource")
			apiFn, streamFn := st.logicalID(t, "Api/Resource"), st.logicalID(t, "Stream/Resource")
			paths := st.resourcePaths(api)
			var events int
			for id, m := range st.resources("AWS::ApiGateway::Method") {
				p := props(m)
				if !mentions(p["RestApiId"], api) {
					continue
				}
				path := paths[p["ResourceId"].(map[string]any)["Ref"].(string)]
				integ := p["Integration"].(map[string]any)
				if path == "/v1/webhooks/github" {
					continue // GitHub's signature is its credential (TestRepoEventFunctions)
				}
				if p["AuthorizationType"] != tc.auth {
					t.Errorf("%s %s: authorization %v, want %s", p["HttpMethod"], path, p["AuthorizationType"], tc.auth)
				}
				if path == "/v1/runs/{id}/events" || path == "/v1/sessions/{id}/events" {
					events++
					if p["HttpMethod"] != "GET" || integ["ResponseTransferMode"] != "STREAM" || !mentions(integ["Uri"], streamFn) ||
						!strings.Contains(fmt.Sprint(integ["Uri"]), "response-streaming-invocations") || fmt.Sprint(integ["TimeoutInMillis"]) != "900000" {
						t.Errorf("the events route is not streamed by the stream function for 15 minutes: %s %v", p["HttpMethod"], integ)
					}
					continue
				}
				if !strings.HasPrefix(path, "/v1") {
					t.Errorf("method %s on %s: belay serves only /v1", id, path)
				}
				if integ["ResponseTransferMode"] == "STREAM" || !mentions(integ["Uri"], apiFn) || integ["Type"] != "AWS_PROXY" {
					t.Errorf("%s %s is not a buffered proxy to the api function: %v", p["HttpMethod"], path, integ)
				}
			}
			if events != 2 {
				t.Errorf("%d events routes, want 2 (a run's and a session's)", events)
			}
			// Access logs and throttling on the stage.
			check(t, "public stage", func() {
				st.tpl.HasResourceProperties(jsii.String("AWS::ApiGateway::Stage"), like(&map[string]any{
					"RestApiId":        ref(api),
					"StageName":        publicStage,
					"AccessLogSetting": like(&map[string]any{"DestinationArn": assertions.Match_AnyValue(), "Format": assertions.Match_AnyValue()}),
					"MethodSettings": with(&[]any{like(&map[string]any{
						"HttpMethod": "*", "ResourcePath": "/*",
						"ThrottlingRateLimit":  st.s.cfg.ThrottleRate,
						"ThrottlingBurstLimit": st.s.cfg.ThrottleBurst,
					})}),
				}))
			})
			// Who the functions trust.
			for _, fn := range []string{apiFn, streamFn} {
				env := props(st.resources("AWS::Lambda::Function")[fn])["Environment"].(map[string]any)["Variables"].(map[string]any)
				_, hasToken := env[envControlTokenARN]
				if env[envAuth] != st.s.cfg.Auth || hasToken != (st.s.cfg.Auth == authToken) {
					t.Errorf("function %s: %s=%v, control token secret set: %v", fn, envAuth, env[envAuth], hasToken)
				}
			}
			// The operator's additions to the run limits, on every function
			// (they are read with BELAY_MODEL), and only when set.
			for id, fn := range st.resources("AWS::Lambda::Function") {
				vars, _ := props(fn)["Environment"].(map[string]any)
				env, _ := vars["Variables"].(map[string]any)
				if env[envModel] == nil {
					continue // not one of belay's functions
				}
				for name, want := range map[string]string{envExtensions: st.s.cfg.Extensions, envChecks: st.s.cfg.Checks} {
					if got, set := env[name]; set != (want != "") || set && got != want {
						t.Errorf("function %s: %s=%v, want %q", id, name, got, want)
					}
				}
			}
			policies := st.resources("AWS::IAM::ManagedPolicy")
			if (len(policies) == 1) != (st.s.cfg.Auth == authSigV4) {
				t.Errorf("caller policy present: %d, auth %s", len(policies), st.s.cfg.Auth)
			}
		})
	}
}

func TestPrivateAPI(t *testing.T) {
	st := synthesized(t).token
	api := st.logicalID(t, "PrivateApi/Resource")
	vpce := st.logicalID(t, "ExecuteApiEndpoint/Resource")
	check(t, "private API", func() {
		st.tpl.HasResourceProperties(jsii.String("AWS::ApiGateway::RestApi"), like(&map[string]any{
			"EndpointConfiguration": map[string]any{"Types": []any{"PRIVATE"}, "VpcEndpointIds": []any{ref(vpce)}},
			"Policy": like(&map[string]any{"Statement": []any{
				like(&map[string]any{"Effect": "Allow", "Action": "execute-api:Invoke",
					"Condition": map[string]any{"StringEquals": map[string]any{"aws:SourceVpce": ref(vpce)}}}),
				like(&map[string]any{"Effect": "Deny", "Action": "execute-api:Invoke",
					"Condition": map[string]any{"StringNotEquals": map[string]any{"aws:SourceVpce": ref(vpce)}}}),
			}}),
		}))
	})
	model, sandboxAPI := st.logicalID(t, "ModelProxy/Resource"), st.logicalID(t, "SandboxApi/Resource")
	paths := st.resourcePaths(api)
	routes := map[string]string{}
	for _, m := range st.resources("AWS::ApiGateway::Method") {
		p := props(m)
		if !mentions(p["RestApiId"], api) {
			continue
		}
		path := paths[p["ResourceId"].(map[string]any)["Ref"].(string)]
		integ := p["Integration"].(map[string]any)
		switch {
		case mentions(integ["Uri"], model):
			// The model route streams: a long model call outlasts 29 s.
			if integ["ResponseTransferMode"] != "STREAM" || fmt.Sprint(integ["TimeoutInMillis"]) != "900000" {
				t.Errorf("the model route has no room for a long call: %v", integ)
			}
			routes[p["HttpMethod"].(string)+" "+path] = fnModelProxy
		case mentions(integ["Uri"], sandboxAPI):
			routes[p["HttpMethod"].(string)+" "+path] = fnSandboxAPI
		default:
			t.Errorf("private route %s %s goes to neither modelproxy nor sandboxapi", p["HttpMethod"], path)
		}
	}
	want := map[string]string{"POST /internal/v1/chat/completions": fnModelProxy, "ANY /internal/v1/{proxy+}": fnSandboxAPI}
	if fmt.Sprint(routes) != fmt.Sprint(want) {
		t.Errorf("private routes %v, want %v", routes, want)
	}
}

// resourcePaths maps the API's resources to their paths.
func (st *synthStack) resourcePaths(api string) map[string]string {
	res := st.resources("AWS::ApiGateway::Resource")
	var path func(id string) string
	path = func(id string) string {
		p := props(res[id])
		parent := p["ParentId"]
		if m, ok := parent.(map[string]any); ok {
			if r, ok := m["Ref"].(string); ok {
				return path(r) + "/" + p["PathPart"].(string)
			}
		}
		return "/" + p["PathPart"].(string) // the parent is the API's root
	}
	out := map[string]string{}
	for id, r := range res {
		if mentions(props(r)["RestApiId"], api) {
			out[id] = path(id)
		}
	}
	return out
}

// statement is one IAM statement of a role's identity policies.
type statement struct {
	policy    string
	effect    string
	actions   []string
	resources []any
}

// statementsOf returns every identity-policy statement that applies to the
// role: inline policies, AWS::IAM::Policy resources attached to it, and
// managed policies of the stack attached to it.
func (st *synthStack) statementsOf(tb testing.TB, role string) []statement {
	tb.Helper()
	var out []statement
	add := func(policy string, doc any) {
		stmts, _ := doc.(map[string]any)["Statement"].([]any)
		for _, s := range stmts {
			s := s.(map[string]any)
			out = append(out, statement{policy: policy, effect: s["Effect"].(string), actions: stringsOf(s["Action"]), resources: listOf(s["Resource"])})
		}
	}
	r := st.resources("AWS::IAM::Role")[role]
	if r == nil {
		tb.Fatalf("no role %s", role)
	}
	for _, p := range listOf(props(r)["Policies"]) {
		add(role+" inline", p.(map[string]any)["PolicyDocument"])
	}
	if arns := listOf(props(r)["ManagedPolicyArns"]); len(arns) > 0 {
		for _, a := range arns {
			if b, _ := json.Marshal(a); !strings.Contains(string(b), "ManagedPolicy") {
				tb.Errorf("role %s has an AWS managed policy %s", role, b)
			}
		}
	}
	for id, p := range st.resources("AWS::IAM::Policy") {
		if mentions(props(p)["Roles"], role) {
			add(id, props(p)["PolicyDocument"])
		}
	}
	for id, p := range st.resources("AWS::IAM::ManagedPolicy") {
		if mentions(props(p)["Roles"], role) {
			add(id, props(p)["PolicyDocument"])
		}
	}
	return out
}

func stringsOf(v any) []string {
	var out []string
	for _, x := range listOf(v) {
		out = append(out, fmt.Sprint(x))
	}
	return out
}

func listOf(v any) []any {
	switch v := v.(type) {
	case nil:
		return nil
	case []any:
		return v
	}
	return []any{v}
}

func TestOnlyModelProxyReadsTheProviderKey(t *testing.T) {
	for _, st := range []*synthStack{synthesized(t).token, synthesized(t).sigv4} {
		key := st.logicalID(t, "ProviderKey/Resource")
		modelRole := st.logicalID(t, "ModelProxyRole/Resource")
		var readers []string
		for role := range st.resources("AWS::IAM::Role") {
			for _, s := range st.statementsOf(t, role) {
				if s.effect != "Allow" || !slices.ContainsFunc(s.actions, func(a string) bool {
					return strings.HasPrefix(a, "secretsmanager:") || a == "*"
				}) {
					continue
				}
				for _, r := range s.resources {
					if mentions(r, key) || r == "*" || strings.Contains(fmt.Sprint(r), "secret:*") {
						readers = append(readers, role)
					}
				}
			}
		}
		slices.Sort(readers)
		if !slices.Equal(slices.Compact(readers), []string{modelRole}) {
			t.Errorf("%s: roles that can read the provider key: %v, want only modelproxy's %s", *st.s.stack.StackName(), readers, modelRole)
		}
	}
}

func TestTaskRoleReachesOnlyThePrivateAPI(t *testing.T) {
	st := synthesized(t).token
	role := st.logicalID(t, "SandboxTaskRole/Resource")
	stmts := st.statementsOf(t, role)
	if len(stmts) == 0 {
		t.Fatal("the task role has no statement: the test would pass on nothing")
	}
	private := st.logicalID(t, "PrivateApi/Resource")
	for _, s := range stmts {
		for _, a := range s.actions {
			a = strings.ToLower(a)
			for _, banned := range []string{"secretsmanager:", "dynamodb:", "states:", "s3:", "kms:", "ssm:", "ssmmessages:", "iam:", "ecs:", "lambda:"} {
				if strings.HasPrefix(a, banned) || a == "*" || strings.HasSuffix(a, ":*") {
					t.Errorf("the task role may %s (%s)", a, s.policy)
				}
			}
			if a != "execute-api:invoke" {
				t.Errorf("the task role may %s; want execute-api:Invoke only", a)
			}
		}
		for _, r := range s.resources {
			if !mentions(r, private) {
				t.Errorf("the task role reaches %v, not the private API", r)
			}
		}
	}
	// Its trust: ECS tasks of this account only.
	check(t, "task role trust", func() {
		st.tpl.HasResourceProperties(jsii.String("AWS::IAM::Role"), like(&map[string]any{
			"AssumeRolePolicyDocument": like(&map[string]any{"Statement": []any{like(&map[string]any{
				"Principal": map[string]any{"Service": "ecs-tasks.amazonaws.com"},
				"Condition": map[string]any{"StringEquals": map[string]any{"aws:SourceAccount": ref("AWS::AccountId")}},
			})}}),
			"Description": assertions.Match_StringLikeRegexp(jsii.String("sandbox task")),
		}))
	})
}

// noResourceLevel are the actions that have no resource-level permission:
// only for these may a statement's resource be "*".
var noResourceLevel = map[string]bool{
	"ecr:GetAuthorizationToken": true,
	"dynamodb:ListStreams":      true,
	"logs:CreateLogDelivery":    true, "logs:GetLogDelivery": true, "logs:UpdateLogDelivery": true, "logs:DeleteLogDelivery": true,
	"logs:ListLogDeliveries": true, "logs:PutResourcePolicy": true, "logs:DescribeResourcePolicies": true, "logs:DescribeLogGroups": true,
	"xray:PutTraceSegments": true, "xray:PutTelemetryRecords": true, "xray:GetSamplingRules": true, "xray:GetSamplingTargets": true,
}

// narrowWildcards are the ARN patterns with a wildcard that the stack
// uses, each because the rest of the name is known only at run time.
var narrowWildcards = []*regexp.Regexp{
	regexp.MustCompile(`/runs/\*"`),                 // artifacts runs/<runId>/<name>
	regexp.MustCompile(`:execution:\$\{Name\}:\*"`), // executions named by run id
	regexp.MustCompile(`:task/\$\{Cluster\}/\*"`),   // the cluster's tasks
	regexp.MustCompile(`"/\*/internal/\*"`),         // the private API's internal routes
	regexp.MustCompile(`/prod/\*/v1/\*"`),           // the public API's routes (the sigv4 caller policy)
	regexp.MustCompile(`starport-layer-bucket/\*"`), // ECR's layers (S3 endpoint policy)
	regexp.MustCompile(`"/v1/\*/@connections/\*"`),  // the sessions' WebSocket connections (ids known only on connect)
	regexp.MustCompile(`:\$\{AWS::AccountId\}:\*"`), // execute-api endpoint: this account's APIs
}

func TestNoWildcardWhereANarrowerResourceExists(t *testing.T) {
	for _, st := range []*synthStack{synthesized(t).token, synthesized(t).sigv4} {
		docs := map[string]any{}
		for id, p := range st.resources("AWS::IAM::Policy") {
			docs[id] = props(p)["PolicyDocument"]
		}
		for id, p := range st.resources("AWS::IAM::ManagedPolicy") {
			docs[id] = props(p)["PolicyDocument"]
		}
		for id, e := range st.resources("AWS::EC2::VPCEndpoint") {
			docs[id] = props(e)["PolicyDocument"]
		}
		for id, r := range st.resources("AWS::IAM::Role") {
			for _, p := range listOf(props(r)["Policies"]) {
				docs[id] = p.(map[string]any)["PolicyDocument"]
			}
		}
		for id, doc := range docs {
			if doc == nil {
				continue
			}
			for _, s := range listOf(doc.(map[string]any)["Statement"]) {
				s := s.(map[string]any)
				if s["Effect"] != "Allow" {
					continue
				}
				actions := stringsOf(s["Action"])
				for _, a := range actions {
					if strings.Contains(a, "*") {
						t.Errorf("%s: action %q is a wildcard", id, a)
					}
				}
				for _, r := range listOf(s["Resource"]) {
					if r == "*" {
						for _, a := range actions {
							if !noResourceLevel[a] {
								t.Errorf("%s: %s on \"*\", but it takes a resource", id, a)
							}
						}
						continue
					}
					b, _ := json.Marshal(r)
					if !strings.Contains(string(b), "*") {
						continue
					}
					if !slices.ContainsFunc(narrowWildcards, func(re *regexp.Regexp) bool { return re.Match(b) }) {
						t.Errorf("%s: resource %s has a wildcard no test accounts for", id, b)
					}
				}
			}
		}
	}
}
