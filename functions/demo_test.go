package functions_test

import (
	"bytes"
	"context"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/events"

	"github.com/belay-dev/belay/internal/awstest"
	"github.com/belay-dev/belay/internal/belay"
	"github.com/belay-dev/belay/internal/rie"
	"github.com/belay-dev/belay/internal/sandbox/workspace/workspacetest"
	"github.com/belay-dev/belay/internal/scriptedmodel"
	"github.com/belay-dev/belay/internal/sfn"
	"github.com/belay-dev/belay/internal/wire"
)

// capacityMeter sits between the functions and DynamoDB Local: it asks for
// ReturnConsumedCapacity TOTAL on every call and adds up what DynamoDB
// Local reports, by operation, as read or write units.
type capacityMeter struct {
	mu    sync.Mutex
	read  float64
	write float64
	calls map[string]int
}

var readOps = map[string]bool{"GetItem": true, "Query": true, "Scan": true, "BatchGetItem": true, "TransactGetItems": true}

func startMeter(tb testing.TB, target string) (*capacityMeter, string) {
	tb.Helper()
	m := &capacityMeter{calls: map[string]int{}}
	u, err := url.Parse(target)
	if err != nil {
		tb.Fatal(err)
	}
	proxy := &httputil.ReverseProxy{}
	proxy.Rewrite = func(pr *httputil.ProxyRequest) {
		pr.SetURL(u)
		pr.Out.Host = u.Host
		r := pr.Out
		body, _ := io.ReadAll(r.Body)
		var doc map[string]any
		if json.Unmarshal(body, &doc) == nil {
			op := strings.TrimPrefix(r.Header.Get("X-Amz-Target"), "DynamoDB_20120810.")
			switch op {
			case "GetItem", "Query", "Scan", "BatchGetItem", "TransactGetItems",
				"PutItem", "UpdateItem", "DeleteItem", "BatchWriteItem", "TransactWriteItems":
				doc["ReturnConsumedCapacity"] = "TOTAL"
				body, _ = json.Marshal(doc)
			}
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		r.ContentLength = int64(len(body))
		r.Header.Del("Content-Length")
	}
	proxy.ModifyResponse = func(resp *http.Response) error {
		op := strings.TrimPrefix(resp.Request.Header.Get("X-Amz-Target"), "DynamoDB_20120810.")
		body, err := io.ReadAll(resp.Body)
		if err != nil {
			return err
		}
		resp.Body = io.NopCloser(bytes.NewReader(body))
		units := consumedUnits(body)
		// A refused conditional write reports its units in the error
		// body only sometimes; count what is reported.
		m.mu.Lock()
		m.calls[op]++
		if readOps[op] {
			m.read += units
		} else {
			m.write += units
		}
		m.mu.Unlock()
		return nil
	}
	srv := httptest.NewServer(proxy)
	tb.Cleanup(srv.Close)
	return m, srv.URL
}

func consumedUnits(body []byte) float64 {
	var one struct {
		ConsumedCapacity json.RawMessage
	}
	if json.Unmarshal(body, &one) != nil || len(one.ConsumedCapacity) == 0 {
		return 0
	}
	type cc struct{ CapacityUnits float64 }
	var single cc
	if json.Unmarshal(one.ConsumedCapacity, &single) == nil {
		return single.CapacityUnits
	}
	var many []cc
	total := 0.0
	if json.Unmarshal(one.ConsumedCapacity, &many) == nil {
		for _, c := range many {
			total += c.CapacityUnits
		}
	}
	return total
}

func (m *capacityMeter) snapshot() (read, write float64, calls int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, n := range m.calls {
		calls += n
	}
	return m.read, m.write, calls
}

// gateway turns the sandbox's HTTP calls into API Gateway REST proxy
// events for the sandboxapi and modelproxy bootstraps, as the private REST
// API would, and counts the invocations.
type gateway struct {
	tb          testing.TB
	sandboxapi  *rie.Function
	modelproxy  *rie.Function
	mu          sync.Mutex
	invocations map[string]int
}

func (g *gateway) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	ev := events.APIGatewayProxyRequest{
		Resource: r.URL.Path, Path: r.URL.Path, HTTPMethod: r.Method,
		Headers: map[string]string{}, MultiValueHeaders: map[string][]string{},
		Body: string(body),
		RequestContext: events.APIGatewayProxyRequestContext{
			RequestID: randomHex(16), Stage: "prod", DomainName: r.Host, HTTPMethod: r.Method, Path: "/prod" + r.URL.Path,
			Identity: events.APIGatewayRequestIdentity{SourceIP: "10.0.12.34"},
		},
	}
	for k, v := range r.Header {
		ev.Headers[k] = v[0]
		ev.MultiValueHeaders[k] = v
	}
	if q := r.URL.Query(); len(q) > 0 {
		ev.QueryStringParameters = map[string]string{}
		ev.MultiValueQueryStringParameters = map[string][]string(q)
		for k, v := range q {
			ev.QueryStringParameters[k] = v[0]
		}
	}
	raw, _ := json.Marshal(ev)
	fn := g.sandboxapi
	if r.URL.Path == "/internal/v1/chat/completions" {
		fn = g.modelproxy
	}
	g.mu.Lock()
	g.invocations[fn.Name]++
	g.mu.Unlock()
	_, out := fn.Invoke(g.tb, raw)
	var status int
	var header http.Header
	var respBody []byte
	if fn == g.modelproxy {
		resp, err := rie.ParseStreamed(out)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		status, header, respBody = resp.StatusCode, http.Header(resp.MultiValueHeaders), resp.Body
	} else {
		var resp events.APIGatewayProxyResponse
		if err := json.Unmarshal(out, &resp); err != nil || resp.StatusCode == 0 {
			http.Error(w, "bad function answer: "+string(out), http.StatusBadGateway)
			return
		}
		status, header, respBody = resp.StatusCode, http.Header(resp.MultiValueHeaders), []byte(resp.Body)
	}
	for k, v := range header {
		w.Header()[k] = v
	}
	w.WriteHeader(status)
	_, _ = w.Write(respBody)
}

// TestDemoRun runs the demo's run (examples/calc, the scripted fix-calc
// session) through every AWS-side function under the emulator: api
// creates it, steps activates it, the real sandbox entry claims it through
// sandboxapi, calls the model through modelproxy (to the scripted model on
// HTTPS loopback) and uploads its outputs to S3 by presigned PUT, steps
// validates and finalizes it, and a reader follows it through stream.
// Step Functions and ECS have no peer here: the test plays the state
// machine's part (the task states in order, the entry's exit as the
// RunTask output). Along the way it meters DynamoDB's consumed capacity,
// for the cost of one run (BELAY_PRINT_COST=1 prints the table).
func TestDemoRun(t *testing.T) {
	skip := t.Skip
	if os.Getenv("CI") != "" {
		skip = t.Fatal // .ci/run installs both
	}
	if _, err := exec.LookPath("git"); err != nil {
		skip("git is not installed; the sandbox entry needs it")
	}
	if err := exec.Command("/usr/bin/python3", "-m", "pytest", "--version").Run(); err != nil {
		skip("/usr/bin/python3 has no pytest (apt-get install python3-pytest); the run's check needs it")
	}
	p := startPeers(t)
	// One meter per function, so the report says who spends what.
	meters := map[string]*capacityMeter{}
	meterFor := func(fn string) string {
		m, url := startMeter(t, p.dynamoURL)
		meters[fn] = m
		return url
	}
	script, err := scriptedmodel.LoadScript("../examples/sessions/fix-calc.json")
	if err != nil {
		t.Fatal(err)
	}
	model := httptest.NewTLSServer(scriptedmodel.New(script))
	t.Cleanup(model.Close)
	certFile := filepath.Join(t.TempDir(), "model-ca.pem")
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: model.Certificate().Raw}), 0o600); err != nil {
		t.Fatal(err)
	}
	states := awstest.New(t, awstest.StepFunctions)
	states.Handle("StartExecution", func(body map[string]any) (int, any) {
		return http.StatusOK, map[string]any{"executionArn": sfn.ExecutionARN(stateMachine, body["name"].(string)), "startDate": 1796130330.0}
	})
	cluster := awstest.New(t, awstest.ECS)

	env := func(fn string, extra map[string]string) map[string]string {
		e := p.env(map[string]string{"BELAY_AWS_ENDPOINT": meterFor(fn)})
		for k, v := range extra {
			e[k] = v
		}
		return e
	}
	api := rie.Start(t, "api", env("api", map[string]string{"BELAY_TOKEN": controlToken, "BELAY_STATE_MACHINE_ARN": stateMachine,
		"BELAY_CLUSTER_ARN": clusterARN, "BELAY_SFN_ENDPOINT": states.URL, "BELAY_ECS_ENDPOINT": cluster.URL}))
	stream := rie.Start(t, "stream", env("stream", map[string]string{"BELAY_TOKEN": controlToken}))
	steps := rie.Start(t, "steps", env("steps", map[string]string{"BELAY_CLUSTER_ARN": clusterARN, "BELAY_ECS_ENDPOINT": cluster.URL}))
	gw := &gateway{tb: t, invocations: map[string]int{},
		sandboxapi: rie.Start(t, "sandboxapi", env("sandboxapi", map[string]string{"BELAY_SIGNING_KEY": signingKey})),
		modelproxy: rie.Start(t, "modelproxy", env("modelproxy", map[string]string{
			"BELAY_SIGNING_KEY": signingKey, "BELAY_MODEL_API_KEY": "sk-scripted-" + randomHex(8),
			"BELAY_MODEL_API_URL": model.URL + "/v1/chat/completions", "SSL_CERT_FILE": certFile,
		}))}
	functions := []*rie.Function{api, stream, steps, gw.sandboxapi, gw.modelproxy}
	private := httptest.NewServer(gw)
	t.Cleanup(private.Close)
	invocations := map[string]int{}

	// The caller: create the run (the demo's request).
	createEvent := apiEvent(t, "api", "create-run.json", withHeader("Idempotency-Key", "demo-"+randomHex(6)),
		func(ev *events.APIGatewayProxyRequest) {
			var req map[string]any
			_ = json.Unmarshal([]byte(ev.Body), &req)
			req["instruction"] = "The test suite fails: make python3 -m pytest -q pass by fixing calc.py. Change nothing else."
			req["maxSteps"], req["wallTimeSeconds"] = 12, 120
			b, _ := json.Marshal(req)
			ev.Body = string(b)
		})
	resp := buffered(t, api, createEvent)
	invocations["api"]++
	var created wire.CreateRunResponse
	if resp.StatusCode != http.StatusAccepted || json.Unmarshal([]byte(resp.Body), &created) != nil {
		t.Fatalf("create: %d %s", resp.StatusCode, resp.Body)
	}
	id := created.RunID
	followStart := time.Now()

	// A reader follows the run's events through stream, from the start.
	followed := make(chan []byte, 1)
	followEvent := apiEvent(t, "stream", "events-sse.json", forRun(id), withHeader("Last-Event-ID", "0"))
	go func() {
		_, body, err := stream.Call(t.Context(), followEvent)
		if err != nil {
			body = []byte(err.Error())
		}
		followed <- body
	}()
	invocations["stream"]++

	// The state machine: Activate, (PrepareSandbox), RunSandbox, Validate, Finalize.
	var act sfn.ActivateResult
	steps.Result(t, taskInput(t, "activate.json", id), &act)
	invocations["steps"]++

	// The entry refuses to run as root: as root, it runs as nobody, in a
	// workspace of its own (a Fargate task runs it as the image's user),
	// in a folder no sandbox user can write above (workspacetest).
	base := workspacetest.Dir(t, "demo-")
	ws := filepath.Join(base, "ws")
	if err := os.Mkdir(ws, 0o700); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	entry := exec.CommandContext(ctx, rie.Bootstrap(t, "sandbox-task"))
	if os.Geteuid() == 0 {
		const nobody = 65534
		if err := os.Chown(ws, nobody, nobody); err != nil {
			t.Fatal(err)
		}
		// The bootstrap's directory is 0700 (os.MkdirTemp): a copy the
		// unprivileged user can run.
		bin := filepath.Join(base, "belay-sandbox")
		if err := copyFile(rie.Bootstrap(t, "sandbox-task"), bin, 0o755); err != nil {
			t.Fatal(err)
		}
		entry = exec.CommandContext(ctx, bin)
		entry.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: nobody, Gid: nobody}}
	}
	entry.Env = []string{"PATH=" + os.Getenv("PATH"), "BELAY_CLAIM=" + act.Claim, "BELAY_API_URL=" + private.URL, "BELAY_WORKSPACE=" + ws}
	var entryLog bytes.Buffer
	entry.Stdout, entry.Stderr = &entryLog, &entryLog
	exitCode := 0
	if err := entry.Run(); err != nil {
		ee, ok := err.(*exec.ExitError)
		if !ok {
			t.Fatalf("run the sandbox entry: %v", err)
		}
		exitCode = ee.ExitCode()
	}
	if exitCode != 0 {
		t.Logf("sandbox entry log:\n%s", entryLog.String())
	}
	task, _ := json.Marshal(map[string]any{
		"TaskArn": "arn:aws:ecs:eu-west-1:123456789012:task/belay-sandboxes/demo", "StopCode": "EssentialContainerExited",
		"Containers": []any{map[string]any{"Name": "sandbox", "ExitCode": exitCode}},
	})
	var out sfn.Outcome
	steps.Result(t, taskInput(t, "validate.json", id, func(r *sfn.TaskRequest) { r.Task = task; r.Attempt = act.Attempt }), &out)
	var fin sfn.FinalizeResult
	steps.Result(t, taskInput(t, "finalize.json", id, func(r *sfn.TaskRequest) { r.Outcome = &out }), &fin)
	invocations["steps"] += 2
	if fin.Status != belay.StatusCompleted {
		t.Fatalf("the demo run ended %s (%s); entry exit %d:\n%s", fin.Status, out.Reason, exitCode, entryLog.String())
	}

	// The caller reads the outcome and the patch, and lists runs.
	for _, ev := range [][]byte{
		apiEvent(t, "api", "get-run.json", forRun(id)),
		apiEvent(t, "api", "get-run.json", forRun(id), func(ev *events.APIGatewayProxyRequest) {
			ev.Path += "/artifacts/patch.diff"
			ev.Resource = "/v1/runs/{id}/artifacts/{name}"
		}),
		apiEvent(t, "api", "get-run.json", func(ev *events.APIGatewayProxyRequest) {
			ev.Path, ev.Resource, ev.PathParameters = "/v1/runs", "/v1/runs", nil
			ev.QueryStringParameters = map[string]string{"limit": "5"}
			ev.MultiValueQueryStringParameters = map[string][]string{"limit": {"5"}}
		}),
	} {
		r := buffered(t, api, ev)
		invocations["api"]++
		if r.StatusCode != http.StatusOK {
			t.Fatalf("%d %s", r.StatusCode, r.Body)
		}
		if strings.Contains(r.Body, "+    return a + b") {
			invocations["patch"]++
		}
	}
	if invocations["patch"] != 1 {
		t.Fatal("the stored patch does not fix add")
	}
	delete(invocations, "patch")

	select {
	case body := <-followed:
		t.Logf("the follower's stream lasted %v", time.Since(followStart).Round(time.Millisecond))
		sse, err := rie.ParseStreamed(body)
		if err != nil || !strings.Contains(string(sse.Body), "event: run.completed") {
			t.Fatalf("the follower's stream did not end with run.completed: %v\n%s", err, body)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the follower's stream did not end after the run did")
	}
	for k, v := range gw.invocations {
		invocations[k] += v
	}
	stored, _ := p.store.GetRun(t.Context(), id)
	gbSeconds := 0.0
	for _, fn := range functions {
		gbSeconds += fn.BilledDuration().Seconds() * memoryGB[fn.Name]
	}
	report := costReport(invocations, stored, meters, time.Since(followStart), gbSeconds)
	if os.Getenv("BELAY_PRINT_COST") != "" {
		fmt.Print(report)
	}
	t.Log(report)
}

// Prices assumed (on-demand list prices, us-east-1, as of late 2025):
// DynamoDB on-demand $0.125 per million read request units and $0.625 per
// million write request units; Lambda $0.20 per million requests, arm64
// $0.0000133334 per GB-second; Step Functions Standard $0.025 per 1,000
// state transitions; API Gateway REST $3.50 per million requests.
const (
	priceRRU        = 0.125 / 1e6
	priceWRU        = 0.625 / 1e6
	priceInvocation = 0.20 / 1e6
	priceGBSecond   = 0.0000133334
	priceTransition = 0.025 / 1e3
	priceRESTCall   = 3.50 / 1e6
	// The happy path's state transitions: Activate, PrepareSandbox,
	// RunSandbox, Validate, Finalize.
	stateTransitions = 5
)

// memoryGB is each function's memory as the CDK stack sets it (infra),
// for the GB-seconds Lambda bills.
var memoryGB = map[string]float64{"api": 0.5, "stream": 0.25, "modelproxy": 0.25, "sandboxapi": 0.25, "steps": 0.5, "cleanup": 0.25}

func costReport(inv map[string]int, run belay.Run, meters map[string]*capacityMeter, followed time.Duration, gbSeconds float64) string {
	var b strings.Builder
	names := make([]string, 0, len(meters))
	for k := range meters {
		names = append(names, k)
	}
	sort.Strings(names)
	fmt.Fprintf(&b, "demo run %s: %s, %d model requests, followed for %v\n", run.ID, run.Status, run.Usage.ModelRequests, followed.Round(time.Millisecond))
	var read, write float64
	var calls, total int
	for _, n := range names {
		r, w, c := meters[n].snapshot()
		read, write, calls, total = read+r, write+w, calls+c, total+inv[n]
		meters[n].mu.Lock()
		ops := make([]string, 0, len(meters[n].calls))
		for op, k := range meters[n].calls {
			ops = append(ops, fmt.Sprintf("%s %d", op, k))
		}
		meters[n].mu.Unlock()
		sort.Strings(ops)
		fmt.Fprintf(&b, "  %-10s %2d invocations, DynamoDB %3d calls, %6.1f read units, %6.1f write units (%s)\n",
			n, inv[n], c, r, w, strings.Join(ops, ", "))
	}
	fmt.Fprintf(&b, "  total      %2d invocations, DynamoDB %3d calls, %6.1f read units, %6.1f write units; %d state transitions\n",
		total, calls, read, write, stateTransitions)
	rest := inv["api"] + inv["stream"] + inv["sandboxapi"] + inv["modelproxy"]
	ddb := read*priceRRU + write*priceWRU
	compute := gbSeconds * priceGBSecond
	fmt.Fprintf(&b, "  Lambda compute: %.2f GB-seconds billed under the emulator\n", gbSeconds)
	fmt.Fprintf(&b, "  cost: DynamoDB $%.7f + Lambda requests $%.7f + Lambda compute $%.7f + state transitions $%.7f + REST API requests $%.7f = $%.6f (S3 and Fargate not included)\n",
		ddb, float64(total)*priceInvocation, compute, stateTransitions*priceTransition, float64(rest)*priceRESTCall,
		ddb+float64(total)*priceInvocation+compute+stateTransitions*priceTransition+float64(rest)*priceRESTCall)
	return b.String()
}

func copyFile(src, dst string, perm os.FileMode) error {
	b, err := os.ReadFile(src)
	if err != nil {
		return err
	}
	return os.WriteFile(dst, b, perm)
}
