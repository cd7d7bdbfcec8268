package sandbox

import (
	"net/http"
	"net/http/httptest"
	"testing"
)

// The ECS task metadata endpoint has no peer here: an HTTP test server
// answers GET /task with the shape the v4 endpoint documents, and checks
// the request.
func TestECSTaskARN(t *testing.T) {
	const arn = "arn:aws:ecs:eu-west-1:123456789012:task/belay-sandboxes/3f1d5e0b9c8a4e7f8a6b5c4d3e2f1a0b"
	status := http.StatusOK
	body := `{"Cluster":"arn:aws:ecs:eu-west-1:123456789012:cluster/belay-sandboxes","TaskARN":"` + arn + `",` +
		`"Family":"belay-sandbox","Revision":"7","DesiredStatus":"RUNNING","KnownStatus":"RUNNING",` +
		`"Limits":{"CPU":1,"Memory":2048},"LaunchType":"FARGATE","AvailabilityZone":"eu-west-1a",` +
		`"Containers":[{"DockerId":"3f1d5e0b9c8a4e7f8a6b5c4d3e2f1a0b-1234567890","Name":"sandbox"}]}`
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet || r.URL.Path != "/v4/abc-123/task" {
			t.Errorf("metadata request %s %s, want GET /v4/abc-123/task", r.Method, r.URL.Path)
		}
		w.WriteHeader(status)
		_, _ = w.Write([]byte(body))
	}))
	defer srv.Close()
	base := srv.URL + "/v4/abc-123"

	if got := ecsTaskARN(t.Context(), base, srv.Client()); got != arn {
		t.Fatalf("ecsTaskARN = %q, want %q", got, arn)
	}
	if got := ecsTaskARN(t.Context(), "", srv.Client()); got != "" {
		t.Fatalf("outside ECS: %q, want empty", got)
	}
	status = http.StatusInternalServerError
	if got := ecsTaskARN(t.Context(), base, srv.Client()); got != "" {
		t.Fatalf("failing endpoint: %q, want empty", got)
	}
	status, body = http.StatusOK, `{"TaskARN":"arn with spaces"}`
	if got := ecsTaskARN(t.Context(), base, srv.Client()); got != "" {
		t.Fatalf("malformed ARN: %q, want empty", got)
	}
}
