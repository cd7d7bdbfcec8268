package main

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"
)

// TestSessionsWebSocket checks the sessions' WebSocket API in both stacks:
// a WEBSOCKET API whose $connect, $disconnect and $default routes go to
// the ws function ($connect authorized by API Gateway with IAM under
// auth=sigv4, by the function's token check otherwise), a stage with
// access logs, the table's keys-only stream feeding the same function only
// inserted run events, and the function's environment and grants (it may
// post to connections of this API only).
func TestSessionsWebSocket(t *testing.T) {
	for _, st := range []*synthStack{synthesized(t).token, synthesized(t).sigv4} {
		fnID := st.logicalID(t, functionID(fnWS)+"/Resource")
		apis := st.resources("AWS::ApiGatewayV2::Api")
		if len(apis) != 1 {
			t.Fatalf("%d API Gateway v2 APIs; want the one WebSocket API", len(apis))
		}
		var apiID string
		for id, a := range apis {
			apiID = id
			if p := props(a); p["ProtocolType"] != "WEBSOCKET" || p["RouteSelectionExpression"] != "$request.body.type" {
				t.Errorf("the API is %v with %v; want WEBSOCKET routed on $request.body.type", p["ProtocolType"], p["RouteSelectionExpression"])
			}
		}
		integrations := map[string]bool{}
		for id, in := range st.resources("AWS::ApiGatewayV2::Integration") {
			if p := props(in); p["IntegrationType"] == "AWS_PROXY" && mentions(p["IntegrationUri"], fnID) {
				integrations[id] = true
			}
		}
		routes := map[string]string{}
		for _, r := range st.resources("AWS::ApiGatewayV2::Route") {
			p := props(r)
			target, _ := json.Marshal(p["Target"])
			ok := false
			for id := range integrations {
				ok = ok || strings.Contains(string(target), id)
			}
			if !ok || !mentions(p["ApiId"], apiID) {
				t.Errorf("route %v does not go to the ws function on the API", p["RouteKey"])
			}
			auth, _ := p["AuthorizationType"].(string)
			routes[p["RouteKey"].(string)] = auth
		}
		wantConnect := "NONE"
		if st == synthesized(t).sigv4 {
			wantConnect = "AWS_IAM"
		}
		if len(routes) != 3 || routes["$disconnect"] != "NONE" || routes["$default"] != "NONE" || routes["$connect"] != wantConnect {
			t.Errorf("routes %v; want $connect (%s), $disconnect and $default", routes, wantConnect)
		}
		stages := st.resources("AWS::ApiGatewayV2::Stage")
		for _, sg := range stages {
			p := props(sg)
			logs, _ := p["AccessLogSettings"].(map[string]any)
			if p["StageName"] != wsStage || p["AutoDeploy"] != true || logs["DestinationArn"] == nil || !strings.Contains(logs["Format"].(string), "$context.connectionId") {
				t.Errorf("stage %v: want %s, auto-deployed, with access logs", p, wsStage)
			}
		}
		if len(stages) != 1 {
			t.Errorf("%d stages; want 1", len(stages))
		}

		table := props(st.json["Resources"].(map[string]any)[st.logicalID(t, "Table/Resource")].(map[string]any))
		if spec, _ := table["StreamSpecification"].(map[string]any); spec["StreamViewType"] != "KEYS_ONLY" {
			t.Errorf("the table's stream is %v; want KEYS_ONLY", table["StreamSpecification"])
		}
		mappings := st.resources("AWS::Lambda::EventSourceMapping")
		found := false
		for _, m := range mappings {
			p := props(m)
			if !mentions(p["FunctionName"], fnID) {
				continue
			}
			found = true
			filters, _ := json.Marshal(p["FilterCriteria"])
			for _, want := range []string{`INSERT`, `RUN#`, `EVT#`} {
				if !strings.Contains(string(filters), want) {
					t.Errorf("the stream's filter %s lacks %s", filters, want)
				}
			}
			if p["StartingPosition"] != "LATEST" || !slices.Contains(stringsOf(p["FunctionResponseTypes"]), "ReportBatchItemFailures") {
				t.Errorf("the stream mapping %v; want LATEST with batch item failures", p)
			}
		}
		if !found {
			t.Error("no event source mapping feeds the ws function")
		}

		env := props(st.json["Resources"].(map[string]any)[fnID].(map[string]any))["Environment"].(map[string]any)["Variables"].(map[string]any)
		for _, v := range []string{envWSEndpoint, envTable, envBucket, envStateMachineARN, envClusterARN, envEventBus, envModel, envAuth} {
			if _, ok := env[v]; !ok {
				t.Errorf("the ws function lacks %s", v)
			}
		}
		if _, ok := env[envControlTokenARN]; ok != (st == synthesized(t).token) {
			t.Errorf("the ws function has the control token's ARN: %v; want it only under auth=token", ok)
		}
		manage := false
		for _, s := range st.statementsOf(t, st.logicalID(t, functionID(fnWS)+"Role/Resource")) {
			if slices.Contains(s.actions, "execute-api:ManageConnections") {
				manage = true
				if !mentions(s.resources, apiID) {
					t.Errorf("ManageConnections on %v; want only this API's connections", s.resources)
				}
			}
		}
		if !manage {
			t.Error("the ws function may not post to connections")
		}
	}
}
