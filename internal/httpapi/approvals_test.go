package httpapi_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/belay-dev/belay/internal/belay"
	"github.com/belay-dev/belay/internal/wire"
)

const shellAsk = `{"tool":"shell","arguments":{"command":"ls -la"}}`

// ask posts an approval request from the sandbox.
func (h *harness) ask(tb testing.TB, id, tok, body string) answer {
	tb.Helper()
	return h.do(tb, "POST", "/internal/v1/runs/"+id+"/approvals", tok, []byte(body), nil)
}

func TestApprovalPolicies(t *testing.T) {
	for _, tc := range []struct {
		name     string
		approval string
		tool     string
		status   belay.ApprovalStatus
		decision belay.Decision
	}{
		{"default denies", "", "shell", belay.ApprovalDecided, belay.DecisionDeny},
		{"deny_all", `"approval":{"policy":"deny_all"}`, "shell", belay.ApprovalDecided, belay.DecisionDeny},
		{"allow_all", `"approval":{"policy":"allow_all"}`, "shell", belay.ApprovalDecided, belay.DecisionAllowOnce},
		{"allow_list listed", `"approval":{"policy":"allow_list","allow":["shell"]}`, "shell", belay.ApprovalDecided, belay.DecisionAllowOnce},
		{"allow_list unlisted", `"approval":{"policy":"allow_list","allow":["run_check"]}`, "shell", belay.ApprovalDecided, belay.DecisionDeny},
		{"ask", `"approval":{"policy":"ask"}`, "shell", belay.ApprovalPending, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, harnessOptions{})
			id, toks := h.startRun(t, tc.approval, 5)
			a := h.ask(t, id, toks.Approvals, fmt.Sprintf(`{"tool":%q,"arguments":{"command":"ls"}}`, tc.tool))
			if a.status != 201 {
				t.Fatalf("ask: %d %s", a.status, a.body)
			}
			var got belay.Approval
			a.decode(t, &got)
			if got.Status != tc.status || got.Decision != tc.decision || got.RunID != id || !strings.HasPrefix(got.ID, "apr_") {
				t.Errorf("approval %+v, want %s %q", got, tc.status, tc.decision)
			}
			if got.Status == belay.ApprovalDecided && got.DecidedBy != "policy" {
				t.Errorf("decided by %q, want policy", got.DecidedBy)
			}
			if !got.ExpiresAt.Equal(h.clock.Now().Add(120 * time.Second)) {
				t.Errorf("expires %v, want now + 120 s", got.ExpiresAt)
			}
			events := h.allEvents(t, id)
			if countType(events, belay.EventApprovalRequested) != 1 {
				t.Errorf("events %v, want one approval.requested", events)
			}
		})
	}
}

func TestApprovalAskAndDecide(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	id, toks := h.startRun(t, `"approval":{"policy":"ask","timeoutSeconds":60}`, 5)
	var pending belay.Approval
	h.ask(t, id, toks.Approvals, shellAsk).decode(t, &pending)
	poll := "/internal/v1/runs/" + id + "/approvals/" + pending.ID

	var list wire.ApprovalList
	h.public(t, "GET", "/v1/runs/"+id+"/approvals", "").decode(t, &list)
	if len(list.Approvals) != 1 || list.Approvals[0].ID != pending.ID || list.Approvals[0].Status != belay.ApprovalPending {
		t.Fatalf("list %+v", list)
	}
	var polled belay.Approval
	h.do(t, "GET", poll, toks.Approvals, nil, nil).decode(t, &polled)
	if polled.Status != belay.ApprovalPending {
		t.Errorf("polled %+v, want pending", polled)
	}

	decide := "/v1/runs/" + id + "/approvals/" + pending.ID
	for _, tc := range []struct {
		body string
		want int
		code belay.Code
	}{
		{`{"decision":"maybe"}`, 400, belay.CodeInvalid},
		{`{"decision":"deny","why":"x"}`, 400, belay.CodeInvalid},
		{`{"decision":"deny","reason":"` + strings.Repeat("r", 1001) + `"}`, 400, belay.CodeInvalid},
		{`{"decision":"deny"} {}`, 400, belay.CodeInvalid},
	} {
		a := h.public(t, "POST", decide, tc.body)
		if a.status != tc.want || a.errorCode(t) != tc.code {
			t.Errorf("decide %s: %d %s, want %d %s", clipBody([]byte(tc.body)), a.status, a.body, tc.want, tc.code)
		}
	}
	a := h.public(t, "POST", decide, `{"decision":"allow_once","reason":"looks safe"}`)
	if a.status != 200 {
		t.Fatalf("decide: %d %s", a.status, a.body)
	}
	var decided belay.Approval
	a.decode(t, &decided)
	if decided.Status != belay.ApprovalDecided || decided.Decision != belay.DecisionAllowOnce ||
		decided.DecidedBy != "user" || decided.Reason != "looks safe" {
		t.Errorf("decided %+v", decided)
	}
	h.do(t, "GET", poll, toks.Approvals, nil, nil).decode(t, &polled)
	if polled.Decision != belay.DecisionAllowOnce {
		t.Errorf("sandbox sees %+v", polled)
	}
	if a := h.public(t, "POST", decide, `{"decision":"deny"}`); a.status != 409 || a.errorCode(t) != belay.CodeConflict {
		t.Errorf("second decision: %d %s, want 409", a.status, a.body)
	}
	if a := h.public(t, "POST", "/v1/runs/"+id+"/approvals/apr_nope", `{"decision":"deny"}`); a.status != 404 {
		t.Errorf("unknown approval: %d, want 404", a.status)
	}
	if a := h.do(t, "GET", "/internal/v1/runs/"+id+"/approvals/apr_nope", toks.Approvals, nil, nil); a.status != 404 {
		t.Errorf("unknown approval (internal): %d, want 404", a.status)
	}
	if a := h.public(t, "GET", "/v1/runs/run_nope/approvals", ""); a.status != 404 {
		t.Errorf("approvals of unknown run: %d, want 404", a.status)
	}
	events := h.allEvents(t, id)
	if countType(events, belay.EventApprovalRequested) != 1 || countType(events, belay.EventApprovalDecided) != 1 {
		t.Errorf("events %v", events)
	}
}

func TestApprovalTimeout(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	id, toks := h.startRun(t, `"approval":{"policy":"ask","timeoutSeconds":30}`, 5)
	var first, second belay.Approval
	h.ask(t, id, toks.Approvals, shellAsk).decode(t, &first)
	h.ask(t, id, toks.Approvals, shellAsk).decode(t, &second)
	h.clock.Advance(31 * time.Second)

	// The sandbox polling sees the timeout…
	var polled belay.Approval
	h.do(t, "GET", "/internal/v1/runs/"+id+"/approvals/"+first.ID, toks.Approvals, nil, nil).decode(t, &polled)
	if polled.Decision != belay.DecisionDeny || polled.DecidedBy != "timeout" {
		t.Errorf("expired approval polled as %+v, want deny by timeout", polled)
	}
	// …and a late person gets a conflict, not a silent override.
	a := h.public(t, "POST", "/v1/runs/"+id+"/approvals/"+second.ID, `{"decision":"allow_once"}`)
	if a.status != 409 || a.errorCode(t) != belay.CodeConflict {
		t.Errorf("late decision: %d %s, want 409", a.status, a.body)
	}
	var list wire.ApprovalList
	h.public(t, "GET", "/v1/runs/"+id+"/approvals", "").decode(t, &list)
	for _, ap := range list.Approvals {
		if ap.Decision != belay.DecisionDeny || ap.DecidedBy != "timeout" {
			t.Errorf("listed %+v, want deny by timeout", ap)
		}
	}
}

func TestApprovalAllowSessionAndCancelDecision(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	id, toks := h.startRun(t, `"approval":{"policy":"ask"}`, 5)
	var a1 belay.Approval
	h.ask(t, id, toks.Approvals, shellAsk).decode(t, &a1)
	if a := h.public(t, "POST", "/v1/runs/"+id+"/approvals/"+a1.ID, `{"decision":"allow_session"}`); a.status != 200 {
		t.Fatalf("decide: %d %s", a.status, a.body)
	}
	var a2 belay.Approval
	h.ask(t, id, toks.Approvals, `{"tool":"shell","arguments":{"command":"pwd"}}`).decode(t, &a2)
	if a2.Status != belay.ApprovalDecided || a2.Decision != belay.DecisionAllowSession {
		t.Errorf("ask after allow_session: %+v, want decided allow_session", a2)
	}

	id2, toks2 := h.startRun(t, `"approval":{"policy":"ask"}`, 5)
	var a3 belay.Approval
	h.ask(t, id2, toks2.Approvals, shellAsk).decode(t, &a3)
	if a := h.public(t, "POST", "/v1/runs/"+id2+"/approvals/"+a3.ID, `{"decision":"cancel"}`); a.status != 200 {
		t.Fatalf("decide cancel: %d %s", a.status, a.body)
	}
	run, err := h.store.GetRun(context.Background(), id2)
	if err != nil {
		t.Fatal(err)
	}
	if !run.CancelRequested {
		t.Error("a cancel decision did not cancel the run")
	}
	if a := h.chat(t, toks2.Model, chatBody); a.status != 401 {
		t.Errorf("model call after a cancel decision: %d, want 401", a.status)
	}
}

func TestInternalApprovalRefusals(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	id, toks := h.startRun(t, `"approval":{"policy":"ask"}`, 5)
	_, otherToks := h.startRun(t, "", 5)
	for _, tc := range []struct {
		name, tok, body string
		want            int
		code            belay.Code
	}{
		{"no token", "", shellAsk, 401, belay.CodeUnauthorized},
		{"model token", toks.Model, shellAsk, 401, belay.CodeUnauthorized},
		{"events token", toks.Events, shellAsk, 401, belay.CodeUnauthorized},
		{"other run's token", otherToks.Approvals, shellAsk, 401, belay.CodeUnauthorized},
		{"unknown field", toks.Approvals, `{"tool":"shell","arguments":{},"urgent":true}`, 400, belay.CodeInvalid},
		{"no tool", toks.Approvals, `{"arguments":{}}`, 400, belay.CodeInvalid},
		{"bad tool name", toks.Approvals, `{"tool":"sh ell"}`, 400, belay.CodeInvalid},
		{"arguments not an object", toks.Approvals, `{"tool":"shell","arguments":"rm -rf /"}`, 400, belay.CodeInvalid},
		{"oversize", toks.Approvals, `{"tool":"shell","arguments":{"command":"` + strings.Repeat("x", 70<<10) + `"}}`, 413, belay.CodeTooLarge},
	} {
		a := h.ask(t, id, tc.tok, tc.body)
		if a.status != tc.want || a.errorCode(t) != tc.code {
			t.Errorf("%s: %d %s, want %d %s", tc.name, a.status, clipBody(a.body), tc.want, tc.code)
		}
	}
	h.finishRun(t, id)
	if a := h.ask(t, id, toks.Approvals, shellAsk); a.status != 409 || a.errorCode(t) != belay.CodeConflict {
		t.Errorf("ask on an ended run: %d %s, want 409", a.status, a.body)
	}
	if n := len(h.allEvents(t, id)); n != 3 {
		t.Errorf("refused asks left events: %d events, want queued, started, completed", n)
	}
}

func TestSandboxEvents(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	id, toks := h.startRun(t, "", 5)
	post := func(tok, body string) answer {
		return h.do(t, "POST", "/internal/v1/runs/"+id+"/events", tok, []byte(body), nil)
	}
	batch := `{"batchId":"b-1","events":[{"type":"sandbox.ready","time":"2031-03-04T05:06:08Z","data":{"pid":1}},` +
		`{"type":"tool.call","time":"2031-03-04T05:06:09Z","data":{"tool":"read_file"}}]}`
	a := post(toks.Events, batch)
	if a.status != 200 {
		t.Fatalf("append: %d %s", a.status, a.body)
	}
	var got wire.EventBatchResponse
	a.decode(t, &got)
	if len(got.Events) != 2 || got.Events[0].Seq != 3 || got.Events[1].Type != belay.EventToolCall {
		t.Errorf("appended %+v", got.Events)
	}
	// A retry of the same batch appends nothing and answers the same.
	var retry wire.EventBatchResponse
	post(toks.Events, batch).decode(t, &retry)
	if len(retry.Events) != 2 || retry.Events[0].Seq != 3 {
		t.Errorf("retry answered %+v", retry.Events)
	}
	if n := len(h.allEvents(t, id)); n != 4 {
		t.Errorf("log has %d events after a retried batch, want 4", n)
	}

	many := make([]string, 101)
	for i := range many {
		many[i] = `{"type":"tool.call"}`
	}
	for _, tc := range []struct {
		name, tok, body string
		want            int
		code            belay.Code
	}{
		{"no token", "", batch, 401, belay.CodeUnauthorized},
		{"model token", toks.Model, batch, 401, belay.CodeUnauthorized},
		{"approvals token", toks.Approvals, batch, 401, belay.CodeUnauthorized},
		{"terminal type", toks.Events, `{"batchId":"b-2","events":[{"type":"run.completed"}]}`, 403, belay.CodeForbidden},
		{"decision type", toks.Events, `{"batchId":"b-2","events":[{"type":"approval.decided"}]}`, 403, belay.CodeForbidden},
		{"unknown type", toks.Events, `{"batchId":"b-2","events":[{"type":"made.up"}]}`, 403, belay.CodeForbidden},
		{"unknown field", toks.Events, `{"batchId":"b-2","events":[{"type":"tool.call","seq":9}]}`, 400, belay.CodeInvalid},
		{"unknown top field", toks.Events, `{"batchId":"b-2","events":[],"x":1}`, 400, belay.CodeInvalid},
		{"no batch id", toks.Events, `{"events":[{"type":"tool.call"}]}`, 400, belay.CodeInvalid},
		{"empty batch", toks.Events, `{"batchId":"b-2","events":[]}`, 400, belay.CodeInvalid},
		{"101 events", toks.Events, `{"batchId":"b-2","events":[` + strings.Join(many, ",") + `]}`, 400, belay.CodeInvalid},
		{"data not object", toks.Events, `{"batchId":"b-2","events":[{"type":"tool.call","data":[1]}]}`, 400, belay.CodeInvalid},
		{"oversize", toks.Events, `{"batchId":"b-2","events":[{"type":"tool.call","data":{"x":"` + strings.Repeat("x", 260<<10) + `"}}]}`, 413, belay.CodeTooLarge},
		{"final check", toks.Events, `{"batchId":"b-2","events":[{"type":"check.finished","data":{"argv":["python3","-m","pytest","-q"],"exitCode":0,"final":true}}]}`, 403, belay.CodeForbidden},
		{"final check, other case", toks.Events, `{"batchId":"b-2","events":[{"type":"check.finished","data":{"exitCode":0,"FINAL":true}}]}`, 403, belay.CodeForbidden},
		{"final check, repeated member", toks.Events, `{"batchId":"b-2","events":[{"type":"check.finished","data":{"final":false,"final":true}}]}`, 403, belay.CodeForbidden},
		{"final check, not a boolean", toks.Events, `{"batchId":"b-2","events":[{"type":"check.finished","data":{"final":1}}]}`, 403, belay.CodeForbidden},
		{"final check in a good batch", toks.Events, `{"batchId":"b-2","events":[{"type":"tool.call"},{"type":"check.finished","data":{"final":true}}]}`, 403, belay.CodeForbidden},
	} {
		a := post(tc.tok, tc.body)
		if a.status != tc.want || a.errorCode(t) != tc.code {
			t.Errorf("%s: %d %s, want %d %s", tc.name, a.status, clipBody(a.body), tc.want, tc.code)
		}
	}
	if n := len(h.allEvents(t, id)); n != 4 {
		t.Errorf("refused batches left events: %d, want 4", n)
	}
	// What the sandbox sent is marked as the sandbox's; a check.finished
	// that does not claim to be final is taken.
	if a := post(toks.Events, `{"batchId":"b-4","events":[{"type":"check.finished","data":{"exitCode":0,"final":false}}]}`); a.status != 200 {
		t.Errorf("a non-final check: %d %s", a.status, a.body)
	}
	for _, e := range h.allEvents(t, id) {
		want := belay.SourceControl
		if e.Seq > 2 {
			want = belay.SourceSandbox
		}
		if e.Source != want {
			t.Errorf("event %d (%s) has source %q, want %q", e.Seq, e.Type, e.Source, want)
		}
	}
	other, _ := h.startRun(t, "", 5)
	if a := h.do(t, "POST", "/internal/v1/runs/"+other+"/events", toks.Events, []byte(batch), nil); a.status != 401 {
		t.Errorf("token of another run: %d, want 401", a.status)
	}
	h.finishRun(t, id)
	if a := post(toks.Events, `{"batchId":"b-3","events":[{"type":"tool.result"}]}`); a.status != 409 || a.errorCode(t) != belay.CodeConflict {
		t.Errorf("append to an ended run: %d %s, want 409", a.status, a.body)
	}
}

// TestSandboxEventCap: past the operator's cap a batch is refused whole,
// with a message naming the cap; the control plane's own events go on.
func TestSandboxEventCap(t *testing.T) {
	h := newHarness(t, harnessOptions{sandboxEvents: belay.SandboxEventLimits{MaxEvents: 3, MaxBytes: 1 << 20}})
	id, toks := h.startRun(t, "", 5)
	post := func(batchID string, n int) answer {
		evs := make([]string, n)
		for i := range evs {
			evs[i] = `{"type":"tool.call","data":{"i":` + strconv.Itoa(i) + `}}`
		}
		return h.do(t, "POST", "/internal/v1/runs/"+id+"/events", toks.Events,
			[]byte(`{"batchId":"`+batchID+`","events":[`+strings.Join(evs, ",")+`]}`), nil)
	}
	if a := post("b1", 2); a.status != 200 {
		t.Fatalf("2 of 3: %d %s", a.status, a.body)
	}
	a := post("b2", 2)
	var e wire.ErrorBody
	a.decode(t, &e)
	if a.status != 413 || e.Error.Code != belay.CodeTooLarge || !strings.Contains(e.Error.Message, "at most 3 events") {
		t.Fatalf("past the cap: %d %s, want 413 too_large naming the cap", a.status, a.body)
	}
	if a := post("b3", 1); a.status != 200 {
		t.Fatalf("the last one under the cap: %d %s", a.status, a.body)
	}
	if a := post("b1", 2); a.status != 200 {
		t.Errorf("a retried batch at the cap: %d %s, want its first answer", a.status, a.body)
	}
	h.appendEvents(t, id, 5)
	if n := len(h.allEvents(t, id)); n != 2+3+5 {
		t.Errorf("%d events, want 10", n)
	}
}
