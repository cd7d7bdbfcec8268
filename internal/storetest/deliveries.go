package storetest

import (
	"fmt"
	"reflect"
	"sync"
	"testing"

	"github.com/belay-dev/belay/internal/belay"
)

// testDeliveries holds RecordDelivery to its contract: the first record of
// a provider and id wins, a redelivery gets it back unchanged, providers do
// not share ids, refusals store nothing, and of concurrent records exactly
// one wins.
func testDeliveries(t *testing.T, open opener) {
	t.Run("first wins", func(t *testing.T) {
		s := open(t, Options{})
		ctx := t.Context()
		first := belay.Delivery{Provider: "github", ID: "72d3162e-cc78-11e3-81ab-4c9367dc0958", RunID: "run_first", ReceivedAt: at(1)}
		got, recorded, err := s.RecordDelivery(ctx, first)
		if err != nil || !recorded {
			t.Fatalf("RecordDelivery(first) = %+v, %v, %v; want recorded", got, recorded, err)
		}
		if !reflect.DeepEqual(got, first) {
			t.Errorf("RecordDelivery(first) returned %+v, want %+v", got, first)
		}
		again := first
		again.RunID, again.ReceivedAt = "run_second", at(2)
		got, recorded, err = s.RecordDelivery(ctx, again)
		if err != nil || recorded {
			t.Fatalf("RecordDelivery(redelivery) = %+v, %v, %v; want the first, not recorded", got, recorded, err)
		}
		if !reflect.DeepEqual(got, first) {
			t.Errorf("a redelivery got %+v, want the first delivery %+v", got, first)
		}
		ignored := belay.Delivery{Provider: "github", ID: "another", Ignored: "repository octo/other is not in the triggers file", ReceivedAt: at(3)}
		if _, recorded, err := s.RecordDelivery(ctx, ignored); err != nil || !recorded {
			t.Fatalf("RecordDelivery(ignored) = %v, %v; want recorded", recorded, err)
		}
		again = ignored
		again.Ignored, again.RunID = "", "run_third"
		got, recorded, err = s.RecordDelivery(ctx, again)
		if err != nil || recorded || got.Ignored != ignored.Ignored || got.RunID != "" {
			t.Errorf("a redelivery of an ignored delivery got %+v, %v, %v; want it ignored as before", got, recorded, err)
		}
		// Another provider's delivery with the same id is its own.
		other := belay.Delivery{Provider: "codecommit", ID: first.ID, RunID: "run_other", ReceivedAt: at(4)}
		if got, recorded, err := s.RecordDelivery(ctx, other); err != nil || !recorded || got.RunID != "run_other" {
			t.Errorf("RecordDelivery(same id, other provider) = %+v, %v, %v; want recorded", got, recorded, err)
		}
	})

	t.Run("refused", func(t *testing.T) {
		s := open(t, Options{})
		ctx := t.Context()
		for name, d := range map[string]belay.Delivery{
			"no provider":     {ID: "d1", RunID: "run_a", ReceivedAt: at(1)},
			"no id":           {Provider: "github", RunID: "run_a", ReceivedAt: at(1)},
			"no time":         {Provider: "github", ID: "d1", RunID: "run_a"},
			"neither":         {Provider: "github", ID: "d1", ReceivedAt: at(1)},
			"both":            {Provider: "github", ID: "d1", RunID: "run_a", Ignored: "x", ReceivedAt: at(1)},
			"bad run id":      {Provider: "github", ID: "d1", RunID: "run/../x", ReceivedAt: at(1)},
			"control in id":   {Provider: "github", ID: "d1\n", RunID: "run_a", ReceivedAt: at(1)},
			"id over 128":     {Provider: "github", ID: fmt.Sprintf("%0129d", 1), RunID: "run_a", ReceivedAt: at(1)},
			"reason too long": {Provider: "github", ID: "d1", Ignored: string(make([]byte, belay.MaxDeliveryIgnoredLen+1)), ReceivedAt: at(1)},
		} {
			_, recorded, err := s.RecordDelivery(ctx, d)
			wantCode(t, err, belay.CodeInvalid, "RecordDelivery("+name+")")
			if recorded {
				t.Errorf("RecordDelivery(%s) recorded a refused delivery", name)
			}
		}
		// Nothing was stored: d1 is still new.
		if _, recorded, err := s.RecordDelivery(ctx, belay.Delivery{Provider: "github", ID: "d1", RunID: "run_a", ReceivedAt: at(1)}); err != nil || !recorded {
			t.Errorf("RecordDelivery(d1) after refusals = %v, %v; want recorded", recorded, err)
		}
	})

	t.Run("concurrent", func(t *testing.T) {
		s := open(t, Options{})
		const n = 8
		var wg sync.WaitGroup
		type answer struct {
			d        belay.Delivery
			recorded bool
			err      error
		}
		answers := make([]answer, n)
		for i := range n {
			wg.Go(func() {
				d, recorded, err := s.RecordDelivery(t.Context(), belay.Delivery{
					Provider: "github", ID: "same-delivery", RunID: fmt.Sprintf("run_%d", i), ReceivedAt: at(i),
				})
				answers[i] = answer{d, recorded, err}
			})
		}
		wg.Wait()
		winners := 0
		var winner string
		for i, a := range answers {
			if a.err != nil {
				t.Fatalf("RecordDelivery #%d: %v", i, a.err)
			}
			if a.recorded {
				winners++
				winner = a.d.RunID
			}
		}
		if winners != 1 {
			t.Fatalf("%d concurrent records won, want exactly 1", winners)
		}
		for i, a := range answers {
			if a.d.RunID != winner {
				t.Errorf("RecordDelivery #%d answered run %s, the winner is %s", i, a.d.RunID, winner)
			}
		}
	})

	t.Run("git source request", func(t *testing.T) {
		// A run from a repository event keeps its source and trigger.
		s := open(t, Options{})
		run := newRun("run-git", at(1), "hash-git")
		run.Request.Files = nil
		run.Request.Source = &belay.Source{Git: &belay.GitSource{
			URL: "https://github.com/octo-org/octo-repo.git", Ref: "refs/heads/main",
			Commit: "6113728f27ae82c7b1a177c8d03f9e96e0adf246",
			Tree:   &belay.SourceTree{Files: 3, Bytes: 1234},
			Bundle: &belay.SourceBundle{Size: 999, SHA256: "ab"},
		}}
		run.Request.Trigger = &belay.Trigger{
			Provider: "github", Event: "issue_comment", Action: "created", Delivery: "d-1",
			Repository: "octo-org/octo-repo", Commit: "6113728f27ae82c7b1a177c8d03f9e96e0adf246",
			Actor: "octocat", URL: "https://github.com/octo-org/octo-repo/issues/1#issuecomment-1", Issue: 1,
			Outputs: belay.TriggerOutputs{Branch: true, PullRequest: true, Comment: true},
		}
		mustCreate(t, s, run, "")
		got := mustGet(t, s, run.ID)
		if !reflect.DeepEqual(got.Request, run.Request) {
			t.Errorf("stored request = %+v, want %+v", got.Request, run.Request)
		}
	})
}
