package functions_test

import (
	"encoding/json"
	"net/http"
	"testing"

	"github.com/belay-dev/belay/internal/belay"
	"github.com/belay-dev/belay/internal/rie"
	"github.com/belay-dev/belay/internal/token"
	"github.com/belay-dev/belay/internal/wire"
)

func TestSandboxAPI(t *testing.T) {
	p := startPeers(t)
	fn := rie.Start(t, "sandboxapi", p.env(map[string]string{"BELAY_SIGNING_KEY": signingKey}))
	run := newRunID()
	seedRun(t, p.store, run)
	startRun(t, p.store, run)

	t.Run("append events", func(t *testing.T) {
		ev := apiEvent(t, "sandboxapi", "append-events.json", forRun(run),
			withHeader("Authorization", "Bearer "+issue(t, token.AudienceEvents, run)))
		resp := buffered(t, fn, ev)
		var got wire.EventBatchResponse
		if resp.StatusCode != http.StatusOK || json.Unmarshal([]byte(resp.Body), &got) != nil || len(got.Events) != 1 {
			t.Fatalf("append: %d %s", resp.StatusCode, resp.Body)
		}
		stored := runEvents(t, p.store, run)
		if last := stored[len(stored)-1]; last.Type != belay.EventSandboxReady || last.Seq != got.Events[0].Seq {
			t.Fatalf("last stored event %+v, want the appended sandbox.ready", last)
		}
		// The batch id makes a retry append nothing.
		if again := buffered(t, fn, ev); again.StatusCode != http.StatusOK || len(runEvents(t, p.store, run)) != len(stored) {
			t.Fatalf("retry: %d, %d events (was %d)", again.StatusCode, len(runEvents(t, p.store, run)), len(stored))
		}
	})
	recordInit(t, fn)

	t.Run("a token of another audience", func(t *testing.T) {
		resp := buffered(t, fn, apiEvent(t, "sandboxapi", "append-events.json", forRun(run),
			withHeader("Authorization", "Bearer "+issue(t, token.AudienceModel, run))))
		if resp.StatusCode != http.StatusUnauthorized || errorCode(t, resp.Body) != belay.CodeUnauthorized {
			t.Fatalf("model token on the events route: %d %s, want 401", resp.StatusCode, resp.Body)
		}
	})

	t.Run("not the model proxy", func(t *testing.T) {
		resp := buffered(t, fn, apiEvent(t, "sandboxapi", "chat-completions.json",
			withHeader("Authorization", "Bearer "+issue(t, token.AudienceModel, run))))
		if resp.StatusCode != http.StatusNotFound || errorCode(t, resp.Body) != belay.CodeNotFound {
			t.Fatalf("chat completions through sandboxapi: %d %s, want 404", resp.StatusCode, resp.Body)
		}
		if c, _ := p.store.GetCapability(t.Context(), run); c.UsedRequests != 0 {
			t.Fatalf("sandboxapi spent %d model requests", c.UsedRequests)
		}
	})
}
