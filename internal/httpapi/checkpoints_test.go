package httpapi_test

import (
	"bytes"
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/belay-dev/belay/internal/belay"
	"github.com/belay-dev/belay/internal/wire"
)

// checkpointBody is a checkpoint of the run's attempt, with a binary file
// in its workspace change.
func checkpointBody(tb testing.TB, runID string, attempt int, seq int64, pending string) []byte {
	tb.Helper()
	text := "print('hi')\n"
	c := wire.Checkpoint{
		Version: wire.CheckpointVersion, RunID: runID, Attempt: attempt, Seq: seq, Step: int(seq),
		Agent: json.RawMessage(`{"messages":[{"role":"user","content":"fix it"}]}`),
		Workspace: wire.WorkspaceChange{Files: []wire.FileChange{
			{Path: "calc.py", Text: &text},
			{Path: "data.bin", Binary: []byte{0, 1, 2, 0xff}},
			{Path: "old.py", Deleted: true},
		}},
	}
	if pending != "" {
		c.Pending = &wire.PendingCall{ID: "call_1", Name: pending, Step: int(seq), Since: time.Unix(1, 0).UTC()}
	}
	b, err := json.Marshal(c)
	if err != nil {
		tb.Fatal(err)
	}
	return b
}

func TestCheckpointRoutes(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	id, set := h.startRun(t, "", 5)
	put := func(seq string, bearer string, body []byte) answer {
		return h.do(t, "PUT", "/internal/v1/runs/"+id+"/checkpoints/"+seq, bearer, body, nil)
	}
	latest := func() answer { return h.do(t, "GET", "/"+wire.LatestCheckpointPath(id), set.Events, nil, nil) }
	stored := func() []string {
		list, err := h.artifacts.ListArtifacts(t.Context(), id)
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, a := range list {
			names = append(names, a.Name)
		}
		return names
	}

	if a := latest(); a.status != http.StatusNotFound {
		t.Fatalf("latest before any checkpoint: %d %s, want 404", a.status, a.body)
	}
	one := checkpointBody(t, id, 1, 1, "shell")
	bad := []struct {
		name   string
		seq    string
		bearer string
		body   []byte
		status int
	}{
		{"model token", "1", set.Model, one, http.StatusUnauthorized},
		{"approvals token", "1", set.Approvals, one, http.StatusUnauthorized},
		{"no token", "1", "", one, http.StatusUnauthorized},
		{"seq not a number", "x", set.Events, one, http.StatusBadRequest},
		{"seq zero", "0", set.Events, checkpointBody(t, id, 1, 0, ""), http.StatusBadRequest},
		{"seq of another route", "2", set.Events, one, http.StatusBadRequest},
		{"another run's", "1", set.Events, checkpointBody(t, "run_other", 1, 1, ""), http.StatusBadRequest},
		{"unknown field", "1", set.Events, []byte(strings.Replace(string(one), `"version"`, `"extra":1,"version"`, 1)), http.StatusBadRequest},
		{"version", "1", set.Events, []byte(strings.Replace(string(one), `"version":1`, `"version":9`, 1)), http.StatusBadRequest},
		{"too large", "1", set.Events, bytes.Repeat([]byte(" "), belay.MaxCheckpointBytes+1), http.StatusRequestEntityTooLarge},
		{"another attempt", "1", set.Events, checkpointBody(t, id, 2, 1, ""), http.StatusConflict},
	}
	for _, tt := range bad {
		if a := put(tt.seq, tt.bearer, tt.body); a.status != tt.status {
			t.Errorf("%s: %d %s, want %d", tt.name, a.status, a.body, tt.status)
		}
	}
	if got := stored(); len(got) != 0 {
		t.Fatalf("refused checkpoints left artifacts %v", got)
	}

	if a := put("1", set.Events, one); a.status != http.StatusNoContent {
		t.Fatalf("checkpoint 1: %d %s", a.status, a.body)
	}
	if a := latest(); a.status != http.StatusOK || !bytes.Equal(a.body, one) {
		t.Fatalf("latest after checkpoint 1: %d, %d bytes; want 200 and the checkpoint as uploaded", a.status, len(a.body))
	}
	var view wire.RunView
	h.public(t, "GET", "/v1/runs/"+id, "").decode(t, &view)
	if c := view.Checkpoint; c == nil || c.Seq != 1 || c.Attempt != 1 || c.Pending != "shell" || c.Size != int64(len(one)) || !c.Resumable() {
		t.Fatalf("run view checkpoint %+v; want seq 1 of attempt 1, shell pending, %d bytes", view.Checkpoint, len(one))
	}
	if view.Attempt != 1 || len(view.Attempts) != 1 || view.Attempts[0].Attempt != 1 || view.Attempts[0].StartedAt.IsZero() {
		t.Fatalf("run view attempts %d %+v; want attempt 1, started", view.Attempt, view.Attempts)
	}

	two := checkpointBody(t, id, 1, 2, "")
	for range 2 { // the second is a retry: it changes nothing
		if a := put("2", set.Events, two); a.status != http.StatusNoContent {
			t.Fatalf("checkpoint 2: %d %s", a.status, a.body)
		}
	}
	if got, want := stored(), []string{belay.CheckpointArtifactName(1, 2)}; !slices.Equal(got, want) {
		t.Fatalf("artifacts after checkpoint 2: %v, want only %v (the older one pruned)", got, want)
	}
	if a := put("1", set.Events, one); a.status != http.StatusConflict {
		t.Fatalf("checkpoint 1 after 2: %d %s, want 409", a.status, a.body)
	}
	if got, want := stored(), []string{belay.CheckpointArtifactName(1, 2)}; !slices.Equal(got, want) {
		t.Fatalf("artifacts after a stale checkpoint: %v, want %v", got, want)
	}
	if a := latest(); !bytes.Equal(a.body, two) {
		t.Fatalf("latest after a stale upload is not checkpoint 2")
	}

	// A resume: attempt 2 reads attempt 1's last checkpoint and continues
	// the sequence; the lost attempt can no longer save any.
	if _, err := h.store.ResumeRun(t.Context(), id, belay.Resume{From: 1, At: h.clock.Now(), Reason: "sandbox killed"}); err != nil {
		t.Fatal(err)
	}
	if a := latest(); a.status != http.StatusOK || !bytes.Equal(a.body, two) {
		t.Fatalf("latest after the resume: %d; want checkpoint 2", a.status)
	}
	if a := put("3", set.Events, checkpointBody(t, id, 1, 3, "")); a.status != http.StatusConflict {
		t.Fatalf("a checkpoint of the lost attempt: %d %s, want 409", a.status, a.body)
	}
	three := checkpointBody(t, id, 2, 3, "run_check")
	if a := put("3", set.Events, three); a.status != http.StatusNoContent {
		t.Fatalf("checkpoint 3 of attempt 2: %d %s", a.status, a.body)
	}
	if got, want := stored(), []string{belay.CheckpointArtifactName(2, 3)}; !slices.Equal(got, want) {
		t.Fatalf("artifacts after checkpoint 3: %v, want %v", got, want)
	}
	h.public(t, "GET", "/v1/runs/"+id, "").decode(t, &view)
	if view.Attempt != 2 || len(view.Attempts) != 2 || view.Attempts[0].Lost != "sandbox killed" || view.Attempts[0].EndedAt.IsZero() ||
		view.Attempts[1].Attempt != 2 || !view.Attempts[1].StartedAt.Equal(view.Attempts[0].EndedAt) || !view.Attempts[1].EndedAt.IsZero() {
		t.Fatalf("run view attempts after the resume: %d %+v", view.Attempt, view.Attempts)
	}
	// Checkpoints are never listed or served to callers.
	var arts wire.ArtifactList
	h.public(t, "GET", "/v1/runs/"+id+"/artifacts", "").decode(t, &arts)
	if len(arts.Artifacts) != 0 {
		t.Fatalf("public artifact list %+v, want none", arts.Artifacts)
	}
	if a := h.public(t, "GET", "/v1/runs/"+id+"/artifacts/"+belay.CheckpointArtifactName(2, 3), ""); a.status != http.StatusNotFound {
		t.Fatalf("a checkpoint through the public artifact route: %d, want 404", a.status)
	}

	// Once the sandbox is being stopped, or the run is over, nothing more.
	if err := h.store.RevokeCapability(t.Context(), id); err != nil {
		t.Fatal(err)
	}
	if a := put("4", set.Events, checkpointBody(t, id, 2, 4, "")); a.status != http.StatusConflict {
		t.Fatalf("checkpoint after revocation: %d %s, want 409", a.status, a.body)
	}
	h.finishRun(t, id)
	if a := latest(); a.status != http.StatusConflict {
		t.Fatalf("latest of an ended run: %d, want 409", a.status)
	}
	if got, want := stored(), []string{belay.CheckpointArtifactName(2, 3)}; !slices.Equal(got, want) {
		t.Fatalf("artifacts at the end: %v, want %v", got, want)
	}
	if strings.Contains(h.logs.String(), "bt1.") {
		t.Error("a token appears in the log")
	}
}
