package functions_test

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/events"

	"github.com/belay-dev/belay/internal/awstest"
	"github.com/belay-dev/belay/internal/belay"
	"github.com/belay-dev/belay/internal/rie"
	"github.com/belay-dev/belay/internal/sfn"
	"github.com/belay-dev/belay/internal/wire"
)

const (
	testdataSessionID    = "ses_testdatasessionaaaaaaaaaaaa"
	testdataConnectionID = "Tq1hZcF6joECJAw="
	wsAccessKey          = "AKIDBELAYWSTEST00001"
)

// posted is one PostToConnection call the management API stand-in got.
type posted struct {
	Connection string
	Body       []byte
}

// managementAPI stands in for API Gateway's management API, which has no
// peer here: an HTTP test server that checks each PostToConnection request
// (POST /{stage}/@connections/{id}, SigV4-signed for execute-api in the
// function's region with its credentials, a JSON body) and records it. It
// answers 410 Gone for the connections in gone.
type managementAPI struct {
	srv  *httptest.Server
	mu   sync.Mutex
	got  []posted
	bad  []string
	gone map[string]bool
}

func startManagementAPI(t *testing.T) *managementAPI {
	m := &managementAPI{gone: map[string]bool{}}
	m.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		m.mu.Lock()
		defer m.mu.Unlock()
		id, ok := strings.CutPrefix(r.URL.Path, "/v1/@connections/")
		auth := r.Header.Get("Authorization")
		switch {
		case r.Method != http.MethodPost || !ok || id == "":
			m.bad = append(m.bad, r.Method+" "+r.URL.Path)
		case !strings.HasPrefix(auth, "AWS4-HMAC-SHA256 Credential="+wsAccessKey+"/") || !strings.Contains(auth, "/eu-west-1/execute-api/aws4_request") ||
			r.Header.Get("X-Amz-Date") == "" || !strings.Contains(auth, "Signature="):
			m.bad = append(m.bad, "unsigned: "+auth)
		case !json.Valid(body):
			m.bad = append(m.bad, "not JSON: "+string(body))
		}
		if m.gone[id] {
			// As API Gateway answers for a connection it no longer has.
			w.Header().Set("X-Amzn-ErrorType", "GoneException")
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusGone)
			_, _ = io.WriteString(w, `{"message":"Gone"}`)
			return
		}
		m.got = append(m.got, posted{Connection: id, Body: body})
	}))
	t.Cleanup(m.srv.Close)
	return m
}

// take returns what was posted since the last take.
func (m *managementAPI) take(t *testing.T) []posted {
	t.Helper()
	m.mu.Lock()
	defer m.mu.Unlock()
	if len(m.bad) > 0 {
		t.Fatalf("the management API got bad requests: %q", m.bad)
	}
	out := m.got
	m.got = nil
	return out
}

func wsEvent(t *testing.T, name string, change func(*events.APIGatewayWebsocketProxyRequest)) []byte {
	t.Helper()
	raw, err := os.ReadFile("ws/testdata/" + name)
	if err != nil {
		t.Fatal(err)
	}
	var ev events.APIGatewayWebsocketProxyRequest
	if err := json.Unmarshal(raw, &ev); err != nil {
		t.Fatalf("ws/testdata/%s: %v", name, err)
	}
	if change != nil {
		change(&ev)
	}
	out, _ := json.Marshal(ev)
	return out
}

// TestWebSocketFunction runs the ws bootstrap under the Lambda runtime
// emulator with real API Gateway WebSocket events ($connect, $default,
// $disconnect) and a DynamoDB stream event, on DynamoDB Local. No API
// Gateway runs here: PostToConnection goes to a test server that checks
// each request (managementAPI), and Step Functions to an awstest server.
func TestWebSocketFunction(t *testing.T) {
	p := startPeers(t)
	mgmt := startManagementAPI(t)
	states := awstest.New(t, awstest.StepFunctions)
	states.Handle("StartExecution", func(body map[string]any) (int, any) {
		return http.StatusOK, map[string]any{"executionArn": sfn.ExecutionARN(stateMachine, body["name"].(string)), "startDate": 1796130330.0}
	})
	states.Handle("StopExecution", func(map[string]any) (int, any) {
		return http.StatusOK, map[string]any{"stopDate": 1796130400.0}
	})
	cluster := awstest.New(t, awstest.ECS)
	fn := rie.Start(t, "ws", p.env(map[string]string{
		"BELAY_TOKEN":             controlToken,
		"BELAY_STATE_MACHINE_ARN": stateMachine,
		"BELAY_CLUSTER_ARN":       clusterARN,
		"BELAY_SFN_ENDPOINT":      states.URL,
		"BELAY_ECS_ENDPOINT":      cluster.URL,
		"BELAY_WS_ENDPOINT":       mgmt.srv.URL + "/v1",
		"AWS_REGION":              "eu-west-1",
		"AWS_ACCESS_KEY_ID":       wsAccessKey,
		"AWS_SECRET_ACCESS_KEY":   "belay-ws-test-secret-key",
	}))
	ctx := t.Context()
	now := time.Now().UTC()
	if err := p.store.CreateSession(ctx, belay.Session{ID: testdataSessionID, Status: belay.SessionIdle, CreatedAt: now, UpdatedAt: now,
		Request: belay.SessionRequest{Model: testModel, MaxSteps: 4, WallTimeSeconds: 120,
			Files:        []belay.File{{Path: "calc.py", Content: "def add(a, b):\n    return a - b\n"}},
			AllowedPaths: []string{"calc.py"}, Checks: [][]string{{"python3", "-m", "pytest", "-q"}},
			Approval: belay.ApprovalConfig{Policy: belay.PolicyDenyAll, TimeoutSeconds: 120}}}); err != nil {
		t.Fatal(err)
	}

	t.Run("connect refuses a wrong token and an unknown session", func(t *testing.T) {
		resp := buffered(t, fn, wsEvent(t, "connect.json", func(ev *events.APIGatewayWebsocketProxyRequest) {
			ev.Headers["Authorization"] = "Bearer not-the-control-plane-token"
			ev.MultiValueHeaders["Authorization"] = []string{"Bearer not-the-control-plane-token"}
		}))
		if resp.StatusCode != http.StatusUnauthorized {
			t.Fatalf("$connect with a wrong token: %d %s; want 401", resp.StatusCode, resp.Body)
		}
		resp = buffered(t, fn, wsEvent(t, "connect.json", func(ev *events.APIGatewayWebsocketProxyRequest) {
			ev.QueryStringParameters["sessionId"] = "ses_nosuchsession"
		}))
		if resp.StatusCode != http.StatusNotFound {
			t.Fatalf("$connect to an unknown session: %d %s; want 404", resp.StatusCode, resp.Body)
		}
		if _, err := p.store.GetConnection(ctx, testdataConnectionID); !belay.IsCode(err, belay.CodeNotFound) {
			t.Fatalf("a refused $connect stored a connection: %v", err)
		}
	})
	recordInit(t, fn)

	if resp := buffered(t, fn, wsEvent(t, "connect.json", nil)); resp.StatusCode != http.StatusOK {
		t.Fatalf("$connect: %d %s", resp.StatusCode, resp.Body)
	}
	// A second client whose socket API Gateway has lost.
	const goneID = "Tq1goneF6joECJAw="
	mgmt.gone[goneID] = true
	if resp := buffered(t, fn, wsEvent(t, "connect.json", func(ev *events.APIGatewayWebsocketProxyRequest) {
		ev.RequestContext.ConnectionID = goneID
	})); resp.StatusCode != http.StatusOK {
		t.Fatalf("$connect (second): %d %s", resp.StatusCode, resp.Body)
	}

	var runID string
	t.Run("a chat starts a turn", func(t *testing.T) {
		resp := buffered(t, fn, wsEvent(t, "message.json", nil))
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("$default: %d %s", resp.StatusCode, resp.Body)
		}
		got := mgmt.take(t)
		if len(got) < 2 {
			t.Fatalf("posted %d messages; want the answer and the turn's first event", len(got))
		}
		var accepted wire.WSServerMessage
		if err := json.Unmarshal(got[0].Body, &accepted); err != nil || accepted.Type != wire.WSTypeAccepted || accepted.For != "chat" || accepted.Turn != 1 {
			t.Fatalf("the answer %s; want ws.accepted for the chat, turn 1", got[0].Body)
		}
		runID = accepted.RunID
		var first belay.SessionEvent
		if err := json.Unmarshal(got[1].Body, &first); err != nil || first.Type != belay.EventRunQueued || first.Seq != belay.SessionSeq(1, 1) || first.RunID != runID {
			t.Fatalf("the first event pushed %s; want turn 1's run.queued", got[1].Body)
		}
		for _, g := range got {
			if g.Connection != testdataConnectionID {
				t.Errorf("posted to %s; want only the live connection", g.Connection)
			}
		}
		if starts := states.Calls("StartExecution"); len(starts) != 1 || starts[0]["name"] != runID {
			t.Fatalf("StartExecution calls %v; want one for run %s", starts, runID)
		}
		if _, err := p.store.GetConnection(ctx, goneID); !belay.IsCode(err, belay.CodeNotFound) {
			t.Errorf("the connection API Gateway answered 410 for is still stored: %v", err)
		}
		sess, err := p.store.GetSession(ctx, testdataSessionID)
		if err != nil || len(sess.Turns) != 1 || sess.Turns[0].RunID != runID || sess.Status != belay.SessionRunning {
			t.Fatalf("session %+v, %v; want turn 1 running", sess, err)
		}
	})

	t.Run("a second chat while the turn runs is a conflict", func(t *testing.T) {
		buffered(t, fn, wsEvent(t, "message.json", nil))
		got := mgmt.take(t)
		var m wire.WSServerMessage
		if len(got) != 1 || json.Unmarshal(got[0].Body, &m) != nil || m.Type != wire.WSTypeError || m.Error.Code != belay.CodeConflict {
			t.Fatalf("posted %d: %s; want one ws.error conflict", len(got), got)
		}
	})

	t.Run("the stream pushes new events once, in order", func(t *testing.T) {
		startRun(t, p.store, runID)
		if _, err := p.store.AppendSandboxEvents(ctx, runID, "", []belay.EventInput{
			{Time: time.Now().UTC(), Type: belay.EventSandboxReady, Data: json.RawMessage(`{}`)},
			{Time: time.Now().UTC(), Type: belay.EventAgentMessage, Data: json.RawMessage(`{"text":"on it"}`)},
		}, belay.DefaultSandboxEventLimits()); err != nil {
			t.Fatal(err)
		}
		raw, err := os.ReadFile("ws/testdata/stream.json")
		if err != nil {
			t.Fatal(err)
		}
		stream := []byte(strings.ReplaceAll(string(raw), testdataRunID, runID))
		var out events.DynamoDBEventResponse
		fn.Result(t, stream, &out)
		if len(out.BatchItemFailures) != 0 {
			t.Fatalf("batch item failures %+v", out.BatchItemFailures)
		}
		got := mgmt.take(t)
		all := runEvents(t, p.store, runID)
		if len(got) != len(all)-1 {
			t.Fatalf("pushed %d events; want the %d after run.queued", len(got), len(all)-1)
		}
		for i, g := range got {
			var e belay.SessionEvent
			if err := json.Unmarshal(g.Body, &e); err != nil || e.RunSeq != all[i+1].Seq || e.Type != all[i+1].Type || e.Turn != 1 {
				t.Fatalf("pushed event %d: %s; want %d %s", i, g.Body, all[i+1].Seq, all[i+1].Type)
			}
		}
		// The same records again push nothing: each event goes out once.
		fn.Result(t, stream, &out)
		if again := mgmt.take(t); len(again) != 0 {
			t.Fatalf("the repeated stream records pushed %d events again", len(again))
		}
	})

	t.Run("stop cancels the turn", func(t *testing.T) {
		buffered(t, fn, wsEvent(t, "message.json", func(ev *events.APIGatewayWebsocketProxyRequest) { ev.Body = `{"type":"stop"}` }))
		got := mgmt.take(t)
		var m wire.WSServerMessage
		if len(got) < 1 || json.Unmarshal(got[0].Body, &m) != nil || m.Type != wire.WSTypeAccepted || m.For != "stop" || m.RunID != runID {
			t.Fatalf("stop answered %s", got)
		}
		run, err := p.store.GetRun(ctx, runID)
		if err != nil || !run.CancelRequested {
			t.Fatalf("run %+v, %v; want cancel requested", run.CancelRequested, err)
		}
		if c, err := p.store.GetCapability(ctx, runID); err != nil || c.State != belay.CapabilityRevoked {
			t.Fatalf("capability %+v, %v; want revoked at once", c, err)
		}
		if stops := states.Calls("StopExecution"); len(stops) != 1 || !strings.HasSuffix(stops[0]["executionArn"].(string), ":"+runID) {
			t.Fatalf("StopExecution calls %v; want one for run %s", stops, runID)
		}
	})

	t.Run("a bad message is answered with an error", func(t *testing.T) {
		buffered(t, fn, wsEvent(t, "message.json", func(ev *events.APIGatewayWebsocketProxyRequest) { ev.Body = `{"type":"dance"}` }))
		got := mgmt.take(t)
		var m wire.WSServerMessage
		if len(got) != 1 || json.Unmarshal(got[0].Body, &m) != nil || m.Type != wire.WSTypeError || m.Error.Code != belay.CodeInvalid {
			t.Fatalf("posted %s; want one ws.error invalid", got)
		}
	})

	t.Run("disconnect forgets the connection", func(t *testing.T) {
		if resp := buffered(t, fn, wsEvent(t, "disconnect.json", nil)); resp.StatusCode != http.StatusOK {
			t.Fatalf("$disconnect: %d %s", resp.StatusCode, resp.Body)
		}
		if list, err := p.store.SessionConnections(ctx, testdataSessionID); err != nil || len(list) != 0 {
			t.Fatalf("connections after $disconnect: %+v, %v", list, err)
		}
		resp := buffered(t, fn, wsEvent(t, "message.json", nil))
		if resp.StatusCode != http.StatusGone || len(mgmt.take(t)) != 0 {
			t.Fatalf("a message on a forgotten connection: %d; want 410 and nothing posted", resp.StatusCode)
		}
	})
}
