package httpapi

import (
	"context"
	"io"
	"net/http"
	"strconv"
	"time"

	"github.com/belay-dev/belay/internal/belay"
	"github.com/belay-dev/belay/internal/token"
	"github.com/belay-dev/belay/internal/wire"
)

// SourcePresigner hands a sandbox a presigned URL to download its run's
// source bundle from: the S3 adapter's PresignGet. With an OutputPresigner
// that is one too, the claim answer points there.
type SourcePresigner interface {
	PresignGet(ctx context.Context, runID, name string, ttl time.Duration) (string, error)
}

// handleGetSource streams a run's git source bundle to its sandbox (GET
// /internal/v1/runs/{id}/source, events audience) while the run is running
// and its capability active: the bundle is the fetched commit and its
// history, which the sandbox builds its repository from. No credential of
// the control plane's is in it.
func (s *Server) handleGetSource(w http.ResponseWriter, r *http.Request) {
	id, err := s.sandboxRunID(r, token.AudienceEvents)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	if s.sources == nil {
		s.writeError(w, r, belay.Errorf(belay.CodeNotFound, "run %s has no source bundle", id))
		return
	}
	ctx := r.Context()
	run, err := s.store.GetRun(ctx, id)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	if run.Status != belay.StatusRunning {
		s.writeError(w, r, belay.Errorf(belay.CodeConflict, "run %s is %s; its source is not served", id, run.Status))
		return
	}
	rc, size, err := s.sources.OpenSource(ctx, id)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	defer rc.Close()
	w.Header().Set("Content-Type", "application/x-git-bundle")
	w.Header().Set("Content-Length", strconv.FormatInt(size, 10))
	w.WriteHeader(http.StatusOK)
	if _, err := io.Copy(w, rc); err != nil {
		s.log.Warn("send source bundle", "request_id", stateOf(r).id, "run_id", id, "err", err.Error())
	}
}

// sourceTarget is where the claiming sandbox of a git-source run downloads
// its bundle: a presigned GET when the artifacts can presign one, the
// source route with the events token otherwise; nil for a run without one.
func (s *Server) sourceTarget(ctx context.Context, run belay.Run, eventsToken string, ttl time.Duration) (*wire.Upload, error) {
	if run.Request.GitSource() == nil {
		return nil, nil
	}
	if p, ok := s.presigner.(SourcePresigner); ok && s.presigner != nil {
		url, err := p.PresignGet(ctx, run.ID, belay.SourceBundleName, min(ttl, maxPresignTTL))
		if err != nil {
			return nil, err
		}
		return &wire.Upload{URL: url, Method: http.MethodGet}, nil
	}
	return &wire.Upload{URL: wire.SourcePath(run.ID), Method: http.MethodGet,
		Header: map[string]string{"Authorization": "Bearer " + eventsToken}}, nil
}
