package httpapi_test

import (
	"context"
	"net/http"
	"reflect"
	"testing"

	"github.com/belay-dev/belay/internal/belay"
	"github.com/belay-dev/belay/internal/httpapi"
	"github.com/belay-dev/belay/internal/wire"
)

func TestConfigRoute(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	a := h.do(t, "GET", "/v1/config", "", nil, nil)
	if a.status != http.StatusUnauthorized || a.errorCode(t) != belay.CodeUnauthorized {
		t.Errorf("GET /v1/config without the control token: %d %s; want 401 unauthorized", a.status, a.body)
	}
	a = h.public(t, "GET", "/v1/config", "")
	if a.status != http.StatusOK {
		t.Fatalf("GET /v1/config: %d %s", a.status, a.body)
	}
	var got wire.ServerConfig
	a.decode(t, &got)
	want := wire.ConfigOf(belay.DefaultLimits(testModel))
	if !reflect.DeepEqual(got, want) {
		t.Errorf("GET /v1/config = %+v\nwant %+v", got, want)
	}

	c, err := httpapi.NewClient(h.srv.URL, h.controlToken)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := c.Config(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(cfg.RunLimits(), belay.DefaultLimits(testModel)) {
		t.Errorf("Client.Config().RunLimits() = %+v; want the server's limits", cfg.RunLimits())
	}
	if cfg.RunLimits().ExtensionAllowed("x.kt") || !cfg.RunLimits().ExtensionAllowed("x.py") {
		t.Error("the client's view of the extensions differs from the server's")
	}
}
