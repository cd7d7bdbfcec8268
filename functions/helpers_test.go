package functions_test

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/events"
	"github.com/johannesboyne/gofakes3"
	"github.com/johannesboyne/gofakes3/backend/s3mem"

	"github.com/belay-dev/belay/internal/belay"
	"github.com/belay-dev/belay/internal/dynamo"
	"github.com/belay-dev/belay/internal/rie"
	belays3 "github.com/belay-dev/belay/internal/s3"
	"github.com/belay-dev/belay/internal/token"
)

// The values the testdata events carry, which the tests configure the
// functions with or replace.
const (
	testdataRunID = "run_testdatarunidaaaaaaaaaaaaaaaaa"
	// testdataSessionID is the session of the ws and stream testdata.
	testdataSessionID = "ses_testdatasessionaaaaaaaaaaaa"
	controlToken      = "belay-testdata-control-token-0001"
	testModel         = "scripted-fix-calc"
	stateMachine      = "arn:aws:states:eu-west-1:123456789012:stateMachine:belay-runs"
	clusterARN        = "arn:aws:ecs:eu-west-1:123456789012:cluster/belay-sandboxes"
)

func TestMain(m *testing.M) {
	code := rie.Main(m)
	printMeasurements()
	os.Exit(code)
}

// peers are the real protocol peers of a test: DynamoDB Local (started by
// make test, found through BELAY_TEST_DYNAMODB_ENDPOINT) and gofakes3 over
// HTTP, in this process.
type peers struct {
	dynamoURL string
	table     string
	store     *dynamo.Store
	s3URL     string
	bucket    string
	artifacts *belays3.Store
}

func startPeers(tb testing.TB) peers {
	tb.Helper()
	endpoint := os.Getenv("BELAY_TEST_DYNAMODB_ENDPOINT")
	if endpoint == "" {
		if os.Getenv("CI") != "" {
			tb.Fatal("BELAY_TEST_DYNAMODB_ENDPOINT is not set; CI must start DynamoDB Local (scripts/peers.sh start)")
		}
		tb.Skip("DynamoDB Local not running: start it with `make peers-start` and `eval $(scripts/peers.sh env)`")
	}
	client, err := dynamo.NewLocalClient(tb.Context(), endpoint)
	if err != nil {
		tb.Fatal(err)
	}
	table := "functions-" + randomHex(6)
	if err := dynamo.CreateTable(tb.Context(), client, table); err != nil {
		tb.Fatal(err)
	}
	backend := s3mem.New()
	srv := httptest.NewServer(gofakes3.New(backend).Server())
	tb.Cleanup(srv.Close)
	s3client := belays3.NewLocalClient(srv.URL)
	bucket := "belay-artifacts"
	if err := backend.CreateBucket(bucket); err != nil {
		tb.Fatal(err)
	}
	return peers{
		dynamoURL: endpoint, table: table, store: dynamo.New(client, table, dynamo.Options{}),
		s3URL: srv.URL, bucket: bucket, artifacts: belays3.New(s3client, bucket, ""),
	}
}

// env is the environment of a function on these peers.
func (p peers) env(extra map[string]string) map[string]string {
	env := map[string]string{
		"BELAY_TABLE":        p.table,
		"BELAY_BUCKET":       p.bucket,
		"BELAY_MODEL":        testModel,
		"BELAY_AWS_ENDPOINT": p.dynamoURL,
		"BELAY_S3_ENDPOINT":  p.s3URL,
	}
	for k, v := range extra {
		env[k] = v
	}
	return env
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// newRunID returns a fresh run id in the handler's format.
func newRunID() string { return "run_" + randomHex(13) }

// apiEvent reads a REST proxy event of a function's testdata and applies
// the changes.
func apiEvent(tb testing.TB, function, name string, changes ...func(*events.APIGatewayProxyRequest)) []byte {
	tb.Helper()
	raw, err := os.ReadFile(function + "/testdata/" + name)
	if err != nil {
		tb.Fatal(err)
	}
	var ev events.APIGatewayProxyRequest
	if err := json.Unmarshal(raw, &ev); err != nil {
		tb.Fatalf("%s/testdata/%s: %v", function, name, err)
	}
	for _, c := range changes {
		c(&ev)
	}
	out, err := json.Marshal(ev)
	if err != nil {
		tb.Fatal(err)
	}
	return out
}

// forRun points an event's path at run id instead of the testdata's.
func forRun(id string) func(*events.APIGatewayProxyRequest) {
	return func(ev *events.APIGatewayProxyRequest) {
		ev.Path = strings.ReplaceAll(ev.Path, testdataRunID, id)
		ev.RequestContext.Path = strings.ReplaceAll(ev.RequestContext.Path, testdataRunID, id)
		if ev.PathParameters != nil {
			ev.PathParameters["id"] = id
		}
	}
}

// withHeader sets a header in both header maps, as API Gateway sends them.
func withHeader(name, value string) func(*events.APIGatewayProxyRequest) {
	return func(ev *events.APIGatewayProxyRequest) {
		if ev.Headers == nil {
			ev.Headers = map[string]string{}
		}
		if ev.MultiValueHeaders == nil {
			ev.MultiValueHeaders = map[string][]string{}
		}
		for k := range ev.Headers {
			if strings.EqualFold(k, name) {
				delete(ev.Headers, k)
				delete(ev.MultiValueHeaders, k)
			}
		}
		ev.Headers[name] = value
		ev.MultiValueHeaders[name] = []string{value}
	}
}

// buffered decodes a buffered function's answer.
func buffered(tb testing.TB, fn *rie.Function, event []byte) events.APIGatewayProxyResponse {
	tb.Helper()
	var resp events.APIGatewayProxyResponse
	fn.Result(tb, event, &resp)
	return resp
}

// streamed decodes a streaming function's answer.
func streamed(tb testing.TB, fn *rie.Function, event []byte) rie.StreamedResponse {
	tb.Helper()
	status, body := fn.Invoke(tb, event)
	if e, ok := rie.HandlerError(body); ok {
		tb.Fatalf("%s answered a handler error: %s", fn.Name, e.Message)
	}
	if status != 200 {
		tb.Fatalf("%s: emulator status %d: %s", fn.Name, status, body)
	}
	resp, err := rie.ParseStreamed(body)
	if err != nil {
		tb.Fatalf("%s: %v\n%q", fn.Name, err, body)
	}
	return resp
}

// errorCode returns the code of an error answer's body.
func errorCode(tb testing.TB, body string) belay.Code {
	tb.Helper()
	var e struct {
		Error struct {
			Code belay.Code `json:"code"`
		} `json:"error"`
	}
	if err := json.Unmarshal([]byte(body), &e); err != nil {
		tb.Fatalf("error body %q: %v", body, err)
	}
	return e.Error.Code
}

// seedRun stores a queued run as the api function would.
func seedRun(tb testing.TB, st belay.Store, id string) belay.Run {
	tb.Helper()
	req, err := belay.DefaultLimits(testModel).Validate(belay.RunRequest{
		Instruction: "Fix the failing test in calc.py",
		Files: []belay.File{
			{Path: "calc.py", Content: "def add(a, b):\n    return a - b\n"},
			{Path: "tests/test_calc.py", Content: "import calc\n\ndef test_add():\n    assert calc.add(1, 2) == 3\n"},
		},
		AllowedPaths:    []string{"calc.py"},
		Checks:          [][]string{{"python3", "-m", "pytest", "-q"}},
		MaxSteps:        5,
		WallTimeSeconds: 120,
	})
	if err != nil {
		tb.Fatal(err)
	}
	run, _, err := st.CreateRun(tb.Context(), belay.Run{
		ID: id, Status: belay.StatusQueued, Request: req, RequestHash: belay.RequestHash(req),
		CreatedAt: time.Now().UTC(), Usage: belay.Usage{MaxRequests: req.MaxRequests()},
	}, "")
	if err != nil {
		tb.Fatal(err)
	}
	return run
}

// startRun moves a seeded run to running with an active capability, as the
// activate step does.
func startRun(tb testing.TB, st belay.Store, id string) {
	tb.Helper()
	now := time.Now().UTC()
	if _, err := st.Transition(tb.Context(), id, belay.Transition{To: belay.StatusRunning, At: now, Attempt: 1,
		Events: []belay.EventInput{{Time: now, Type: belay.EventRunStarted, Data: json.RawMessage(`{}`)}}}); err != nil {
		tb.Fatal(err)
	}
	if err := st.ActivateCapability(tb.Context(), belay.Capability{RunID: id, Model: testModel, State: belay.CapabilityActive,
		ExpiresAt: now.Add(10 * time.Minute), MaxRequests: 7}); err != nil {
		tb.Fatal(err)
	}
}

// signingKey is the run-token key the tests give the functions.
var signingKey = strings.Repeat("5a", 32)

func issue(tb testing.TB, aud token.Audience, runID string) string {
	tb.Helper()
	key, _ := hex.DecodeString(signingKey)
	s, err := token.NewSigner(key, nil)
	if err != nil {
		tb.Fatal(err)
	}
	tok, err := s.Issue(aud, runID, testModel, 10*time.Minute)
	if err != nil {
		tb.Fatal(err)
	}
	return tok
}

func runEvents(tb testing.TB, st belay.Store, id string) []belay.Event {
	tb.Helper()
	page, err := st.ListEvents(tb.Context(), id, 0, 1000)
	if err != nil {
		tb.Fatal(err)
	}
	return page.Events
}

// measurements collects each bootstrap's init duration under the emulator,
// printed after the tests for the closing note's table.
var measurements struct {
	mu   sync.Mutex
	init map[string]time.Duration
}

func recordInit(tb testing.TB, fn *rie.Function) {
	tb.Helper()
	d, ok := fn.InitDuration()
	if !ok {
		tb.Errorf("%s: the emulator reported no init duration", fn.Name)
		return
	}
	measurements.mu.Lock()
	defer measurements.mu.Unlock()
	if measurements.init == nil {
		measurements.init = map[string]time.Duration{}
	}
	measurements.init[fn.Name] = d
}

func printMeasurements() {
	measurements.mu.Lock()
	defer measurements.mu.Unlock()
	if len(measurements.init) == 0 || os.Getenv("BELAY_PRINT_INIT") == "" {
		return
	}
	for name, d := range measurements.init {
		fmt.Printf("init duration under the emulator: %-10s %6.1f ms\n", name, float64(d)/float64(time.Millisecond))
	}
}

func mustNow() time.Time { return time.Now().UTC() }

// metricSum adds up the named metric over the function's EMF lines.
func metricSum(fn *rie.Function, name string) float64 {
	total := 0.0
	for _, line := range fn.JSONLines() {
		if _, ok := line["_aws"]; !ok {
			continue
		}
		if v, ok := line[name].(float64); ok {
			total += v
		}
	}
	return total
}

// waitMetrics waits until the function's log holds the wanted sums (see
// rie.Function.WaitLogs) and fails the test with what it holds otherwise.
func waitMetrics(tb testing.TB, fn *rie.Function, want map[string]float64) {
	tb.Helper()
	match := func(string) bool {
		for name, n := range want {
			if metricSum(fn, name) != n {
				return false
			}
		}
		return true
	}
	if !fn.WaitLogs(match) {
		got := map[string]float64{}
		for name := range want {
			got[name] = metricSum(fn, name)
		}
		tb.Fatalf("%s's metrics: %v, want %v", fn.Name, got, want)
	}
}

// createSession stores the idle session the testdata's events name
// (testdataSessionID) over calc.py, created at now.
func createSession(tb testing.TB, st belay.Store, now time.Time) {
	tb.Helper()
	if err := st.CreateSession(tb.Context(), belay.Session{ID: testdataSessionID, Status: belay.SessionIdle, CreatedAt: now, UpdatedAt: now,
		Request: belay.SessionRequest{Model: testModel, MaxSteps: 4, WallTimeSeconds: 120,
			Files:        []belay.File{{Path: "calc.py", Content: "def add(a, b):\n    return a - b\n"}},
			AllowedPaths: []string{"calc.py"}, Checks: [][]string{{"python3", "-m", "pytest", "-q"}},
			Approval: belay.ApprovalConfig{Policy: belay.PolicyDenyAll, TimeoutSeconds: 120}}}); err != nil {
		tb.Fatal(err)
	}
}
