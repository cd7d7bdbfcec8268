package sigv4_test

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"

	"github.com/belay-dev/belay/internal/sigv4"
)

// verify checks a request's signature as API Gateway does, written from
// the Signature Version 4 specification (canonical request, string to
// sign, derived key), independently of the SDK's signer. API Gateway
// itself has no peer here; this server stands in for its check.
func verify(r *http.Request, body []byte, secret string) error {
	auth := r.Header.Get("Authorization")
	rest, ok := strings.CutPrefix(auth, "AWS4-HMAC-SHA256 ")
	if !ok {
		return fmt.Errorf("Authorization %q is not SigV4", auth)
	}
	fields := map[string]string{}
	for _, f := range strings.Split(rest, ", ") {
		k, v, _ := strings.Cut(f, "=")
		fields[k] = v
	}
	scope := strings.SplitN(fields["Credential"], "/", 2)
	if len(scope) != 2 {
		return fmt.Errorf("credential %q", fields["Credential"])
	}
	signedHeaders := strings.Split(fields["SignedHeaders"], ";")
	var canonHeaders strings.Builder
	for _, h := range signedHeaders {
		v := r.Header.Get(h)
		if h == "host" {
			v = r.Host
		}
		fmt.Fprintf(&canonHeaders, "%s:%s\n", h, strings.TrimSpace(v))
	}
	q := r.URL.Query()
	keys := make([]string, 0, len(q))
	for k := range q {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var canonQuery []string
	for _, k := range keys {
		for _, v := range q[k] {
			canonQuery = append(canonQuery, url.QueryEscape(k)+"="+strings.ReplaceAll(url.QueryEscape(v), "+", "%20"))
		}
	}
	sum := sha256.Sum256(body)
	canon := strings.Join([]string{r.Method, r.URL.EscapedPath(), strings.Join(canonQuery, "&"), canonHeaders.String(),
		fields["SignedHeaders"], hex.EncodeToString(sum[:])}, "\n")
	creq := sha256.Sum256([]byte(canon))
	date := r.Header.Get("X-Amz-Date")
	toSign := strings.Join([]string{"AWS4-HMAC-SHA256", date, scope[1], hex.EncodeToString(creq[:])}, "\n")
	parts := strings.Split(scope[1], "/") // date/region/service/aws4_request
	mac := func(key []byte, s string) []byte {
		h := hmac.New(sha256.New, key)
		h.Write([]byte(s))
		return h.Sum(nil)
	}
	k := mac([]byte("AWS4"+secret), parts[0])
	k = mac(k, parts[1])
	k = mac(k, parts[2])
	k = mac(k, "aws4_request")
	if got, want := fields["Signature"], hex.EncodeToString(mac(k, toSign)); got != want {
		return fmt.Errorf("signature %s, want %s", got, want)
	}
	if parts[1] != "eu-west-1" || parts[2] != "execute-api" {
		return fmt.Errorf("scope %s", scope[1])
	}
	return nil
}

func TestTransportSignsForAPIGateway(t *testing.T) {
	const secret = "canary-secret-key-0123456789"
	var gotErr error
	var gotBody, gotToken string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		gotBody, gotToken = string(b), r.Header.Get("X-Amz-Security-Token")
		gotErr = verify(r, b, secret)
		if strings.Contains(r.Header.Get("Authorization"), sigv4.TokenPlaceholder) {
			gotErr = fmt.Errorf("the bearer placeholder left the process")
		}
		w.WriteHeader(http.StatusAccepted)
	}))
	defer srv.Close()
	tr := &sigv4.Transport{
		Credentials: credentials.NewStaticCredentialsProvider("AKIDCANARY", secret, "session-token-canary"),
		Region:      "eu-west-1",
		Now:         func() time.Time { return time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC) },
	}
	hc := &http.Client{Transport: tr}
	for _, tc := range []struct{ method, path, body string }{
		{"POST", "/prod/v1/runs?x=a%20b&y=1", `{"instruction":"fix it"}`},
		{"GET", "/prod/v1/runs/run_abc/events?after=3", ""},
	} {
		req, _ := http.NewRequest(tc.method, srv.URL+tc.path, strings.NewReader(tc.body))
		if tc.body == "" {
			req.Body = http.NoBody
		}
		req.Header.Set("Authorization", "Bearer "+sigv4.TokenPlaceholder)
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if gotErr != nil {
			t.Errorf("%s %s: %v", tc.method, tc.path, gotErr)
		}
		if gotBody != tc.body || gotToken != "session-token-canary" {
			t.Errorf("%s %s: body %q, security token %q", tc.method, tc.path, gotBody, gotToken)
		}
	}
	// The verifier can fail: another secret does not verify. (A fresh
	// transport: the SDK's signer caches derived keys by access key id.)
	req, _ := http.NewRequest("GET", srv.URL+"/prod/v1/runs", nil)
	other := &http.Client{Transport: &sigv4.Transport{
		Credentials: aws.NewCredentialsCache(credentials.NewStaticCredentialsProvider("AKIDCANARY", "another-secret", "")),
		Region:      "eu-west-1",
	}}
	resp, err := other.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if gotErr == nil {
		t.Errorf("a signature made with another secret verified (status %d)", resp.StatusCode)
	}
}

func TestRegionOf(t *testing.T) {
	for host, want := range map[string]string{
		"abc123.execute-api.eu-west-1.amazonaws.com":      "eu-west-1",
		"abc123.execute-api.cn-north-1.amazonaws.com.cn":  "cn-north-1",
		"belay.example.com":                               "",
		"abc123.execute-api.eu-west-1.amazonaws.com.evil": "",
	} {
		if got := sigv4.RegionOf(host); got != want {
			t.Errorf("RegionOf(%q) = %q, want %q", host, got, want)
		}
	}
}
