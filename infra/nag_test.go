package main

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/aws/aws-cdk-go/awscdk/v2/assertions"
	"github.com/aws/jsii-runtime-go"
)

// TestNagAWSSolutions gates on cdk-nag's AWS Solutions pack: no
// unsuppressed error in either stack (auth=token and auth=sigv4), and the
// canary stack's careless bucket is flagged, so the checks did run.
func TestNagAWSSolutions(t *testing.T) {
	syn := synthesized(t)
	t.Logf("synthesis of the test app (two belay stacks and the canary, cdk-nag included): %s", syn.took.Round(100*1e6))
	anyNag := assertions.Match_StringLikeRegexp(jsii.String("AwsSolutions-.*"))
	for _, st := range []*synthStack{syn.token, syn.sigv4} {
		errs := st.ann.FindError(jsii.String("*"), anyNag)
		for _, e := range *errs {
			t.Errorf("%s: %s", *st.s.stack.StackName(), message(e))
		}
		// Warnings are not gated, but are all accounted for: the only one
		// left is the placeholder image, which this synthesis has.
		for _, w := range *st.ann.FindWarning(jsii.String("*"), anyNag) {
			t.Errorf("%s: unsuppressed warning %s", *st.s.stack.StackName(), message(w))
		}
	}
	canary := syn.canary.FindError(jsii.String("*"), anyNag)
	var flagged []string
	for _, e := range *canary {
		flagged = append(flagged, message(e))
	}
	if !strings.Contains(strings.Join(flagged, "\n"), "AwsSolutions-S10") {
		t.Errorf("cdk-nag did not flag the canary's bucket without TLS enforcement (AwsSolutions-S10); it reported: %v", flagged)
	}
}

// message is a synthesis message as JSON (its construct path and data);
// the Go binding's fields for them are deprecated.
func message(m any) string {
	b, _ := json.Marshal(m)
	return string(b)
}

// TestNagSuppressionsHaveReasons reads the suppressions the stack records
// in its template's metadata: each names a rule and gives a reason about
// belay, not a placeholder.
func TestNagSuppressionsHaveReasons(t *testing.T) {
	st := synthesized(t).token
	var n int
	for id, r := range st.json["Resources"].(map[string]any) {
		md, _ := r.(map[string]any)["Metadata"].(map[string]any)
		nag, _ := md["cdk_nag"].(map[string]any)
		for _, s := range listOf(nag["rules_to_suppress"]) {
			s := s.(map[string]any)
			n++
			reason, _ := s["reason"].(string)
			if len(reason) < 80 || !strings.Contains(reason, " ") {
				t.Errorf("%s: suppression of %v has no real reason: %q", id, s["id"], reason)
			}
		}
	}
	if n == 0 {
		t.Fatal("no suppression metadata found: the test would pass on nothing")
	}
}
