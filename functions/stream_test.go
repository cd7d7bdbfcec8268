package functions_test

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/events"
	"github.com/belay-dev/belay/internal/belay"
	"github.com/belay-dev/belay/internal/rie"
)

// The emulator reads a streamed response whole before it answers (it has
// no response-streaming invoke), so these tests see the stream function's
// answer in the response-streaming format — JSON prelude, eight NUL
// bytes, body — once the handler has finished. That streaming really is
// incremental is shown on the adapter itself, in internal/apigateway.
func TestStream(t *testing.T) {
	p := startPeers(t)
	fn := rie.Start(t, "stream", p.env(map[string]string{"BELAY_TOKEN": controlToken}))

	// A finished run: queued, started, two sandbox events, completed.
	done := newRunID()
	seedRun(t, p.store, done)
	startRun(t, p.store, done)
	if _, err := p.store.AppendEvents(t.Context(), done, "", []belay.EventInput{
		{Time: time.Now().UTC(), Type: belay.EventSandboxReady, Data: json.RawMessage(`{}`)},
		{Time: time.Now().UTC(), Type: belay.EventAgentMessage, Data: json.RawMessage(`{"text":"on it"}`)},
	}); err != nil {
		t.Fatal(err)
	}
	now := time.Now().UTC()
	if _, err := p.store.Transition(t.Context(), done, belay.Transition{To: belay.StatusCompleted, At: now,
		Events: []belay.EventInput{{Time: now, Type: belay.EventRunCompleted, Data: json.RawMessage(`{}`)}}}); err != nil {
		t.Fatal(err)
	}
	all := runEvents(t, p.store, done)

	t.Run("SSE resumes after Last-Event-ID", func(t *testing.T) {
		resp := streamed(t, fn, apiEvent(t, "stream", "events-sse.json", forRun(done)))
		if resp.StatusCode != 200 || !strings.HasPrefix(resp.Header("Content-Type"), "text/event-stream") {
			t.Fatalf("prelude %d %q, want 200 text/event-stream", resp.StatusCode, resp.Header("Content-Type"))
		}
		ids := sseIDs(string(resp.Body))
		// Last-Event-ID: 1 in the testdata: everything after the first.
		if len(ids) != len(all)-1 || ids[0] != "2" || ids[len(ids)-1] != jsonSeq(all[len(all)-1].Seq) {
			t.Fatalf("ids %v after Last-Event-ID 1, want 2..%d\n%s", ids, all[len(all)-1].Seq, resp.Body)
		}
		if !strings.Contains(string(resp.Body), "event: run.completed") || strings.Contains(string(resp.Body), "retry:") {
			t.Fatalf("a finished run's stream must end with its terminal event and no retry hint:\n%s", resp.Body)
		}
	})
	recordInit(t, fn)

	t.Run("a caught-up reader of a finished run gets 204", func(t *testing.T) {
		last := jsonSeq(all[len(all)-1].Seq)
		resp := streamed(t, fn, apiEvent(t, "stream", "events-sse.json", forRun(done), withHeader("Last-Event-ID", last)))
		if resp.StatusCode != 204 || len(resp.Body) != 0 {
			t.Fatalf("Last-Event-ID %s of a finished run: %d %q, want 204 and no body, so an EventSource stops", last, resp.StatusCode, resp.Body)
		}
	})

	t.Run("NDJSON", func(t *testing.T) {
		resp := streamed(t, fn, apiEvent(t, "stream", "events-ndjson.json", forRun(done)))
		lines := strings.Split(strings.TrimSpace(string(resp.Body)), "\n")
		if resp.StatusCode != 200 || len(lines) != len(all) {
			t.Fatalf("NDJSON: %d with %d lines, want 200 with %d\n%s", resp.StatusCode, len(lines), len(all), resp.Body)
		}
	})

	t.Run("unknown run", func(t *testing.T) {
		resp := streamed(t, fn, apiEvent(t, "stream", "events-sse.json"))
		if resp.StatusCode != 404 || errorCode(t, string(resp.Body)) != belay.CodeNotFound {
			t.Fatalf("unknown run: %d %s, want 404 not_found", resp.StatusCode, resp.Body)
		}
	})

	t.Run("no token", func(t *testing.T) {
		resp := streamed(t, fn, apiEvent(t, "stream", "events-sse.json", forRun(done), withHeader("Authorization", "Bearer wrong-token-wrong-token")))
		if resp.StatusCode != 401 {
			t.Fatalf("wrong token: %d %s, want 401", resp.StatusCode, resp.Body)
		}
	})

	t.Run("a session's stream across its turns", func(t *testing.T) {
		// A closed session whose one turn's run has completed, its end not
		// yet recorded on the session (the api function records it when it
		// next reads the session): the stream function reads the turn's
		// state from its run, writing nothing, and the stream ends by
		// itself, well before this function's limit.
		ctx := t.Context()
		now := time.Now().UTC()
		createSession(t, p.store, now)
		turnRun := newRunID()
		seedRun(t, p.store, turnRun)
		if _, err := p.store.StartTurn(ctx, testdataSessionID, belay.Turn{Turn: 1, RunID: turnRun, Status: belay.StatusQueued, Text: "Fix add.", CreatedAt: now}); err != nil {
			t.Fatal(err)
		}
		startRun(t, p.store, turnRun)
		if _, err := p.store.AppendEvents(ctx, turnRun, "", []belay.EventInput{
			{Time: now, Type: belay.EventAgentMessage, Data: json.RawMessage(`{"text":"on it"}`)},
		}); err != nil {
			t.Fatal(err)
		}
		if _, err := p.store.Transition(ctx, turnRun, belay.Transition{To: belay.StatusCompleted, At: now,
			Events: []belay.EventInput{{Time: now, Type: belay.EventRunCompleted, Data: json.RawMessage(`{}`)}}}); err != nil {
			t.Fatal(err)
		}
		if _, err := p.store.CloseSession(ctx, testdataSessionID, now); err != nil {
			t.Fatal(err)
		}
		before, err := p.store.GetSession(ctx, testdataSessionID)
		if err != nil || before.Turns[0].Status.Terminal() {
			t.Fatalf("setup: session %+v, %v; want its turn's end unrecorded", before, err)
		}
		turnEvents := runEvents(t, p.store, turnRun)

		limited := rie.Start(t, "stream", p.env(map[string]string{"BELAY_TOKEN": controlToken, "BELAY_STREAM_MAX_SECONDS": "5"}))
		resp := streamed(t, limited, apiEvent(t, "stream", "session-events-sse.json"))
		body := string(resp.Body)
		if resp.StatusCode != 200 || !strings.HasPrefix(resp.Header("Content-Type"), "text/event-stream") {
			t.Fatalf("session SSE: %d %q\n%s", resp.StatusCode, resp.Header("Content-Type"), body)
		}
		// Last-Event-ID 1000000001 in the testdata: turn 1's events after its first.
		ids := sseIDs(body)
		if len(ids) != len(turnEvents)-1 || ids[0] != jsonSeq(belay.SessionSeq(1, 2)) || ids[len(ids)-1] != jsonSeq(belay.SessionSeq(1, turnEvents[len(turnEvents)-1].Seq)) {
			t.Fatalf("ids %v after Last-Event-ID 1000000001; want turn 1's events 2..%d\n%s", ids, turnEvents[len(turnEvents)-1].Seq, body)
		}
		if strings.Contains(body, "retry:") || !strings.Contains(body, "event: run.completed") {
			t.Fatalf("a closed session's stream must end by itself after its last event, not at the limit:\n%s", body)
		}
		after, err := p.store.GetSession(ctx, testdataSessionID)
		if err != nil || after.Version != before.Version {
			t.Fatalf("the stream function wrote the session: version %d → %d (%v)", before.Version, after.Version, err)
		}
		resp = streamed(t, fn, apiEvent(t, "stream", "session-events-sse.json", func(ev *events.APIGatewayProxyRequest) {
			ev.Path = strings.ReplaceAll(ev.Path, testdataSessionID, "ses_nosuchsessionaaaaaaaaaaaaa")
			ev.PathParameters["id"] = "ses_nosuchsessionaaaaaaaaaaaaa"
		}))
		if resp.StatusCode != 404 || errorCode(t, string(resp.Body)) != belay.CodeNotFound {
			t.Fatalf("unknown session: %d %s, want 404 not_found", resp.StatusCode, resp.Body)
		}
	})

	t.Run("closes with a retry hint", func(t *testing.T) {
		// A running run never ends on its own: the stream closes itself at
		// BELAY_STREAM_MAX_SECONDS with a retry hint, so an EventSource
		// reconnects with Last-Event-ID.
		short := rie.Start(t, "stream", p.env(map[string]string{"BELAY_TOKEN": controlToken, "BELAY_STREAM_MAX_SECONDS": "1"}))
		live := newRunID()
		seedRun(t, p.store, live)
		startRun(t, p.store, live)
		resp := streamed(t, short, apiEvent(t, "stream", "events-sse.json", forRun(live), withHeader("Last-Event-ID", "0")))
		body := string(resp.Body)
		if resp.StatusCode != 200 || !strings.HasSuffix(body, "retry: 1000\n\n") {
			t.Fatalf("live stream at its limit: %d\n%q\nwant it to end with a retry hint", resp.StatusCode, body)
		}
		if ids := sseIDs(body); len(ids) != 2 {
			t.Fatalf("ids %v, want the live run's 2 events before the hint", ids)
		}
	})
}

// sseIDs returns the id fields of an SSE body, in order.
func sseIDs(body string) []string {
	var ids []string
	for line := range strings.SplitSeq(body, "\n") {
		if id, ok := strings.CutPrefix(line, "id: "); ok {
			ids = append(ids, id)
		}
	}
	return ids
}

func jsonSeq(n int64) string {
	b, _ := json.Marshal(n)
	return string(b)
}
