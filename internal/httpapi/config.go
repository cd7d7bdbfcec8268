package httpapi

import (
	"context"
	"net/http"

	"github.com/belay-dev/belay/internal/wire"
)

// handleConfig answers GET /v1/config: the operator's model, run limits,
// allowed extensions and allowlisted checks (wire.ServerConfig), so a
// client sends what this server accepts.
func (s *Server) handleConfig(w http.ResponseWriter, r *http.Request) {
	cfg := wire.ConfigOf(s.limits)
	cfg.GitSources = s.intake.TakesGitSources()
	s.writeJSON(w, http.StatusOK, cfg)
}

// Config returns what the server accepts in a run (GET /v1/config).
func (c *Client) Config(ctx context.Context) (wire.ServerConfig, error) {
	var out wire.ServerConfig
	err := c.call(ctx, http.MethodGet, "/v1/config", nil, nil, nil, &out)
	return out, err
}
