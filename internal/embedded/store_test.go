package embedded_test

import (
	"context"
	"crypto/rand"
	"errors"
	"io"
	"io/fs"
	"net"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	ddbtypes "github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	awss3 "github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/johannesboyne/gofakes3"
	"github.com/johannesboyne/gofakes3/backend/s3mem"

	"github.com/belay-dev/belay/internal/belay"
	"github.com/belay-dev/belay/internal/dynamo"
	"github.com/belay-dev/belay/internal/embedded"
	"github.com/belay-dev/belay/internal/embedded/embeddedtest"
	"github.com/belay-dev/belay/internal/httpapi"
	belays3 "github.com/belay-dev/belay/internal/s3"
	"github.com/belay-dev/belay/internal/wire"
)

// storeTestDynamoEndpoint returns the DynamoDB Local that
// BELAY_TEST_DYNAMODB_ENDPOINT names, skipping the test when it is unset
// outside CI and failing it in CI.
func storeTestDynamoEndpoint(tb testing.TB) string {
	tb.Helper()
	endpoint := os.Getenv("BELAY_TEST_DYNAMODB_ENDPOINT")
	if endpoint == "" {
		if os.Getenv("CI") != "" {
			tb.Fatal("BELAY_TEST_DYNAMODB_ENDPOINT is not set; CI must start DynamoDB Local (scripts/peers.sh start)")
		}
		tb.Skip("DynamoDB Local not running: start it with `make peers-start` and `eval $(scripts/peers.sh env)`")
	}
	return endpoint
}

// storeTestTable returns a fresh table name on DynamoDB Local at endpoint,
// dropped when the test ends if it was created by then.
func storeTestTable(tb testing.TB, endpoint string) (string, *dynamodb.Client) {
	tb.Helper()
	client, err := dynamo.NewLocalClient(context.Background(), endpoint)
	if err != nil {
		tb.Fatal(err)
	}
	table := "belay-serve-" + strings.ToLower(rand.Text()[:16])
	tb.Cleanup(func() {
		_, err := client.DeleteTable(context.Background(), &dynamodb.DeleteTableInput{TableName: aws.String(table)})
		var missing interface{ ErrorCode() string }
		if err != nil && !(errors.As(err, &missing) && missing.ErrorCode() == "ResourceNotFoundException") {
			tb.Errorf("drop table %s: %v", table, err)
		}
	})
	return table, client
}

// storeTestS3 serves gofakes3 over HTTP in the test process with one empty
// bucket, and returns its endpoint, the bucket and a client of it.
func storeTestS3(tb testing.TB) (endpoint, bucket string, client *awss3.Client) {
	tb.Helper()
	srv := httptest.NewServer(gofakes3.New(s3mem.New()).Server())
	tb.Cleanup(srv.Close)
	bucket = "belay-artifacts"
	client = belays3.NewLocalClient(srv.URL)
	if _, err := client.CreateBucket(context.Background(), &awss3.CreateBucketInput{Bucket: aws.String(bucket)}); err != nil {
		tb.Fatalf("create bucket on gofakes3: %v", err)
	}
	return srv.URL, bucket, client
}

// storeTestTranscriptSandbox returns a sandbox entry that leaves marker as
// its transcript and then waits until it is stopped, so a cancelled run
// still has an artifact to store.
func storeTestTranscriptSandbox(tb testing.TB, marker string) string {
	tb.Helper()
	dir, err := os.MkdirTemp("", "bsb")
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = os.RemoveAll(dir) })
	path := filepath.Join(dir, embedded.SandboxBinName)
	// It uploads its transcript through the outputs route as the entry
	// does, leaves home/uploaded/ as a sign for the test (the workspace
	// folder itself is root's), and sleeps.
	script := `#!/bin/sh
/usr/bin/python3 - "$2" <<'EOF' || exit 1
import http.client, json, os, socket, sys
ws = sys.argv[1]
spec = json.load(open(os.path.join(ws, "spec.json")))
tok = open(os.path.join(ws, "tokens", "events.token")).read().strip()
class Conn(http.client.HTTPConnection):
    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX)
        self.sock.connect(spec["apiSocket"])
c = Conn("belay")
c.request("PUT", "/internal/v1/runs/" + spec["runId"] + "/outputs/transcript.jsonl",
          body=('` + marker + `' + "\n").encode(),
          headers={"Authorization": "Bearer " + tok})
r = c.getresponse()
r.read()
if r.status != 204:
    sys.exit("upload: %d" % r.status)
os.mkdir(os.path.join(ws, "home", "uploaded"))
EOF
exec /bin/sleep 3600
`
	if err := os.WriteFile(path, []byte(script), 0o755); err != nil {
		tb.Fatal(err)
	}
	return path
}

// storeTestText writes every name and value in av to w, for a search of
// what the table stores.
func storeTestText(w *strings.Builder, av ddbtypes.AttributeValue) {
	switch v := av.(type) {
	case *ddbtypes.AttributeValueMemberS:
		w.WriteString(v.Value + "\n")
	case *ddbtypes.AttributeValueMemberN:
		w.WriteString(v.Value + "\n")
	case *ddbtypes.AttributeValueMemberB:
		w.Write(v.Value)
		w.WriteString("\n")
	case *ddbtypes.AttributeValueMemberSS:
		w.WriteString(strings.Join(v.Value, "\n") + "\n")
	case *ddbtypes.AttributeValueMemberBS:
		for _, b := range v.Value {
			w.Write(b)
			w.WriteString("\n")
		}
	case *ddbtypes.AttributeValueMemberL:
		for _, e := range v.Value {
			storeTestText(w, e)
		}
	case *ddbtypes.AttributeValueMemberM:
		for k, e := range v.Value {
			w.WriteString(k + "\n")
			storeTestText(w, e)
		}
	}
}

// storeTestStartErr runs a Main that is expected not to start, and returns
// Run's error.
func storeTestStartErr(tb testing.TB, cfg embedded.Config) error {
	tb.Helper()
	m, err := embedded.New(cfg)
	if err != nil {
		tb.Fatalf("embedded.New: %v", err)
	}
	ran := make(chan error, 1)
	go func() { ran <- m.Run(context.Background()) }()
	<-m.Ready()
	if addr := m.Addr(); addr != "" {
		_ = m.Close()
		<-ran
		tb.Fatalf("Main listened on %s; want it to refuse to start", addr)
	}
	return <-ran
}

// TestServeOnDynamoDBAndS3 runs the embedded control plane on the AWS
// adapters, DynamoDB Local for runs and gofakes3 for artifacts, and drives a
// run through the public API: created, started, cancelled, read back with
// its events and its artifact, also after a restart. Nothing lands in the
// data directory but the token files, and no secret in the table, the
// bucket or the logs.
func TestServeOnDynamoDBAndS3(t *testing.T) {
	endpoint := storeTestDynamoEndpoint(t)
	table, ddb := storeTestTable(t, endpoint)
	s3URL, bucket, s3c := storeTestS3(t)

	const marker = `{"note":"transcript left by the sandbox"}`
	controlToken := "ctl-canary-" + strings.Repeat("c", 24)
	providerKey := "sk-canary-" + strings.Repeat("p", 24)
	logs := &embeddedtest.Logs{}
	cfg := embeddedtest.Config(t, logs)
	cfg.SandboxBin = storeTestTranscriptSandbox(t, marker)
	cfg.Token = controlToken
	cfg.ModelAPIKey = providerKey
	cfg.Storage = embedded.StorageConfig{
		Store:       embedded.StoreDynamoDB,
		Table:       table,
		CreateTable: true,
		Bucket:      bucket,
		AWSEndpoint: endpoint,
		S3Endpoint:  s3URL,
	}
	m := embeddedtest.Start(t, cfg)
	runs, artifacts := m.Storage()
	if !strings.Contains(runs, table) || !strings.Contains(runs, endpoint) ||
		!strings.Contains(artifacts, bucket) || !strings.Contains(artifacts, s3URL) {
		t.Errorf("Storage() = %q, %q; want the table at %s and the bucket at %s", runs, artifacts, endpoint, s3URL)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c := clientOf(t, m)
	created, err := c.CreateRun(ctx, runRequest(), "")
	if err != nil {
		t.Fatalf("CreateRun: %v", err)
	}
	id := created.RunID

	// Cancel once the sandbox has left its transcript.
	var transcript []string
	for len(transcript) == 0 {
		if ctx.Err() != nil {
			t.Fatal("the sandbox never wrote its transcript")
		}
		time.Sleep(10 * time.Millisecond)
		transcript, _ = filepath.Glob(filepath.Join(cfg.SandboxDir, "*", "home", "uploaded"))
	}
	if _, err := c.Cancel(ctx, id); err != nil {
		t.Fatalf("Cancel: %v", err)
	}
	var streamed []string
	if err := c.StreamEvents(ctx, id, 0, func(e belay.Event) error {
		streamed = append(streamed, e.Type)
		return nil
	}); err != nil {
		t.Fatalf("StreamEvents: %v", err)
	}

	readBack := func(tb testing.TB, c *httpapi.Client) wire.RunView {
		tb.Helper()
		run, err := c.GetRun(ctx, id)
		if err != nil {
			tb.Fatalf("GetRun: %v", err)
		}
		if run.Status != belay.StatusCancelled || !run.CancelRequested {
			tb.Errorf("run is %s (cancelRequested %v, reason %q); want cancelled", run.Status, run.CancelRequested, run.Reason)
		}
		if !slices.Equal(run.Artifacts, []string{"transcript.jsonl"}) {
			tb.Errorf("run artifacts %q; want [transcript.jsonl]", run.Artifacts)
		}
		page, err := c.Events(ctx, id, 0, 0)
		if err != nil {
			tb.Fatalf("Events: %v", err)
		}
		var types []string
		for i, e := range page.Events {
			if e.Seq != int64(i+1) {
				tb.Errorf("event %d has seq %d; want 1, 2, 3, ...", i, e.Seq)
			}
			types = append(types, e.Type)
		}
		if len(types) < 4 || types[0] != belay.EventRunQueued || types[len(types)-1] != belay.EventRunCancelled ||
			!slices.Contains(types, belay.EventRunStarted) || !slices.Contains(types, "run.cancel_requested") {
			tb.Errorf("events %q; want run.queued first, run.started, run.cancel_requested, and run.cancelled last", types)
		}
		if int64(len(page.Events)) != run.LastSeq {
			tb.Errorf("%d events listed; the run's lastSeq is %d", len(page.Events), run.LastSeq)
		}
		got, err := c.GetArtifact(ctx, id, "transcript.jsonl")
		if err != nil || strings.TrimSpace(string(got)) != marker {
			tb.Errorf("GetArtifact(transcript.jsonl) = %q, %v; want the sandbox's transcript", got, err)
		}
		list, err := c.ListRuns(ctx, httpapi.ListRunsOptions{Status: belay.StatusCancelled})
		if err != nil || len(list.Runs) != 1 || list.Runs[0].RunID != id {
			tb.Errorf("ListRuns(status cancelled) = %+v, %v; want the one run", list.Runs, err)
		}
		return run
	}
	run := readBack(t, c)
	if streamed[len(streamed)-1] != belay.EventRunCancelled {
		t.Errorf("the stream ended with %q; want run.cancelled", streamed[len(streamed)-1])
	}

	// The artifact is an object in the bucket, and nothing went to the
	// data directory's database or artifacts folder.
	obj, err := s3c.GetObject(ctx, &awss3.GetObjectInput{Bucket: aws.String(bucket), Key: aws.String("runs/" + id + "/transcript.jsonl")})
	if err != nil {
		t.Fatalf("the transcript is not in the bucket: %v", err)
	}
	body, _ := io.ReadAll(obj.Body)
	obj.Body.Close()
	if strings.TrimSpace(string(body)) != marker {
		t.Errorf("bucket object holds %q; want the transcript", body)
	}
	for _, name := range []string{"belay.db", "artifacts"} {
		if _, err := os.Stat(filepath.Join(cfg.DataDir, name)); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("%s exists in the data directory (%v); want runs and artifacts on the AWS adapters only", name, err)
		}
	}

	// The run outlives the process: a second start on the same table (now
	// without --create-table) reads it back unchanged.
	if err := m.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	cfg.Storage.CreateTable = false
	again := embeddedtest.Start(t, cfg)
	if after := readBack(t, clientOf(t, again)); after.LastSeq != run.LastSeq || after.Status != run.Status {
		t.Errorf("after a restart the run is %s with lastSeq %d; want %s with %d", after.Status, after.LastSeq, run.Status, run.LastSeq)
	}

	// No secret reached the table, the bucket or the logs.
	var stored strings.Builder
	scan := dynamodb.NewScanPaginator(ddb, &dynamodb.ScanInput{TableName: aws.String(table)})
	items := 0
	for scan.HasMorePages() {
		page, err := scan.NextPage(ctx)
		if err != nil {
			t.Fatalf("scan %s: %v", table, err)
		}
		for _, it := range page.Items {
			items++
			storeTestText(&stored, &ddbtypes.AttributeValueMemberM{Value: it})
		}
	}
	if items == 0 {
		t.Fatalf("table %s is empty; want the run's items", table)
	}
	for _, secret := range []string{controlToken, providerKey} {
		for where, text := range map[string]string{"the table": stored.String(), "the logs": logs.String()} {
			if strings.Contains(text, secret) {
				t.Errorf("a secret reached %s", where)
			}
		}
	}
}

// TestServeStorageRefused checks that a storage setting that cannot work
// stops the start with a message naming the setting, the endpoint, the
// table or the bucket: at New for what the configuration alone shows, and
// at Run, before listening, for what only the peer can answer.
func TestServeStorageRefused(t *testing.T) {
	closedPort := func(tb testing.TB) string {
		tb.Helper()
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			tb.Fatal(err)
		}
		addr := ln.Addr().String()
		ln.Close()
		return "http://" + addr
	}
	configTests := []struct {
		name    string
		storage embedded.StorageConfig
		want    []string
	}{
		{"dynamodb without a table", embedded.StorageConfig{Store: "dynamodb"}, []string{"BELAY_DYNAMODB_TABLE", "--table"}},
		{"unknown store", embedded.StorageConfig{Store: "postgres"}, []string{"BELAY_STORE", `"postgres"`, "sqlite or dynamodb"}},
		{"table with the sqlite store", embedded.StorageConfig{Table: "t"}, []string{"BELAY_DYNAMODB_TABLE", "the store is sqlite"}},
		{"create-table with the sqlite store", embedded.StorageConfig{CreateTable: true}, []string{"--create-table"}},
		{"endpoint that nothing uses", embedded.StorageConfig{AWSEndpoint: "http://127.0.0.1:8000"}, []string{"BELAY_AWS_ENDPOINT", "nothing uses AWS"}},
		{"endpoint without a scheme", embedded.StorageConfig{Store: "dynamodb", Table: "t", AWSEndpoint: "127.0.0.1:8000"},
			[]string{"BELAY_AWS_ENDPOINT", "http(s)://host:port"}},
		{"endpoint with a path", embedded.StorageConfig{Bucket: "b", S3Endpoint: "http://127.0.0.1:9000/x"},
			[]string{"BELAY_S3_ENDPOINT", "no user, path"}},
		{"s3 endpoint without a bucket", embedded.StorageConfig{Store: "dynamodb", Table: "t", S3Endpoint: "http://127.0.0.1:9000"},
			[]string{"BELAY_S3_ENDPOINT", "no bucket"}},
	}
	for _, tt := range configTests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := embeddedtest.Config(t, nil)
			cfg.Storage = tt.storage
			_, err := embedded.New(cfg)
			if err == nil {
				t.Fatal("New accepted the configuration")
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("New: %v; want it to mention %q", err, w)
				}
			}
		})
	}

	startTests := []struct {
		name string
		// setup returns the storage to start with and what the error
		// must mention.
		setup func(tb testing.TB) (embedded.StorageConfig, []string)
	}{
		{"unreachable DynamoDB endpoint", func(tb testing.TB) (embedded.StorageConfig, []string) {
			endpoint := closedPort(tb)
			return embedded.StorageConfig{Store: "dynamodb", Table: "runs", AWSEndpoint: endpoint},
				[]string{"DynamoDB at " + endpoint, "table runs", "did not answer"}
		}},
		{"unreachable S3 endpoint", func(tb testing.TB) (embedded.StorageConfig, []string) {
			endpoint := closedPort(tb)
			return embedded.StorageConfig{Bucket: "arts", S3Endpoint: endpoint},
				[]string{"S3 at " + endpoint, "bucket arts", "did not answer"}
		}},
		{"missing bucket", func(tb testing.TB) (embedded.StorageConfig, []string) {
			endpoint, _, _ := storeTestS3(tb)
			return embedded.StorageConfig{Bucket: "no-such-bucket", S3Endpoint: endpoint},
				[]string{"S3 bucket no-such-bucket", "does not exist at " + endpoint}
		}},
		{"missing table without --create-table", func(tb testing.TB) (embedded.StorageConfig, []string) {
			endpoint := storeTestDynamoEndpoint(tb)
			table, _ := storeTestTable(tb, endpoint)
			return embedded.StorageConfig{Store: "dynamodb", Table: table, AWSEndpoint: endpoint},
				[]string{"table " + table + " does not exist at " + endpoint, "--create-table"}
		}},
	}
	for _, tt := range startTests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := embeddedtest.Config(t, nil)
			var want []string
			cfg.Storage, want = tt.setup(t)
			err := storeTestStartErr(t, cfg)
			if err == nil {
				t.Fatal("Run returned nil; want a refusal")
			}
			for _, w := range want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("Run: %v; want it to mention %q", err, w)
				}
			}
		})
	}
}
