package dynamo_test

import (
	"context"
	"crypto/rand"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"

	"github.com/belay-dev/belay/internal/belay"
	"github.com/belay-dev/belay/internal/dynamo"
)

// peer is a fresh table on DynamoDB Local and a store on it.
type peer struct {
	store  *dynamo.Store
	client *dynamodb.Client
	table  string
}

// localClient connects to the DynamoDB Local named by
// BELAY_TEST_DYNAMODB_ENDPOINT, skipping the test when it is unset outside CI.
func localClient(tb testing.TB) *dynamodb.Client {
	tb.Helper()
	endpoint := os.Getenv("BELAY_TEST_DYNAMODB_ENDPOINT")
	if endpoint == "" {
		if os.Getenv("CI") != "" {
			tb.Fatal("BELAY_TEST_DYNAMODB_ENDPOINT is not set; CI must start DynamoDB Local (scripts/peers.sh start)")
		}
		tb.Skip("DynamoDB Local not running: start it with `make peers-start` and `eval $(scripts/peers.sh env)`")
	}
	client, err := dynamo.NewLocalClient(context.Background(), endpoint)
	if err != nil {
		tb.Fatal(err)
	}
	return client
}

// newTable creates a table with a random name and drops it after the test.
func newTable(tb testing.TB, client *dynamodb.Client) string {
	tb.Helper()
	table := "belay-test-" + strings.ToLower(rand.Text()[:16])
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := dynamo.CreateTable(ctx, client, table); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		if _, err := client.DeleteTable(context.Background(), &dynamodb.DeleteTableInput{TableName: aws.String(table)}); err != nil {
			tb.Errorf("drop table %s: %v", table, err)
		}
	})
	return table
}

func newPeer(tb testing.TB, opts dynamo.Options) peer {
	tb.Helper()
	client := localClient(tb)
	table := newTable(tb, client)
	return peer{store: dynamo.New(client, table, opts), client: client, table: table}
}

// t0 is the tests' fixed clock reading.
var t0 = time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)

// newRun builds a queued run as the API would hand it to CreateRun.
func newRun(id string, created time.Time) belay.Run {
	req := belay.RunRequest{
		Instruction:     "Fix the failing test in calc.py",
		Model:           "test-model",
		Files:           []belay.File{{Path: "calc.py", Content: "def add(a, b):\n    return a - b\n"}},
		AllowedPaths:    []string{"calc.py"},
		Checks:          [][]string{{"python3", "-m", "pytest", "-q"}},
		MaxSteps:        3,
		WallTimeSeconds: 60,
		Approval:        belay.ApprovalConfig{Policy: belay.PolicyDenyAll},
	}
	return belay.Run{
		ID:          id,
		Status:      belay.StatusQueued,
		Request:     req,
		RequestHash: "hash-" + id,
		CreatedAt:   created,
		UpdatedAt:   created,
		Usage:       belay.Usage{MaxRequests: req.MaxRequests()},
	}
}

// mustCreate stores a run and fails the test if that does not work.
func mustCreate(tb testing.TB, s belay.Store, r belay.Run) belay.Run {
	tb.Helper()
	got, created, err := s.CreateRun(context.Background(), r, "")
	if err != nil || !created {
		tb.Fatalf("CreateRun(%s) = created %v, %v", r.ID, created, err)
	}
	return got
}
