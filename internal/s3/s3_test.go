package s3_test

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	awss3 "github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/johannesboyne/gofakes3"
	"github.com/johannesboyne/gofakes3/backend/s3mem"

	"github.com/belay-dev/belay/internal/artifacttest"
	"github.com/belay-dev/belay/internal/belay"
	belays3 "github.com/belay-dev/belay/internal/s3"
)

const bucket = "belay-artifacts"

// peer is gofakes3 with its in-memory backend, served over real HTTP in the
// test process: the S3 peer DESIGN.md names for tests.
type peer struct {
	client *awss3.Client
	url    string
	lists  atomic.Int64 // ListObjectsV2 requests seen
}

func startPeer(tb testing.TB) *peer {
	tb.Helper()
	faker := gofakes3.New(s3mem.New())
	p := &peer{}
	handler := faker.Server()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet && r.URL.Query().Get("list-type") == "2" {
			p.lists.Add(1)
		}
		handler.ServeHTTP(w, r)
	}))
	tb.Cleanup(srv.Close)
	p.url = srv.URL
	p.client = belays3.NewLocalClient(srv.URL)
	if _, err := p.client.CreateBucket(tb.Context(), &awss3.CreateBucketInput{Bucket: aws.String(bucket)}); err != nil {
		tb.Fatalf("create bucket on gofakes3: %v", err)
	}
	return p
}

func TestConformance(t *testing.T) {
	artifacttest.Run(t, func(tb testing.TB) belay.ArtifactStore {
		return belays3.New(startPeer(tb).client, bucket, "belay/")
	})
}

func TestKeyLayout(t *testing.T) {
	tests := []struct{ prefix, want string }{
		{"", "runs/run_k/result.json"},
		{"belay/", "belay/runs/run_k/result.json"},
		{"env-a/belay/", "env-a/belay/runs/run_k/result.json"},
	}
	for _, tt := range tests {
		t.Run(tt.prefix, func(t *testing.T) {
			p := startPeer(t)
			s := belays3.New(p.client, bucket, tt.prefix)
			if got := s.Key("run_k", "result.json"); got != tt.want {
				t.Fatalf("Key = %q, want %q", got, tt.want)
			}
			artifacttest.MustPut(t, s, "run_k", "result.json", []byte(`{"ok":true}`))
			out, err := p.client.GetObject(t.Context(), &awss3.GetObjectInput{Bucket: aws.String(bucket), Key: aws.String(tt.want)})
			if err != nil {
				t.Fatalf("object %s not in the bucket: %v", tt.want, err)
			}
			defer out.Body.Close()
			if body, _ := io.ReadAll(out.Body); string(body) != `{"ok":true}` {
				t.Fatalf("object %s holds %q", tt.want, body)
			}
		})
	}
}

// Objects under a run's prefix that the store did not write (a nested key,
// a hidden name) are not artifacts.
func TestListSkipsForeignKeys(t *testing.T) {
	p := startPeer(t)
	s := belays3.New(p.client, bucket, "")
	artifacttest.MustPut(t, s, "run_f", "result.json", []byte("{}"))
	for _, key := range []string{"runs/run_f/sub/x", "runs/run_f/.hidden", "runs/run_f2/result.json"} {
		putRaw(t, p, key, []byte("foreign"))
	}
	got := artifacttest.MustList(t, s, "run_f")
	if len(got) != 1 || got[0] != (belay.ArtifactInfo{Name: "result.json", Size: 2}) {
		t.Fatalf("ListArtifacts = %v, want only result.json", got)
	}
}

func TestListFollowsPages(t *testing.T) {
	p := startPeer(t)
	s := belays3.New(p.client, bucket, "belay/")
	belays3.SetPageSize(s, 2)
	names := []string{"e", "d", "c", "b", "a"}
	for _, n := range names {
		artifacttest.MustPut(t, s, "run_pages", n, []byte(n+n))
	}
	before := p.lists.Load()
	got := artifacttest.MustList(t, s, "run_pages")
	if calls := p.lists.Load() - before; calls < 3 {
		t.Fatalf("listing 5 objects in pages of 2 took %d requests, want at least 3", calls)
	}
	want := []belay.ArtifactInfo{{Name: "a", Size: 2}, {Name: "b", Size: 2}, {Name: "c", Size: 2}, {Name: "d", Size: 2}, {Name: "e", Size: 2}}
	if len(got) != len(want) {
		t.Fatalf("ListArtifacts = %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("ListArtifacts = %v, want %v", got, want)
		}
	}
}

// An object someone put straight into the bucket past the cap is refused
// on read, not loaded into memory.
func TestGetRefusesOversizeObject(t *testing.T) {
	p := startPeer(t)
	s := belays3.New(p.client, bucket, "")
	putRaw(t, p, s.Key("run_big", "transcript.jsonl"), make([]byte, belay.MaxArtifactBytes+1))
	_, err := s.GetArtifact(t.Context(), "run_big", "transcript.jsonl")
	if belay.ErrorCode(err) != belay.CodeTooLarge {
		t.Fatalf("GetArtifact of an oversize object: %v, want too_large", err)
	}
}

func TestPresignedPutThenGet(t *testing.T) {
	p := startPeer(t)
	s := belays3.New(p.client, bucket, "belay/")
	content := []byte("diff --git a/calc.py b/calc.py\n\x00\xff binary-safe\n")

	putURL, headers, err := s.PresignPut(t.Context(), "run_p", "patch.diff", 10*time.Minute, int64(len(content)))
	if err != nil {
		t.Fatalf("PresignPut: %v", err)
	}
	if status := httpPut(t, putURL, headers, content); status != http.StatusOK {
		t.Fatalf("presigned PUT answered %d", status)
	}
	if got := artifacttest.MustGet(t, s, "run_p", "patch.diff"); !bytes.Equal(got, content) {
		t.Fatalf("GetArtifact after presigned PUT = %q, want %q", got, content)
	}
	list := artifacttest.MustList(t, s, "run_p")
	if len(list) != 1 || list[0] != (belay.ArtifactInfo{Name: "patch.diff", Size: int64(len(content))}) {
		t.Fatalf("ListArtifacts after presigned PUT = %v", list)
	}

	getURL, err := s.PresignGet(t.Context(), "run_p", "patch.diff", time.Minute)
	if err != nil {
		t.Fatalf("PresignGet: %v", err)
	}
	resp, err := http.Get(getURL)
	if err != nil {
		t.Fatalf("presigned GET: %v", err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK || !bytes.Equal(body, content) {
		t.Fatalf("presigned GET = %d %q (%v), want 200 %q", resp.StatusCode, body, err, content)
	}
}

// S3 cannot refuse a presigned PUT for its size, so the cap travels in a
// signed metadata header and GetArtifact enforces it.
func TestPresignedPutCapEnforcedOnRead(t *testing.T) {
	p := startPeer(t)
	s := belays3.New(p.client, bucket, "")
	tests := []struct {
		name     string
		size     int
		wantCode belay.Code
	}{
		{"at-cap", 10, ""},
		{"over-cap", 11, belay.CodeTooLarge},
		{"empty", 0, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			u, h, err := s.PresignPut(t.Context(), "run_cap", tt.name, time.Minute, 10)
			if err != nil {
				t.Fatalf("PresignPut: %v", err)
			}
			if status := httpPut(t, u, h, bytes.Repeat([]byte("x"), tt.size)); status != http.StatusOK {
				t.Fatalf("presigned PUT answered %d", status)
			}
			got, err := s.GetArtifact(t.Context(), "run_cap", tt.name)
			if code := belay.ErrorCode(err); code != tt.wantCode {
				t.Fatalf("GetArtifact: %v (code %q), want code %q", err, code, tt.wantCode)
			}
			if err == nil && len(got) != tt.size {
				t.Fatalf("GetArtifact returned %d bytes, want %d", len(got), tt.size)
			}
		})
	}
}

// The URL carries its expiry and signs the cap header, and never the
// secret key. gofakes3 v1.2.0 checks neither signatures nor X-Amz-Expires
// (only the x-amz-date header's skew, which a presigned request does not
// send), so refusal of an expired URL is S3's part and is not tested here.
func TestPresignedURLShape(t *testing.T) {
	const canarySecret = "CANARY-secret-access-key-8f1c2d"
	p := startPeer(t)
	opts := p.client.Options()
	opts.Credentials = credentials.NewStaticCredentialsProvider("AKIDCANARY", canarySecret, "")
	s := belays3.New(awss3.New(opts), bucket, "belay/")

	putURL, headers, err := s.PresignPut(t.Context(), "run_u", "result.json", 15*time.Minute, 4096)
	if err != nil {
		t.Fatalf("PresignPut: %v", err)
	}
	getURL, err := s.PresignGet(t.Context(), "run_u", "result.json", 90*time.Second)
	if err != nil {
		t.Fatalf("PresignGet: %v", err)
	}
	tests := []struct {
		name, raw, expires string
	}{
		{"put", putURL, "900"},
		{"get", getURL, "90"},
	}
	var putQuery url.Values
	for _, tt := range tests {
		u, err := url.Parse(tt.raw)
		if err != nil {
			t.Fatalf("%s URL: %v", tt.name, err)
		}
		q := u.Query()
		if tt.name == "put" {
			putQuery = q
		}
		if q.Get("X-Amz-Expires") != tt.expires {
			t.Errorf("%s URL X-Amz-Expires = %q, want %q", tt.name, q.Get("X-Amz-Expires"), tt.expires)
		}
		if u.Path != "/"+bucket+"/belay/runs/run_u/result.json" {
			t.Errorf("%s URL path = %q", tt.name, u.Path)
		}
		if strings.Contains(tt.raw, canarySecret) {
			t.Errorf("%s URL carries the secret access key", tt.name)
		}
		if q.Get("X-Amz-Checksum-Crc32") != "" || q.Get("X-Amz-Sdk-Checksum-Algorithm") != "" {
			t.Errorf("%s URL pins a checksum no real body would match: %s", tt.name, tt.raw)
		}
	}
	if !strings.Contains(putQuery.Get("X-Amz-SignedHeaders"), "x-amz-meta-belay-max-bytes") {
		t.Errorf("PUT URL does not sign the cap header: %s", putURL)
	}
	if headers.Get("X-Amz-Meta-Belay-Max-Bytes") != "4096" {
		t.Errorf("PUT headers = %v, want the cap 4096", headers)
	}
	if headers.Get("Host") != "" {
		t.Errorf("PUT headers carry Host: %v", headers)
	}
}

func TestPresignRefusesBadInput(t *testing.T) {
	s := belays3.New(startPeer(t).client, bucket, "")
	tests := []struct {
		name      string
		run, file string
		ttl       time.Duration
		maxBytes  int64
	}{
		{"zero-ttl", "run_x", "result.json", 0, 10},
		{"ttl-over-7-days", "run_x", "result.json", 7*24*time.Hour + time.Second, 10},
		{"zero-cap", "run_x", "result.json", time.Minute, 0},
		{"cap-over-max", "run_x", "result.json", time.Minute, belay.MaxArtifactBytes + 1},
		{"bad-run", "../run", "result.json", time.Minute, 10},
		{"bad-name", "run_x", "../result.json", time.Minute, 10},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, _, err := s.PresignPut(t.Context(), tt.run, tt.file, tt.ttl, tt.maxBytes)
			if belay.ErrorCode(err) != belay.CodeInvalid {
				t.Fatalf("PresignPut: %v, want invalid", err)
			}
			if tt.maxBytes < 1 || tt.maxBytes > belay.MaxArtifactBytes {
				return // the cap is PresignPut's alone
			}
			if _, err := s.PresignGet(t.Context(), tt.run, tt.file, tt.ttl); belay.ErrorCode(err) != belay.CodeInvalid {
				t.Fatalf("PresignGet: %v, want invalid", err)
			}
		})
	}
}

func putRaw(tb testing.TB, p *peer, key string, content []byte) {
	tb.Helper()
	_, err := p.client.PutObject(tb.Context(), &awss3.PutObjectInput{
		Bucket: aws.String(bucket), Key: aws.String(key), Body: bytes.NewReader(content),
		ContentLength: aws.Int64(int64(len(content))),
	})
	if err != nil {
		tb.Fatalf("put %s: %v", key, err)
	}
}

// httpPut uploads the way the sandbox does: plain net/http, no AWS SDK.
func httpPut(tb testing.TB, rawURL string, headers http.Header, body []byte) int {
	tb.Helper()
	req, err := http.NewRequestWithContext(tb.Context(), http.MethodPut, rawURL, bytes.NewReader(body))
	if err != nil {
		tb.Fatal(err)
	}
	for k, v := range headers {
		req.Header[k] = v
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		tb.Fatalf("presigned PUT: %v", err)
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode
}

func TestSourceConformance(t *testing.T) {
	artifacttest.RunSource(t, func(tb testing.TB) belay.SourceStore {
		return belays3.New(startPeer(tb).client, bucket, "belay/")
	})
}
