package httpapi_test

import (
	"bytes"
	"io"
	"net/http"
	"slices"
	"strconv"
	"testing"
	"time"
)

// BenchmarkProxyOverhead measures one chat-completions call through the
// model proxy (token check, body rewrite, the spend and its model.request
// event, forward, usage and model.response, on the embedded SQLite store)
// against the same call sent straight to a loopback upstream that answers
// in 1 ms, as a model would answer, only faster: the two interleaved in one
// run. It reports p50 and p99 of both in microseconds and their ratios
// (goal: proxied ≤ 1.5× direct), and logs them as a table.
func BenchmarkProxyOverhead(b *testing.B) {
	h := newHarness(b, harnessOptions{quietLogs: true})
	h.up.setResponse(func(w http.ResponseWriter, r *http.Request) {
		time.Sleep(time.Millisecond)
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, completion)
	})
	_, toks := h.startRun(b, "", 1<<30)
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 4}}
	body := []byte(chatBody)
	call := func(url, bearer string) time.Duration {
		req, err := http.NewRequest("POST", url, bytes.NewReader(body))
		if err != nil {
			b.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer "+bearer)
		req.Header.Set("Content-Type", "application/json")
		start := time.Now()
		resp, err := client.Do(req)
		if err != nil {
			b.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		d := time.Since(start)
		if resp.StatusCode != 200 {
			b.Fatalf("%s: status %d", url, resp.StatusCode)
		}
		return d
	}
	proxyURL := h.srv.URL + "/internal/v1/chat/completions"
	// Warm both connections up.
	call(proxyURL, toks.Model)
	call(h.up.url(), h.key)

	var proxied, direct []time.Duration
	for b.Loop() {
		proxied = append(proxied, call(proxyURL, toks.Model))
		direct = append(direct, call(h.up.url(), h.key))
	}
	pp50, pp99 := percentiles(proxied)
	dp50, dp99 := percentiles(direct)
	us := func(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }
	b.ReportMetric(us(pp50), "proxy-p50-us")
	b.ReportMetric(us(pp99), "proxy-p99-us")
	b.ReportMetric(us(dp50), "direct-p50-us")
	b.ReportMetric(us(dp99), "direct-p99-us")
	b.ReportMetric(us(pp50-dp50), "added-p50-us")
	b.ReportMetric(float64(pp50)/float64(dp50), "p50-ratio")
	b.ReportMetric(float64(pp99)/float64(dp99), "p99-ratio")
	b.Logf("\n%-34s %10s %10s\n%-34s %10.0f %10.0f\n%-34s %10.0f %10.0f\n%-34s %10.0f %10.0f\n%-34s %10.2f %10.2f  (goal ≤ 1.5)",
		"model call, 1 ms upstream ("+strconv.Itoa(len(proxied))+" calls)", "p50 µs", "p99 µs",
		"direct to the upstream", us(dp50), us(dp99),
		"through the proxy", us(pp50), us(pp99),
		"added by the proxy", us(pp50-dp50), us(pp99-dp99),
		"ratio proxied / direct", float64(pp50)/float64(dp50), float64(pp99)/float64(dp99))
}

func percentiles(ds []time.Duration) (p50, p99 time.Duration) {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2], s[min(len(s)-1, len(s)*99/100)]
}
