package embedded_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/belay-dev/belay/internal/belay"
	"github.com/belay-dev/belay/internal/httpapi"
	"github.com/belay-dev/belay/internal/scriptedmodel"
	"github.com/belay-dev/belay/internal/wire"
)

// wsMessage is anything the server sends on a session's WebSocket: an
// event (seq, turn, runId, type, data) or the answer to a client message
// (type ws.accepted or ws.error).
type wsMessage struct {
	Seq   int64             `json:"seq"`
	Turn  int               `json:"turn"`
	RunID string            `json:"runId"`
	Type  string            `json:"type"`
	Data  json.RawMessage   `json:"data"`
	For   string            `json:"for"`
	ID    string            `json:"id"`
	Error *wire.ErrorDetail `json:"error"`
}

// TestSessionWebSocket drives a session over a real WebSocket client
// (github.com/coder/websocket) against the embedded control plane with the
// real sandbox entry: a chat starts a turn, the session's events arrive in
// order (the same as its NDJSON log), an ask approval is answered over the
// socket, and stop cancels the next turn while its model call is held, with
// no provider call after it. The route needs the control-plane token like
// every public route.
func TestSessionWebSocket(t *testing.T) {
	t.Parallel()
	script := sessionScript(t,
		[]scriptedmodel.ToolCall{
			toolCallOf(t, "edit_file", map[string]string{"path": "calc.py", "old": "return a - b", "new": "return a + b"}),
			toolCallOf(t, "shell", map[string]string{"command": "echo approved-over-the-socket"}),
			toolCallOf(t, "finish", map[string]string{"summary": "Ran the command."}),
		},
		[]scriptedmodel.ToolCall{toolCallOf(t, "list_files", map[string]string{"path": "."})},
		[]scriptedmodel.ToolCall{toolCallOf(t, "list_files", map[string]string{"path": "."})},
	)
	p := newProvider(t, script, 2)
	pl := startWith(t, p, nil, "")
	ctx, cancel := context.WithTimeout(context.Background(), 2*runDeadline)
	defer cancel()
	created, err := pl.c.CreateSession(ctx, calcSession(t, &belay.ApprovalConfig{Policy: belay.PolicyAsk}))
	if err != nil {
		t.Fatal(err)
	}
	id := created.SessionID

	bad, err := httpapi.NewClient("http://"+pl.m.Addr(), "not-the-control-plane-token")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := bad.DialSession(ctx, id, 0); !belay.IsCode(err, belay.CodeUnauthorized) {
		t.Fatalf("a websocket with a wrong token: %v; want unauthorized", err)
	}

	conn, err := pl.c.DialSession(ctx, id, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.CloseNow()
	msgs := make(chan wsMessage, 1024)
	go func() {
		defer close(msgs)
		for {
			_, data, err := conn.Read(ctx)
			if err != nil {
				return
			}
			var m wsMessage
			if err := json.Unmarshal(data, &m); err != nil {
				t.Errorf("a websocket message is not JSON: %s", data)
				return
			}
			msgs <- m
		}
	}()
	send := func(v any) {
		t.Helper()
		b, _ := json.Marshal(v)
		if err := conn.Write(ctx, websocket.MessageText, b); err != nil {
			t.Fatal(err)
		}
	}
	var events []wsMessage
	// next returns the next message that matches, keeping every event.
	next := func(what string, match func(wsMessage) bool) wsMessage {
		t.Helper()
		for {
			select {
			case m, ok := <-msgs:
				if !ok {
					t.Fatalf("the websocket closed while waiting for %s", what)
				}
				if m.Type == wire.WSTypeError {
					t.Fatalf("the server answered an error while waiting for %s: %+v", what, m.Error)
				}
				if m.Seq > 0 {
					events = append(events, m)
				}
				if match(m) {
					return m
				}
			case <-ctx.Done():
				t.Fatalf("no %s on the websocket", what)
			}
		}
	}
	accepted := func(forType string) func(wsMessage) bool {
		return func(m wsMessage) bool { return m.Type == wire.WSTypeAccepted && m.For == forType }
	}

	send(wire.WSClientMessage{Type: wire.WSTypeChat, Text: "Run the echo command."})
	turn1 := next("the chat's answer", accepted(wire.WSTypeChat))
	if turn1.Turn != 1 || turn1.RunID == "" {
		t.Fatalf("chat answered %+v; want turn 1 and its run", turn1)
	}
	asked := next("approval.requested", func(m wsMessage) bool { return m.Type == belay.EventApprovalRequested })
	var ask struct {
		ApprovalID string `json:"approvalId"`
		Tool       string `json:"tool"`
	}
	if err := json.Unmarshal(asked.Data, &ask); err != nil || ask.Tool != "shell" {
		t.Fatalf("approval.requested %s; want the shell call", asked.Data)
	}
	yes := true
	send(wire.WSClientMessage{Type: wire.WSTypeApprove, ID: ask.ApprovalID, Approve: &yes})
	next("the approval's answer", accepted(wire.WSTypeApprove))
	result := next("the shell's result", func(m wsMessage) bool {
		return m.Type == belay.EventToolResult && strings.Contains(string(m.Data), `"name":"shell"`)
	})
	if !strings.Contains(string(result.Data), "approved-over-the-socket") || strings.Contains(string(result.Data), `"isError":true`) {
		t.Errorf("the approved shell call's result: %s", result.Data)
	}
	end1 := next("turn 1's end", func(m wsMessage) bool { return belay.IsTerminalEvent(m.Type) })
	if end1.Type != belay.EventRunCompleted || end1.Turn != 1 {
		t.Fatalf("turn 1 ended with %+v", end1)
	}
	approvals, err := pl.c.ListApprovals(ctx, turn1.RunID)
	if err != nil || len(approvals) != 1 || approvals[0].Decision != belay.DecisionAllowOnce {
		t.Fatalf("turn 1's approvals %+v, %v; want one, allowed once", approvals, err)
	}

	// Turn 2's first model call is held at the provider; stop cancels
	// the turn, and the provider hears nothing after.
	send(wire.WSClientMessage{Type: wire.WSTypeChat, Text: "List the files."})
	turn2 := next("the second chat's answer", accepted(wire.WSTypeChat))
	select {
	case <-p.Held():
	case <-ctx.Done():
		t.Fatal("turn 2's model call never reached the provider")
	}
	send(wire.WSClientMessage{Type: wire.WSTypeStop})
	stopped := next("the stop's answer", accepted(wire.WSTypeStop))
	if stopped.RunID != turn2.RunID {
		t.Errorf("stop answered for run %s; want turn 2's %s", stopped.RunID, turn2.RunID)
	}
	callsAtStop := p.Calls()
	p.Release()
	end2 := next("turn 2's end", func(m wsMessage) bool { return belay.IsTerminalEvent(m.Type) && m.Turn == 2 })
	if end2.Type != belay.EventRunCancelled {
		t.Errorf("turn 2 ended with %s; want run.cancelled", end2.Type)
	}
	if got := p.Calls(); got != callsAtStop || got != 2 {
		t.Errorf("the provider got %d calls (%d when stop was sent); want none after the stop", got, callsAtStop)
	}

	// The events came in order, exactly as the session's log has them.
	logged, _, err := pl.c.SessionEvents(ctx, id, 0, 2000)
	if err != nil {
		t.Fatal(err)
	}
	if len(events) != len(logged) {
		t.Fatalf("the websocket pushed %d events, the log has %d", len(events), len(logged))
	}
	for i := range events {
		if events[i].Seq != logged[i].Seq || events[i].Type != logged[i].Type {
			t.Fatalf("websocket event %d is %d %s; the log has %d %s", i, events[i].Seq, events[i].Type, logged[i].Seq, logged[i].Type)
		}
	}

	// Closing the session ends the socket cleanly.
	if _, err := pl.c.CloseSession(ctx, id); err != nil {
		t.Fatal(err)
	}
	deadline := time.After(runDeadline)
	for {
		select {
		case _, ok := <-msgs:
			if !ok {
				return
			}
		case <-deadline:
			t.Fatal("the websocket stayed open after the session closed")
		}
	}
}
