package sqlite_test

import (
	"bytes"
	"database/sql"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/belay-dev/belay/internal/belay"
	"github.com/belay-dev/belay/internal/sqlite"
	"github.com/belay-dev/belay/internal/storetest"
)

// openStore opens a fresh database file in the test's temporary directory
// and closes it when the test ends.
func openStore(tb testing.TB, opts storetest.Options) belay.Store {
	tb.Helper()
	s, err := sqlite.Open(tb.Context(), filepath.Join(tb.TempDir(), "belay.db"), sqlite.Options{EventBufferSize: opts.EventBufferSize})
	if err != nil {
		tb.Fatalf("sqlite.Open: %v", err)
	}
	tb.Cleanup(func() {
		if err := s.Close(); err != nil {
			tb.Errorf("Close: %v", err)
		}
	})
	return s
}

func TestConformance(t *testing.T) {
	storetest.Run(t, openStore)
}

var t0 = time.Date(2031, time.March, 4, 5, 6, 7, 123456789, time.UTC)

// testRun returns a queued run whose instruction and file hold secret.
func testRun(id, secret string) belay.Run {
	req := belay.RunRequest{
		Instruction: "Fix the failing test " + secret,
		Model:       "test-model",
		Files:       []belay.File{{Path: "calc.py", Content: "# " + secret + "\n"}},
		AllowedPaths: []string{
			"calc.py",
		},
		Checks:          [][]string{{"python3", "-m", "pytest", "-q"}},
		MaxSteps:        3,
		WallTimeSeconds: 60,
		Approval:        belay.ApprovalConfig{Policy: belay.PolicyDenyAll},
	}
	return belay.Run{ID: id, Status: belay.StatusQueued, Request: req, RequestHash: "hash-" + id, CreatedAt: t0, Usage: belay.Usage{MaxRequests: req.MaxRequests()}}
}

func TestReopenKeepsEverything(t *testing.T) {
	ctx := t.Context()
	path := filepath.Join(t.TempDir(), "data", "belay.db")
	s, err := sqlite.Open(ctx, path, sqlite.Options{EventBufferSize: 5})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	if _, _, err := s.CreateRun(ctx, testRun("run-1", "x"), "key-1"); err != nil {
		t.Fatalf("CreateRun: %v", err)
	}
	if _, err := s.Transition(ctx, "run-1", belay.Transition{To: belay.StatusRunning, At: t0.Add(time.Second),
		Events: []belay.EventInput{{Type: belay.EventRunStarted}}}); err != nil {
		t.Fatalf("Transition: %v", err)
	}
	if _, err := s.AppendEvents(ctx, "run-1", "batch-1", []belay.EventInput{
		{Time: t0.Add(2 * time.Second), Type: belay.EventToolCall, Data: json.RawMessage(`{"tool":"read_file"}`)},
	}); err != nil {
		t.Fatalf("AppendEvents: %v", err)
	}
	if err := s.ActivateCapability(ctx, belay.Capability{RunID: "run-1", Model: "test-model", ExpiresAt: t0.Add(time.Hour), MaxRequests: 5}); err != nil {
		t.Fatalf("ActivateCapability: %v", err)
	}
	if res, err := s.ConsumeModelRequest(ctx, "run-1", "test-model", t0.Add(3*time.Second)); err != nil || res.Outcome != belay.ConsumeOK {
		t.Fatalf("Consume = %+v, %v", res, err)
	}
	if _, err := s.CreateApproval(ctx, belay.Approval{ID: "appr-1", RunID: "run-1", Tool: "shell", Status: belay.ApprovalPending,
		RequestedAt: t0.Add(4 * time.Second), ExpiresAt: t0.Add(124 * time.Second)}); err != nil {
		t.Fatalf("CreateApproval: %v", err)
	}
	if err := s.RecordUsage(ctx, "run-1", belay.UsageDelta{ModelRequests: 1, PromptTokens: 10, CompletionTokens: 2}); err != nil {
		t.Fatalf("RecordUsage: %v", err)
	}
	beforeRun, _ := s.GetRun(ctx, "run-1")
	beforeLog, _ := s.ListEvents(ctx, "run-1", 0, 100)
	if err := s.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}

	s, err = sqlite.Open(ctx, path, sqlite.Options{EventBufferSize: 5})
	if err != nil {
		t.Fatalf("reopen: %v", err)
	}
	defer s.Close()
	afterRun, err := s.GetRun(ctx, "run-1")
	if err != nil {
		t.Fatalf("GetRun after reopen: %v", err)
	}
	b1, _ := json.Marshal(beforeRun)
	b2, _ := json.Marshal(afterRun)
	if !bytes.Equal(b1, b2) || afterRun.RequestHash != beforeRun.RequestHash {
		t.Fatalf("run changed across reopen:\nbefore %s\nafter  %s", b1, b2)
	}
	afterLog, err := s.ListEvents(ctx, "run-1", 0, 100)
	if err != nil {
		t.Fatalf("ListEvents after reopen: %v", err)
	}
	l1, _ := json.Marshal(beforeLog)
	l2, _ := json.Marshal(afterLog)
	if !bytes.Equal(l1, l2) || afterLog.LastSeq != 4 {
		t.Fatalf("log changed across reopen:\nbefore %s\nafter  %s", l1, l2)
	}
	c, err := s.GetCapability(ctx, "run-1")
	if err != nil || c.UsedRequests != 1 || c.State != belay.CapabilityActive {
		t.Fatalf("capability after reopen = %+v, %v; want active with 1 used", c, err)
	}
	if a, err := s.GetApproval(ctx, "run-1", "appr-1"); err != nil || a.Status != belay.ApprovalPending {
		t.Fatalf("approval after reopen = %+v, %v", a, err)
	}
	// Idempotency keys and batch ids survive too: repeats still store nothing.
	if r, created, err := s.CreateRun(ctx, testRun("run-2", "x"), "key-1"); err == nil || created {
		t.Fatalf("CreateRun with a used key and another hash after reopen = %s created %v, %v; want conflict", r.ID, created, err)
	}
	if evs, err := s.AppendEvents(ctx, "run-1", "batch-1", []belay.EventInput{{Type: belay.EventToolCall}}); err != nil || len(evs) != 1 || evs[0].Seq != 3 {
		t.Fatalf("replayed batch after reopen = %v, %v; want the first call's event 3", evs, err)
	}
	if got, _ := s.GetRun(ctx, "run-1"); got.LastSeq != 4 {
		t.Fatalf("replayed batch appended: lastSeq %d", got.LastSeq)
	}
}

func TestOpenCreatesPrivateFiles(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state")
	path := filepath.Join(dir, "belay.db")
	s := openAt(t, path)
	if _, _, err := s.CreateRun(t.Context(), testRun("run-1", "x"), ""); err != nil {
		t.Fatalf("CreateRun: %v", err)
	}
	for _, c := range []struct {
		path string
		mode os.FileMode
	}{{dir, 0o700}, {path, 0o600}, {path + "-wal", 0o600}} {
		fi, err := os.Stat(c.path)
		if err != nil {
			t.Fatalf("stat: %v", err)
		}
		if got := fi.Mode().Perm(); got != c.mode {
			t.Errorf("%s has mode %v, want %v", filepath.Base(c.path), got, c.mode)
		}
	}
}

// openAt opens the store at path and closes it when the test ends.
func openAt(tb testing.TB, path string) *sqlite.Store {
	tb.Helper()
	s, err := sqlite.Open(tb.Context(), path, sqlite.Options{})
	if err != nil {
		tb.Fatalf("Open: %v", err)
	}
	tb.Cleanup(func() { s.Close() })
	return s
}

func TestSchemaVersion(t *testing.T) {
	ctx := t.Context()
	path := filepath.Join(t.TempDir(), "belay.db")
	s, err := sqlite.Open(ctx, path, sqlite.Options{})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	s.Close()
	if v := userVersion(t, path); v != sqlite.SchemaVersion {
		t.Fatalf("user_version after Open = %d, want %d", v, sqlite.SchemaVersion)
	}
	// Reopening an up-to-date database migrates nothing and keeps working.
	s = openAt(t, path)
	if _, _, err := s.CreateRun(ctx, testRun("run-1", "x"), ""); err != nil {
		t.Fatalf("CreateRun after reopen: %v", err)
	}
	s.Close()

	// A database from a newer belay is refused, not misread.
	setUserVersion(t, path, sqlite.SchemaVersion+1)
	if _, err := sqlite.Open(ctx, path, sqlite.Options{}); err == nil || !strings.Contains(err.Error(), "newer") {
		t.Fatalf("Open(newer schema) = %v, want a refusal naming the newer version", err)
	}
}

// TestMigrateRequestsApart opens a database as schema version 6 left it,
// with the request in the runs row, and finds the run whole after the
// migration that keeps requests in a table of their own; the runs table
// no longer has the column, and the run takes events and model calls.
func TestMigrateRequestsApart(t *testing.T) {
	ctx := t.Context()
	path := filepath.Join(t.TempDir(), "belay.db")
	db, err := sql.Open("sqlite", sqlite.DSN(path, false))
	if err != nil {
		t.Fatalf("sql.Open: %v", err)
	}
	for i, m := range sqlite.MigrationsTo(6) {
		if _, err := db.Exec(m); err != nil {
			t.Fatalf("migration %d: %v", i+1, err)
		}
	}
	run := testRun("run-old", "CANARY-migrate")
	request, err := json.Marshal(run.Request)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(`INSERT INTO runs (id, status, request, request_hash, created_at, updated_at, max_requests, last_seq)
		VALUES (?, 'running', ?, ?, ?, ?, ?, 0)`, run.ID, string(request), run.RequestHash, t0.UnixNano(), t0.UnixNano(), run.Usage.MaxRequests); err != nil {
		t.Fatalf("insert v6 run: %v", err)
	}
	if _, err := db.Exec("PRAGMA user_version = 6"); err != nil {
		t.Fatal(err)
	}
	db.Close()

	s := openAt(t, path)
	got, err := s.GetRun(ctx, run.ID)
	if err != nil {
		t.Fatalf("GetRun after migration: %v", err)
	}
	if !reflect.DeepEqual(got.Request, run.Request) || got.Status != belay.StatusRunning {
		t.Fatalf("run after migration = %s %+v, want running %+v", got.Status, got.Request, run.Request)
	}
	if _, err := s.AppendEvents(ctx, run.ID, "", []belay.EventInput{{Time: t0, Type: "bench.step"}}); err != nil {
		t.Fatalf("AppendEvents after migration: %v", err)
	}
	if err := s.ActivateCapability(ctx, belay.Capability{RunID: run.ID, Model: "test-model", State: belay.CapabilityActive, ExpiresAt: t0.Add(time.Hour), MaxRequests: 5}); err != nil {
		t.Fatalf("ActivateCapability: %v", err)
	}
	if res, err := s.SpendModelRequest(ctx, run.ID, belay.ModelCall{Model: "test-model"}, t0); err != nil || res.Outcome != belay.ConsumeOK {
		t.Fatalf("SpendModelRequest after migration = %+v, %v", res, err)
	}
	page, err := s.ListEvents(ctx, run.ID, 0, 0)
	if err != nil || len(page.Events) != 2 || page.Events[1].Type != belay.EventModelRequest {
		t.Fatalf("events after migration = %+v, %v; want the appended one and model.request", page.Events, err)
	}
	s.Close()

	db, err = sql.Open("sqlite", path)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var n int
	if err := db.QueryRow("SELECT count(*) FROM pragma_table_info('runs') WHERE name = 'request'").Scan(&n); err != nil || n != 0 {
		t.Fatalf("runs.request columns after migration = %d, %v; want 0", n, err)
	}
	if v := userVersion(t, path); v != sqlite.SchemaVersion {
		t.Fatalf("user_version = %d, want %d", v, sqlite.SchemaVersion)
	}
}

// userVersion reads PRAGMA user_version of the database at path.
func userVersion(tb testing.TB, path string) int {
	tb.Helper()
	db, err := sql.Open("sqlite", path)
	if err != nil {
		tb.Fatalf("sql.Open: %v", err)
	}
	defer db.Close()
	var v int
	if err := db.QueryRow("PRAGMA user_version").Scan(&v); err != nil {
		tb.Fatalf("user_version: %v", err)
	}
	return v
}

func setUserVersion(tb testing.TB, path string, v int) {
	tb.Helper()
	db, err := sql.Open("sqlite", path)
	if err != nil {
		tb.Fatalf("sql.Open: %v", err)
	}
	defer db.Close()
	if _, err := db.Exec(fmt.Sprintf("PRAGMA user_version = %d", v)); err != nil {
		tb.Fatalf("set user_version: %v", err)
	}
}

func TestOpenRejects(t *testing.T) {
	dir := t.TempDir()
	for _, c := range []struct {
		name string
		path string
		opts sqlite.Options
	}{
		{"empty path", "", sqlite.Options{}},
		{"query in path", filepath.Join(dir, "belay.db?mode=ro"), sqlite.Options{}},
		{"negative buffer", filepath.Join(dir, "belay.db"), sqlite.Options{EventBufferSize: -1}},
		{"directory as file", dir, sqlite.Options{}},
	} {
		t.Run(c.name, func(t *testing.T) {
			if s, err := sqlite.Open(t.Context(), c.path, c.opts); err == nil {
				s.Close()
				t.Fatal("Open succeeded")
			}
		})
	}
}

// TestNoSecretsInLogsOrErrors drives the store through its paths, errors
// included, with a logger at debug level, and checks that the request's
// content never reaches the log or an error.
func TestNoSecretsInLogsOrErrors(t *testing.T) {
	const canary = "CANARY-sqlite-b41d2e"
	var logs bytes.Buffer
	ctx := t.Context()
	s, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "belay.db"), sqlite.Options{
		Logger: slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
	})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	defer s.Close()
	var errs []error
	record := func(err error) { errs = append(errs, err) }
	_, _, err = s.CreateRun(ctx, testRun("run-1", canary), "key")
	record(err)
	other := testRun("run-2", canary+"-other")
	_, _, err = s.CreateRun(ctx, other, "key")
	record(err)
	_, _, err = s.CreateRun(ctx, testRun("run-1", canary), "")
	record(err)
	_, err = s.Transition(ctx, "run-1", belay.Transition{To: belay.StatusCompleted, At: t0})
	record(err)
	_, err = s.AppendEvents(ctx, "run-1", "", []belay.EventInput{{Type: belay.EventAgentMessage, Data: json.RawMessage(`"` + canary)}})
	record(err)
	_, err = s.CreateApproval(ctx, belay.Approval{ID: "a", RunID: "run-1", Tool: "shell", Arguments: json.RawMessage(`{"command":"` + canary), Status: belay.ApprovalPending})
	record(err)
	_, err = s.GetRun(ctx, canary)
	_ = err // the caller's own id may come back; it is not a secret of the run
	if len(errs) < 5 {
		t.Fatal("too few operations recorded")
	}
	failures := 0
	for _, err := range errs {
		if err == nil {
			continue
		}
		failures++
		if strings.Contains(err.Error(), canary) || strings.Contains(belay.ErrorMessage(err), canary) {
			t.Errorf("error repeats request content: %v", err)
		}
	}
	if failures < 4 {
		t.Fatalf("only %d of the operations failed; the test needs its error paths", failures)
	}
	if logs.Len() == 0 {
		t.Fatal("no log lines: the test would pass without looking")
	}
	if strings.Contains(logs.String(), canary) {
		t.Fatalf("log repeats request content:\n%s", logs.String())
	}
}
