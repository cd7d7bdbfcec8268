package functions_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/events"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	dynamotypes "github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/aws/aws-sdk-go-v2/service/dynamodbstreams"
	streamtypes "github.com/aws/aws-sdk-go-v2/service/dynamodbstreams/types"

	"github.com/belay-dev/belay/internal/awstest"
	"github.com/belay-dev/belay/internal/belay"
	"github.com/belay-dev/belay/internal/dynamo"
	"github.com/belay-dev/belay/internal/rie"
	"github.com/belay-dev/belay/internal/sfn"
	"github.com/belay-dev/belay/internal/wire"
)

const (
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
// answers 410 Gone for the connections in gone, and, for a connection in
// failAfter, lets that many more posts through and answers the next one
// 500 (once), as API Gateway does when it fails.
type managementAPI struct {
	srv       *httptest.Server
	mu        sync.Mutex
	got       []posted
	bad       []string
	gone      map[string]bool
	failAfter map[string]int
}

func startManagementAPI(t *testing.T) *managementAPI {
	m := &managementAPI{gone: map[string]bool{}, failAfter: map[string]int{}}
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
		if n, ok := m.failAfter[id]; ok {
			if n == 0 {
				delete(m.failAfter, id)
				w.Header().Set("X-Amzn-ErrorType", "InternalServerErrorException")
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(http.StatusInternalServerError)
				_, _ = io.WriteString(w, `{"message":"Internal server error"}`)
				return
			}
			m.failAfter[id] = n - 1
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
	// The table's stream, as the stack defines it: every write from here
	// on is in it, for the subtest that replays it.
	stream := enableStream(t, p)
	now := time.Now().UTC()
	createSession(t, p.store, now)

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
		stream := streamEvent(t, runID)
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

	t.Run("the table's own stream pushes the new events once", func(t *testing.T) {
		if _, err := p.store.AppendSandboxEvents(ctx, runID, "", []belay.EventInput{
			{Time: time.Now().UTC(), Type: belay.EventAgentMessage, Data: json.RawMessage(`{"text":"first, the test"}`)},
			{Time: time.Now().UTC(), Type: belay.EventAgentMessage, Data: json.RawMessage(`{"text":"then the fix"}`)},
		}, belay.DefaultSandboxEventLimits()); err != nil {
			t.Fatal(err)
		}
		all := runEvents(t, p.store, runID)
		fresh := all[len(all)-2:]
		records := stream.records(t)
		// The records DynamoDB Local's stream holds have the shape of the
		// testdata's (which the stack's filter is tested on): KEYS_ONLY,
		// string keys, the events as INSERTs of RUN#/EVT# keys.
		inserted := map[string]bool{}
		for _, r := range records {
			if r.EventSource != "aws:dynamodb" || r.Change.StreamViewType != "KEYS_ONLY" || len(r.Change.NewImage) != 0 {
				t.Fatalf("stream record %+v; want a KEYS_ONLY record from aws:dynamodb", r)
			}
			pk, sk := r.Change.Keys["PK"].String(), r.Change.Keys["SK"].String()
			if r.EventName == "INSERT" && strings.HasPrefix(pk, "RUN#") && strings.HasPrefix(sk, "EVT#") {
				inserted[pk+" "+sk] = true
			}
		}
		for _, e := range all {
			if key := fmt.Sprintf("RUN#%s EVT#%020d", runID, e.Seq); !inserted[key] {
				t.Fatalf("no INSERT record for event %d (%s) in the stream; keys seen %v", e.Seq, key, inserted)
			}
		}
		// Every record, unfiltered, in batches of the stack's size: the
		// function pushes the two new events, once, in order.
		for len(records) > 0 {
			batch := records[:min(len(records), 100)]
			records = records[len(batch):]
			body, err := json.Marshal(events.DynamoDBEvent{Records: batch})
			if err != nil {
				t.Fatal(err)
			}
			var out events.DynamoDBEventResponse
			fn.Result(t, body, &out)
			if len(out.BatchItemFailures) != 0 {
				t.Fatalf("batch item failures %+v", out.BatchItemFailures)
			}
		}
		got := mgmt.take(t)
		if len(got) != len(fresh) {
			t.Fatalf("pushed %d messages from the real stream; want the %d new events", len(got), len(fresh))
		}
		for i, g := range got {
			var e belay.SessionEvent
			if err := json.Unmarshal(g.Body, &e); err != nil || e.RunSeq != fresh[i].Seq || e.Type != fresh[i].Type {
				t.Fatalf("pushed %s; want event %d %s", g.Body, fresh[i].Seq, fresh[i].Type)
			}
		}
	})

	t.Run("a failed post is sent again when Lambda retries its record", func(t *testing.T) {
		if _, err := p.store.AppendSandboxEvents(ctx, runID, "", []belay.EventInput{
			{Time: time.Now().UTC(), Type: belay.EventAgentMessage, Data: json.RawMessage(`{"text":"one"}`)},
			{Time: time.Now().UTC(), Type: belay.EventAgentMessage, Data: json.RawMessage(`{"text":"two"}`)},
			{Time: time.Now().UTC(), Type: belay.EventAgentMessage, Data: json.RawMessage(`{"text":"three"}`)},
		}, belay.DefaultSandboxEventLimits()); err != nil {
			t.Fatal(err)
		}
		all := runEvents(t, p.store, runID)
		fresh := all[len(all)-3:]
		stream := streamEvent(t, runID)
		mgmt.mu.Lock()
		mgmt.failAfter[testdataConnectionID] = 1 // the first goes through, the second fails
		mgmt.mu.Unlock()
		var out events.DynamoDBEventResponse
		fn.Result(t, stream, &out)
		if len(out.BatchItemFailures) == 0 {
			t.Fatal("a failed post left its record done; Lambda would not try it again")
		}
		got := mgmt.take(t)
		if len(got) != 1 {
			t.Fatalf("pushed %d before the failure; want 1", len(got))
		}
		// Lambda tries the failed record again.
		fn.Result(t, stream, &out)
		if len(out.BatchItemFailures) != 0 {
			t.Fatalf("the retry failed too: %+v", out.BatchItemFailures)
		}
		got = append(got, mgmt.take(t)...)
		if len(got) != len(fresh) {
			t.Fatalf("pushed %d in all; want the %d new events once each", len(got), len(fresh))
		}
		for i, g := range got {
			var e belay.SessionEvent
			if err := json.Unmarshal(g.Body, &e); err != nil || e.RunSeq != fresh[i].Seq || g.Connection != testdataConnectionID {
				t.Fatalf("push %d: %s to %s; want event %d", i, g.Body, g.Connection, fresh[i].Seq)
			}
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

// tableStream is a test table's DynamoDB stream on DynamoDB Local.
type tableStream struct {
	client *dynamodbstreams.Client
	arn    string
}

// enableStream turns on the table's stream as the stack defines it
// (KEYS_ONLY).
func enableStream(tb testing.TB, p peers) tableStream {
	tb.Helper()
	ctx := tb.Context()
	client, err := dynamo.NewLocalClient(ctx, p.dynamoURL)
	if err != nil {
		tb.Fatal(err)
	}
	out, err := client.UpdateTable(ctx, &dynamodb.UpdateTableInput{
		TableName: aws.String(p.table),
		StreamSpecification: &dynamotypes.StreamSpecification{
			StreamEnabled: aws.Bool(true), StreamViewType: dynamotypes.StreamViewTypeKeysOnly,
		},
	})
	if err != nil {
		tb.Fatalf("enable the table's stream: %v", err)
	}
	arn := aws.ToString(out.TableDescription.LatestStreamArn)
	if arn == "" {
		tb.Fatal("the table has no stream after UpdateTable")
	}
	return tableStream{
		client: dynamodbstreams.New(dynamodbstreams.Options{
			Region: "us-east-1", BaseEndpoint: aws.String(p.dynamoURL),
			Credentials: credentials.NewStaticCredentialsProvider("local", "local", ""),
		}),
		arn: arn,
	}
}

// records reads every record of the stream, shard by shard from the
// oldest, as Lambda's event source mapping would hand them to the
// function: in its DynamoDB event record shape.
func (s tableStream) records(tb testing.TB) []events.DynamoDBEventRecord {
	tb.Helper()
	ctx := tb.Context()
	desc, err := s.client.DescribeStream(ctx, &dynamodbstreams.DescribeStreamInput{StreamArn: aws.String(s.arn)})
	if err != nil {
		tb.Fatalf("describe the stream: %v", err)
	}
	var out []events.DynamoDBEventRecord
	for _, shard := range desc.StreamDescription.Shards {
		it, err := s.client.GetShardIterator(ctx, &dynamodbstreams.GetShardIteratorInput{
			StreamArn: aws.String(s.arn), ShardId: shard.ShardId, ShardIteratorType: streamtypes.ShardIteratorTypeTrimHorizon,
		})
		if err != nil {
			tb.Fatalf("shard iterator: %v", err)
		}
		for next := it.ShardIterator; next != nil; {
			page, err := s.client.GetRecords(ctx, &dynamodbstreams.GetRecordsInput{ShardIterator: next})
			if err != nil {
				tb.Fatalf("read the stream: %v", err)
			}
			if len(page.Records) == 0 {
				break // an open shard: nothing more for now
			}
			for _, r := range page.Records {
				out = append(out, lambdaRecord(tb, s.arn, r))
			}
			next = page.NextShardIterator
		}
	}
	return out
}

// lambdaRecord is r as a Lambda DynamoDB event record.
func lambdaRecord(tb testing.TB, arn string, r streamtypes.Record) events.DynamoDBEventRecord {
	tb.Helper()
	keys := map[string]events.DynamoDBAttributeValue{}
	for k, v := range r.Dynamodb.Keys {
		sv, ok := v.(*streamtypes.AttributeValueMemberS)
		if !ok {
			tb.Fatalf("stream key %s is %T; the table's keys are strings", k, v)
		}
		keys[k] = events.NewStringAttribute(sv.Value)
	}
	rec := events.DynamoDBEventRecord{
		EventID: aws.ToString(r.EventID), EventName: string(r.EventName), EventVersion: aws.ToString(r.EventVersion),
		EventSource: aws.ToString(r.EventSource), AWSRegion: aws.ToString(r.AwsRegion), EventSourceArn: arn,
		Change: events.DynamoDBStreamRecord{
			Keys: keys, SequenceNumber: aws.ToString(r.Dynamodb.SequenceNumber),
			SizeBytes: aws.ToInt64(r.Dynamodb.SizeBytes), StreamViewType: string(r.Dynamodb.StreamViewType),
		},
	}
	if t := r.Dynamodb.ApproximateCreationDateTime; t != nil {
		rec.Change.ApproximateCreationDateTime = events.SecondsEpochTime{Time: *t}
	}
	return rec
}

// streamEvent is the testdata's DynamoDB stream event with its records
// about run runID.
func streamEvent(tb testing.TB, runID string) []byte {
	tb.Helper()
	raw, err := os.ReadFile("ws/testdata/stream.json")
	if err != nil {
		tb.Fatal(err)
	}
	return []byte(strings.ReplaceAll(string(raw), testdataRunID, runID))
}
