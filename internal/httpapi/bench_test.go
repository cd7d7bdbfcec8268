package httpapi_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	v4 "github.com/aws/aws-sdk-go-v2/aws/signer/v4"

	upstreampkg "github.com/belay-dev/belay/internal/upstream"
)

// BenchmarkProxyOverhead measures one chat-completions call through the
// model proxy (token check, body rewrite, budget spend on the embedded
// SQLite store, events, usage, the provider's translation, the upstream
// call) against the same upstream call sent straight to a loopback
// upstream that answers in 1 ms, as a model would answer, only faster: for
// each provider, all interleaved in one run. The direct call
// replays what the proxy sent (the Messages or Converse request; a Converse
// request signed afresh with SigV4, as any Bedrock client must). It reports,
// per provider, p50 and p99 of both in microseconds, the added p50 and the
// ratio proxied / direct (goal: ≤ 1.5×); the added p50 of Anthropic and
// Bedrock as ratios of the OpenAI-compatible path's; and logs it as a table.
func BenchmarkProxyOverhead(b *testing.B) {
	type lane struct {
		provider string
		proxy    func() *http.Request
		direct   func() *http.Request
		proxied  []time.Duration
		straight []time.Duration
	}
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 8}}
	body := []byte(chatBody)
	do := func(req *http.Request) time.Duration {
		start := time.Now()
		resp, err := client.Do(req)
		if err != nil {
			b.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		d := time.Since(start)
		if resp.StatusCode != 200 {
			b.Fatalf("%s: status %d", req.URL, resp.StatusCode)
		}
		return d
	}
	var lanes []*lane
	for _, p := range providers {
		h := newHarness(b, harnessOptions{provider: p, quietLogs: true})
		answer := map[string]string{
			upstreampkg.KindOpenAI: completion, upstreampkg.KindAnthropic: anthropicCompletion, upstreampkg.KindBedrock: bedrockCompletion,
		}[p]
		h.up.setResponse(func(w http.ResponseWriter, r *http.Request) {
			time.Sleep(time.Millisecond)
			w.Header().Set("Content-Type", "application/json")
			_, _ = io.WriteString(w, answer)
		})
		_, toks := h.startRun(b, "", 1<<30)
		l := &lane{provider: p}
		l.proxy = func() *http.Request {
			req, _ := http.NewRequest("POST", h.srv.URL+"/internal/v1/chat/completions", bytes.NewReader(body))
			req.Header.Set("Authorization", "Bearer "+toks.Model)
			req.Header.Set("Content-Type", "application/json")
			return req
		}
		do(l.proxy()) // warm up, and capture what the provider sends
		h.up.mu.Lock()
		sent, header, path := h.up.bodies[0], h.up.headers[0], h.up.paths[0]
		h.up.mu.Unlock()
		l.direct = func() *http.Request {
			req, _ := http.NewRequest("POST", h.up.srv.URL+path, bytes.NewReader(sent))
			req.Header.Set("Content-Type", "application/json")
			switch p {
			case upstreampkg.KindBedrock:
				sum := sha256.Sum256(sent)
				if err := v4.NewSigner().SignHTTP(context.Background(), h.up.creds, req, hex.EncodeToString(sum[:]),
					"bedrock", harnessRegion, time.Now()); err != nil {
					b.Fatal(err)
				}
			default:
				for _, k := range []string{"Authorization", "Anthropic-Version"} {
					if v := header.Get(k); v != "" {
						req.Header.Set(k, v)
					}
				}
			}
			return req
		}
		do(l.direct())
		lanes = append(lanes, l)
	}
	for b.Loop() {
		for _, l := range lanes {
			l.proxied = append(l.proxied, do(l.proxy()))
			l.straight = append(l.straight, do(l.direct()))
		}
	}
	us := func(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }
	added := map[string]time.Duration{}
	var table strings.Builder
	table.WriteString("\nmodel call, 1 ms upstream (" + strconv.Itoa(b.N) + " calls each)\n")
	table.WriteString("provider      direct p50/p99 µs    proxied p50/p99 µs    added p50 µs   ratio p50/p99 (goal ≤ 1.5)\n")
	for _, l := range lanes {
		pp50, pp99 := percentiles(l.proxied)
		dp50, dp99 := percentiles(l.straight)
		added[l.provider] = pp50 - dp50
		b.ReportMetric(us(pp50), l.provider+"-proxy-p50-us")
		b.ReportMetric(us(pp99), l.provider+"-proxy-p99-us")
		b.ReportMetric(us(dp50), l.provider+"-direct-p50-us")
		b.ReportMetric(us(dp99), l.provider+"-direct-p99-us")
		b.ReportMetric(us(pp50-dp50), l.provider+"-added-p50-us")
		b.ReportMetric(float64(pp50)/float64(dp50), l.provider+"-p50-ratio")
		b.ReportMetric(float64(pp99)/float64(dp99), l.provider+"-p99-ratio")
		table.WriteString(fmt.Sprintf("%-12s %8.0f / %-8.0f    %8.0f / %-8.0f    %10.0f     %5.2f / %.2f\n", l.provider,
			us(dp50), us(dp99), us(pp50), us(pp99), us(pp50-dp50), float64(pp50)/float64(dp50), float64(pp99)/float64(dp99)))
	}
	b.Log(table.String())
	if base := added[upstreampkg.KindOpenAI]; base > 0 {
		for _, p := range []string{upstreampkg.KindAnthropic, upstreampkg.KindBedrock} {
			b.ReportMetric(float64(added[p])/float64(base), p+"-added-vs-openai")
		}
	}
}

func percentiles(ds []time.Duration) (p50, p99 time.Duration) {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2], s[min(len(s)-1, len(s)*99/100)]
}
