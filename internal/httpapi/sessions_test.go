package httpapi_test

import (
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/belay-dev/belay/internal/belay"
	"github.com/belay-dev/belay/internal/wire"
)

// sessionBody is a valid session request; extra JSON members are spliced in.
func sessionBody(extra string) string {
	b := `{"source":{"files":[{"path":"calc.py","content":"def add(a, b):\n    return a - b  # ` + fileCanary + `\n"},` +
		`{"path":"tests/test_calc.py","content":"from calc import add\n"}]},` +
		`"allowedPaths":["calc.py"],"checks":[["python3","-m","pytest","-q"]],"maxSteps":3`
	if extra != "" {
		b += "," + extra
	}
	return b + "}"
}

// TestSessionRoutes holds the session routes to the API contract on the
// handler alone (the turns' runs go to the harness's recording
// orchestrator; the end-to-end behaviour is internal/embedded's): bad
// input is refused with the field named and nothing stored, a message
// starts a turn whose run carries the session's request and turn context,
// a second message while it runs is a conflict, the event stream spans the
// turn, a closed session refuses messages, unknown ids are not_found, and a
// handler built without sessions says so.
func TestSessionRoutes(t *testing.T) {
	h := newHarness(t, harnessOptions{sessions: true})
	for name, tc := range map[string]struct {
		body   string
		status int
		field  string
	}{
		"no source":       {`{"allowedPaths":["calc.py"],"checks":[["python3","-m","pytest","-q"]]}`, http.StatusBadRequest, "source"},
		"unknown field":   {sessionBody(`"instruction":"x"`), http.StatusBadRequest, ""},
		"unlisted check":  {strings.Replace(sessionBody(""), `["python3","-m","pytest","-q"]`, `["sh","-c","rm -rf /"]`, 1), http.StatusBadRequest, "checks[0]"},
		"skill body size": {sessionBody(`"skills":[{"name":"big","description":"d","body":"` + strings.Repeat("x", belay.MaxSkillBodyBytes+1) + `"}]`), http.StatusRequestEntityTooLarge, "skills[0].body"},
	} {
		t.Run(name, func(t *testing.T) {
			a := h.public(t, "POST", "/v1/sessions", tc.body)
			if a.status != tc.status {
				t.Fatalf("%d %s; want %d", a.status, a.body, tc.status)
			}
			if tc.field != "" && !strings.Contains(string(a.body), tc.field) {
				t.Errorf("the error %s does not name %s", a.body, tc.field)
			}
			if strings.Contains(string(a.body), fileCanary) {
				t.Errorf("the error repeats file content: %s", a.body)
			}
		})
	}

	a := h.public(t, "POST", "/v1/sessions", sessionBody(`"skills":[{"name":"style","description":"how we write","body":"short lines"}]`))
	if a.status != http.StatusCreated {
		t.Fatalf("create session: %d %s", a.status, a.body)
	}
	var created wire.CreateSessionResponse
	a.decode(t, &created)
	if created.Status != belay.SessionIdle || a.header.Get("Location") != "/v1/sessions/"+created.SessionID || created.Links.WebSocket != "/v1/sessions/"+created.SessionID+"/ws" {
		t.Fatalf("created %+v (Location %q)", created, a.header.Get("Location"))
	}
	id := created.SessionID

	if a := h.public(t, "POST", "/v1/sessions/"+id+"/messages", `{"text":""}`); a.status != http.StatusBadRequest || !strings.Contains(string(a.body), `"text`) {
		t.Fatalf("an empty text: %d %s; want 400 naming text", a.status, a.body)
	}
	a = h.public(t, "POST", "/v1/sessions/"+id+"/messages", `{"text":"Fix add."}`)
	if a.status != http.StatusAccepted {
		t.Fatalf("message: %d %s", a.status, a.body)
	}
	var m wire.MessageResponse
	a.decode(t, &m)
	if m.Turn != 1 || !slices.Contains(submitted(h), m.RunID) {
		t.Fatalf("message answered %+v; want turn 1 with its run submitted", m)
	}
	run, err := h.store.GetRun(t.Context(), m.RunID)
	if err != nil || run.Request.Instruction != "Fix add." || run.Request.Turn == nil || run.Request.Turn.SessionID != id ||
		len(run.Request.Turn.Skills) != 1 || len(run.Request.Turn.Conversation) != 0 || run.Request.MaxSteps != 3 {
		t.Fatalf("the turn's run %+v, %v; want the session's request with the text and the turn context", run.Request, err)
	}
	if a := h.public(t, "POST", "/v1/sessions/"+id+"/messages", `{"text":"more"}`); a.status != http.StatusConflict || a.errorCode(t) != belay.CodeConflict {
		t.Fatalf("a message while the turn runs: %d %s; want 409 conflict", a.status, a.body)
	}

	var view wire.SessionView
	h.public(t, "GET", "/v1/sessions/"+id, "").decode(t, &view)
	if view.Status != belay.SessionRunning || len(view.Turns) != 1 || view.Turns[0].RunID != m.RunID || view.Turns[0].Text != "Fix add." ||
		len(view.Request.Skills) != 1 || view.Request.Files != 2 {
		t.Fatalf("record %+v", view)
	}
	a = h.public(t, "GET", "/v1/sessions/"+id+"/events", "")
	if a.status != http.StatusOK || !strings.Contains(string(a.body), `"seq":1000000001`) || !strings.Contains(string(a.body), `"type":"run.queued"`) {
		t.Fatalf("events: %d %s", a.status, a.body)
	}

	a = h.public(t, "DELETE", "/v1/sessions/"+id, "")
	h.public(t, "GET", "/v1/sessions/"+id, "").decode(t, &view)
	if a.status != http.StatusOK || view.Status != belay.SessionClosed || !slices.Contains(cancelled(h), m.RunID) {
		t.Fatalf("close: %d, status %s; want closed with the running turn's run cancelled", a.status, view.Status)
	}
	if a := h.public(t, "POST", "/v1/sessions/"+id+"/messages", `{"text":"again"}`); a.status != http.StatusConflict {
		t.Fatalf("a message to a closed session: %d %s; want 409", a.status, a.body)
	}
	for _, path := range []string{"/v1/sessions/ses_nosuch", "/v1/sessions/not-a-session", "/v1/sessions/ses_nosuch/events"} {
		if a := h.public(t, "GET", path, ""); a.status != http.StatusNotFound {
			t.Errorf("GET %s: %d; want 404", path, a.status)
		}
	}
	if a := h.do(t, "GET", "/v1/sessions/"+id, "", nil, nil); a.status != http.StatusUnauthorized {
		t.Errorf("a session without the token: %d; want 401", a.status)
	}

	plain := newHarness(t, harnessOptions{})
	if a := plain.public(t, "POST", "/v1/sessions", sessionBody("")); a.status != http.StatusNotFound || !strings.Contains(string(a.body), "does not run sessions") {
		t.Errorf("a handler without sessions: %d %s", a.status, a.body)
	}
}

func submitted(h *harness) []string { s, _ := h.orch.calls(); return s }
func cancelled(h *harness) []string { _, c := h.orch.calls(); return c }
