package main

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/events"

	"github.com/belay-dev/belay/internal/rie"
)

// This file is the part of AWS the local execution needs and cannot run
// here, built from the synthesized template: a REST API gateway that
// routes as the template's methods say and turns each HTTP request into the
// API Gateway proxy event the bootstraps get on AWS (buffered or streamed
// integration, by the method's ResponseTransferMode). Step Functions,
// ECS and Secrets Manager are internal/awstest servers (statemachine_test.go
// scripts them); the Lambda bootstraps run under the Runtime Interface
// Emulator.

// route is one method of a REST API from the template.
type route struct {
	method   string // GET, POST, ANY
	path     string // /v1/runs/{id}/events, /v1/{proxy+}
	function string // the function's logical id
	stream   bool
}

// gateway serves one REST API of the template on loopback.
type gateway struct {
	srv    *httptest.Server
	stage  string
	routes []route
	fns    map[string]*rie.Function // by logical id
	tb     testing.TB
}

// routesOf reads the API's methods from the template.
func (st *synthStack) routesOf(tb testing.TB, apiPath string) []route {
	tb.Helper()
	api := st.logicalID(tb, apiPath)
	paths := st.resourcePaths(api)
	var out []route
	for _, m := range st.resources("AWS::ApiGateway::Method") {
		p := props(m)
		if !mentions(p["RestApiId"], api) {
			continue
		}
		integ := p["Integration"].(map[string]any)
		var fn string
		for id := range st.resources("AWS::Lambda::Function") {
			if mentions(integ["Uri"], id) {
				fn = id
			}
		}
		if fn == "" {
			tb.Fatalf("method %v has no Lambda integration", p)
		}
		path := "/"
		if r, ok := p["ResourceId"].(map[string]any)["Ref"].(string); ok {
			path = paths[r]
		}
		out = append(out, route{method: p["HttpMethod"].(string), path: path, function: fn, stream: integ["ResponseTransferMode"] == "STREAM"})
	}
	return out
}

func startGateway(tb testing.TB, stage string, routes []route, fns map[string]*rie.Function) *gateway {
	g := &gateway{stage: stage, routes: routes, fns: fns, tb: tb}
	g.srv = httptest.NewServer(http.HandlerFunc(g.serve))
	tb.Cleanup(g.srv.Close)
	return g
}

// URL is the stage's base URL, as ApiUrl or BELAY_API_URL on AWS.
func (g *gateway) URL() string { return g.srv.URL + "/" + g.stage }

// match finds the route of a request as API Gateway does: the most
// specific resource (literal segments before {param} before {proxy+}); a
// resource without the method is a miss, never a fallback.
func (g *gateway) match(method, path string) (route, map[string]string, bool) {
	segs := strings.Split(strings.Trim(path, "/"), "/")
	type cand struct {
		r      route
		params map[string]string
		score  []int
	}
	var best *cand
	for _, r := range g.routes {
		rsegs := strings.Split(strings.Trim(r.path, "/"), "/")
		params := map[string]string{}
		score := make([]int, 0, len(rsegs))
		ok := true
		for i, rs := range rsegs {
			if strings.HasSuffix(rs, "+}") {
				if i >= len(segs) {
					ok = false
					break
				}
				params[strings.Trim(rs, "{}+")] = strings.Join(segs[i:], "/")
				score = append(score, 0)
				break
			}
			if i >= len(segs) {
				ok = false
				break
			}
			switch {
			case strings.HasPrefix(rs, "{"):
				params[strings.Trim(rs, "{}")] = segs[i]
				score = append(score, 1)
			case rs == segs[i]:
				score = append(score, 2)
			default:
				ok = false
			}
			if !ok {
				break
			}
			if i == len(rsegs)-1 && len(segs) != len(rsegs) {
				ok = false
			}
		}
		if !ok {
			continue
		}
		c := &cand{r, params, score}
		if best == nil || less(best.score, c.score) {
			best = c
		}
	}
	if best == nil {
		return route{}, nil, false
	}
	// The most specific resource matched; it must have the method.
	for _, r := range g.routes {
		if r.path == best.r.path && (r.method == method || r.method == "ANY") {
			return r, best.params, true
		}
	}
	return route{}, nil, false
}

func less(a, b []int) bool {
	for i := 0; i < len(a) && i < len(b); i++ {
		if a[i] != b[i] {
			return a[i] < b[i]
		}
	}
	return len(a) < len(b)
}

// softTB lets rie's helpers, which fail the test with Fatal, run in a
// server goroutine: Fatal panics with the message, and the gateway answers
// 502 with it.
type softTB struct{ testing.TB }

type softFailure string

func (softTB) Helper()                           {}
func (softTB) Fatal(args ...any)                 { panic(softFailure(fmt.Sprint(args...))) }
func (softTB) Fatalf(format string, args ...any) { panic(softFailure(fmt.Sprintf(format, args...))) }

// invoke calls a function under its emulator from a server goroutine.
func invoke(tb testing.TB, fn *rie.Function, event []byte) (body []byte, err error) {
	defer func() {
		if r := recover(); r != nil {
			if f, ok := r.(softFailure); ok {
				err = fmt.Errorf("%s", string(f))
				return
			}
			panic(r)
		}
	}()
	_, body = fn.Invoke(softTB{tb}, event)
	return body, nil
}

func (g *gateway) serve(w http.ResponseWriter, r *http.Request) {
	path, ok := strings.CutPrefix(r.URL.Path, "/"+g.stage)
	if !ok {
		http.Error(w, `{"message":"Forbidden"}`, http.StatusForbidden)
		return
	}
	rt, params, ok := g.match(r.Method, path)
	if !ok {
		w.WriteHeader(http.StatusForbidden) // API Gateway: Missing Authentication Token
		_, _ = io.WriteString(w, `{"message":"Missing Authentication Token"}`)
		return
	}
	body, _ := io.ReadAll(r.Body)
	ev := events.APIGatewayProxyRequest{
		Resource:                        rt.path,
		Path:                            path,
		HTTPMethod:                      r.Method,
		Headers:                         map[string]string{},
		MultiValueHeaders:               map[string][]string{},
		QueryStringParameters:           map[string]string{},
		MultiValueQueryStringParameters: map[string][]string{},
		PathParameters:                  params,
		RequestContext: events.APIGatewayProxyRequestContext{
			AccountID: "123456789012", ResourceID: "abc123", Stage: g.stage, RequestID: fmt.Sprintf("req-%d", time.Now().UnixNano()),
			Identity:     events.APIGatewayRequestIdentity{SourceIP: "127.0.0.1", UserAgent: r.UserAgent()},
			ResourcePath: rt.path, HTTPMethod: r.Method, APIID: "local", Path: "/" + g.stage + path,
			RequestTimeEpoch: time.Now().UnixMilli(),
		},
	}
	for k, vs := range r.Header {
		ev.Headers[k] = vs[len(vs)-1]
		ev.MultiValueHeaders[k] = vs
	}
	ev.Headers["Host"] = r.Host
	ev.MultiValueHeaders["Host"] = []string{r.Host}
	for k, vs := range r.URL.Query() {
		ev.QueryStringParameters[k] = vs[len(vs)-1]
		ev.MultiValueQueryStringParameters[k] = vs
	}
	if len(body) > 0 {
		ev.Body, ev.IsBase64Encoded = base64.StdEncoding.EncodeToString(body), true
	}
	raw, _ := json.Marshal(ev)
	fn := g.fns[rt.function]
	if fn == nil {
		http.Error(w, "no emulator for "+rt.function, http.StatusBadGateway)
		return
	}
	out, err := invoke(g.tb, fn, raw)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	if e, isErr := rie.HandlerError(out); isErr {
		w.WriteHeader(http.StatusBadGateway) // API Gateway: a Lambda error is a 502
		_, _ = fmt.Fprintf(w, `{"message":"Internal server error","lambda":%q}`, e.Type+": "+e.Message)
		return
	}
	if rt.stream {
		resp, err := rie.ParseStreamed(out)
		if err != nil {
			http.Error(w, "streamed answer: "+err.Error(), http.StatusBadGateway)
			return
		}
		writeStreamed(w, resp)
		return
	}
	var resp events.APIGatewayProxyResponse
	if err := json.Unmarshal(out, &resp); err != nil {
		http.Error(w, "buffered answer: "+err.Error(), http.StatusBadGateway)
		return
	}
	for k, v := range resp.Headers {
		w.Header().Set(k, v)
	}
	for k, vs := range resp.MultiValueHeaders {
		w.Header()[http.CanonicalHeaderKey(k)] = vs
	}
	b := []byte(resp.Body)
	if resp.IsBase64Encoded {
		b, _ = base64.StdEncoding.DecodeString(resp.Body)
	}
	w.WriteHeader(resp.StatusCode)
	_, _ = w.Write(b)
}

// writeStreamed writes a streamed answer: the prelude's status and
// headers, then the body (whole: the emulator buffers a stream).
func writeStreamed(w http.ResponseWriter, resp rie.StreamedResponse) {
	for k, v := range resp.Headers {
		w.Header().Set(k, v)
	}
	for k, vs := range resp.MultiValueHeaders {
		w.Header()[http.CanonicalHeaderKey(k)] = vs
	}
	status := resp.StatusCode
	if status == 0 {
		status = http.StatusOK
	}
	w.WriteHeader(status)
	_, _ = w.Write(resp.Body)
}
