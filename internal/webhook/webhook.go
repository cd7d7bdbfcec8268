// Package webhook is the HTTP handler of repository webhooks:
// POST /v1/webhooks/github, the same handler in belay serve (mounted in the
// API, with no bearer token) and in the webhook Lambda. A delivery is
// verified (X-Hub-Signature-256 over the raw body, constant time), matched
// against the triggers file, recorded once by its X-GitHub-Delivery (a
// redelivery is answered as the first was and starts nothing), and, when it
// starts a run, handed to the bus as a normalized belay.RepoEvent carrying
// the run id the answer promises. The dispatcher creates that run.
package webhook

import (
	"context"
	"crypto/rand"
	"encoding/base32"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"time"

	"github.com/belay-dev/belay/internal/belay"
	"github.com/belay-dev/belay/internal/github"
	"github.com/belay-dev/belay/internal/triggers"
	"github.com/belay-dev/belay/internal/wire"
)

// Bus carries normalized repository events to the dispatcher: EventBridge
// on AWS, a goroutine in belay serve.
type Bus interface {
	PublishRepoEvent(ctx context.Context, ev belay.RepoEvent) error
}

// Config is what a Handler needs; all fields but Logger and Now are
// required.
type Config struct {
	// Secret returns the webhook secret (cached by the caller).
	Secret     func(ctx context.Context) (string, error)
	Triggers   *triggers.Config
	Deliveries belay.DeliveryStore
	// Runs tells whether a promised run exists, so a redelivery of a
	// delivery whose event never reached the dispatcher publishes it
	// again.
	Runs interface {
		GetRun(ctx context.Context, id string) (belay.Run, error)
	}
	Bus Bus
	// NewID returns a fresh run id ("run_..."); nil draws 128 random bits.
	NewID  func() string
	Now    func() time.Time
	Logger *slog.Logger
}

// republishAfter is how old a recorded delivery must be, with its run
// still missing, before a redelivery publishes its event again: younger,
// the dispatcher may still be fetching its source.
const republishAfter = 2 * time.Minute

// Handler serves GitHub's webhooks.
type Handler struct {
	cfg Config
	log *slog.Logger
	now func() time.Time
}

// New checks cfg and returns a Handler.
func New(cfg Config) (*Handler, error) {
	switch {
	case cfg.Secret == nil:
		return nil, errors.New("webhook: Config.Secret is required")
	case cfg.Triggers == nil:
		return nil, errors.New("webhook: Config.Triggers is required")
	case cfg.Deliveries == nil || cfg.Runs == nil:
		return nil, errors.New("webhook: Config.Deliveries and Config.Runs are required")
	case cfg.Bus == nil:
		return nil, errors.New("webhook: Config.Bus is required")
	}
	h := &Handler{cfg: cfg, log: cfg.Logger, now: cfg.Now}
	if h.log == nil {
		h.log = slog.New(slog.DiscardHandler)
	}
	if h.now == nil {
		h.now = time.Now
	}
	if h.cfg.NewID == nil {
		h.cfg.NewID = NewRunID
	}
	return h, nil
}

var idEncoding = base32.NewEncoding("abcdefghijklmnopqrstuvwxyz234567").WithPadding(base32.NoPadding)

// NewRunID returns "run_" and 128 random bits, as the API's ids.
func NewRunID() string {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic("webhook: read entropy: " + err.Error())
	}
	return "run_" + idEncoding.EncodeToString(b[:])
}

// ServeHTTP handles one delivery.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	if w.Header().Get(wire.RequestIDHeader) == "" {
		w.Header().Set(wire.RequestIDHeader, "req_"+NewRunID()[4:])
	}
	reqID := w.Header().Get(wire.RequestIDHeader)
	log := h.log.With("request_id", reqID, "delivery", truncate(r.Header.Get(github.DeliveryHeader), 128),
		"event", truncate(r.Header.Get(github.EventHeader), 64))

	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, github.MaxPayloadBytes))
	if err != nil {
		if _, ok := errors.AsType[*http.MaxBytesError](err); ok {
			log.Info("webhook refused: payload too large")
			h.fail(w, reqID, belay.Errorf(belay.CodeTooLarge, "the payload is larger than GitHub's %d-byte cap", github.MaxPayloadBytes))
			return
		}
		h.fail(w, reqID, belay.Errorf(belay.CodeInvalid, "could not read the payload"))
		return
	}
	secret, err := h.cfg.Secret(ctx)
	if err != nil {
		log.Error("webhook secret", "err", err.Error())
		h.fail(w, reqID, belay.Errorf(belay.CodeUnavailable, "the webhook secret is not available; GitHub will show the delivery as failed"))
		return
	}
	if err := github.VerifySignature(r.Header.Get(github.SignatureHeader), body, []byte(secret)); err != nil {
		log.Info("webhook refused: bad signature", "err", err.Error())
		h.fail(w, reqID, belay.Errorf(belay.CodeUnauthorized, "%s is missing or does not match the payload", github.SignatureHeader))
		return
	}
	eventType := r.Header.Get(github.EventHeader)
	delivery := r.Header.Get(github.DeliveryHeader)
	if eventType == "ping" {
		log.Info("webhook ping")
		h.json(w, http.StatusOK, wire.WebhookResponse{Pong: true})
		return
	}
	if delivery == "" || len(delivery) > 128 || !printable(delivery) || eventType == "" {
		h.fail(w, reqID, belay.Errorf(belay.CodeInvalid, "%s and %s are required", github.EventHeader, github.DeliveryHeader))
		return
	}

	ev, err := github.Normalize(eventType, delivery, body, h.now())
	var reason string
	var rule *triggers.Repository
	switch {
	case errors.Is(err, github.ErrNotActed):
		reason = err.Error()
	case err != nil:
		log.Info("webhook refused: payload", "err", err.Error())
		h.fail(w, reqID, err)
		return
	default:
		rule, reason = h.cfg.Triggers.Match(ev)
		log = log.With("repository", ev.Repository)
	}
	d := belay.Delivery{Provider: belay.ProviderGitHub, ID: delivery, Ignored: truncate(reason, belay.MaxDeliveryIgnoredLen), ReceivedAt: h.now()}
	if rule != nil {
		d.RunID, d.Ignored = h.cfg.NewID(), ""
	}
	stored, recorded, err := h.cfg.Deliveries.RecordDelivery(context.WithoutCancel(ctx), d)
	if err != nil {
		log.Error("record delivery", "err", err.Error())
		h.fail(w, reqID, belay.Errorf(belay.CodeUnavailable, "could not record the delivery; GitHub may deliver it again"))
		return
	}
	if !recorded {
		log.Info("webhook redelivery: answered as before", "run_id", stored.RunID, "ignored", stored.Ignored)
		if stored.RunID != "" && rule != nil {
			h.republishIfLost(ctx, log, stored, ev)
		}
		h.answer(w, stored)
		return
	}
	if rule == nil {
		log.Info("webhook ignored", "reason", reason)
		h.answer(w, stored)
		return
	}
	ev.RunID = stored.RunID
	if err := h.cfg.Bus.PublishRepoEvent(context.WithoutCancel(ctx), ev); err != nil {
		log.Error("publish repository event", "run_id", ev.RunID, "err", err.Error())
		h.fail(w, reqID, belay.Errorf(belay.CodeUnavailable, "could not queue the run; redeliver the event from GitHub in a few minutes"))
		return
	}
	log.Info("webhook accepted", "run_id", ev.RunID, "actor", ev.Actor)
	h.answer(w, stored)
}

// republishIfLost publishes a redelivered event again when its run does
// not exist long after the first delivery: the first publish was lost.
func (h *Handler) republishIfLost(ctx context.Context, log *slog.Logger, stored belay.Delivery, ev belay.RepoEvent) {
	if h.now().Sub(stored.ReceivedAt) < republishAfter {
		return
	}
	if _, err := h.cfg.Runs.GetRun(ctx, stored.RunID); !belay.IsCode(err, belay.CodeNotFound) {
		return
	}
	ev.RunID = stored.RunID
	if err := h.cfg.Bus.PublishRepoEvent(context.WithoutCancel(ctx), ev); err != nil {
		log.Error("publish repository event again", "run_id", ev.RunID, "err", err.Error())
		return
	}
	log.Warn("the run of an earlier delivery never started; its event is published again", "run_id", ev.RunID)
}

func (h *Handler) answer(w http.ResponseWriter, d belay.Delivery) {
	h.json(w, http.StatusAccepted, wire.WebhookResponse{RunID: d.RunID, Ignored: d.Ignored})
}

// statuses maps the codes this handler answers with.
var statuses = map[belay.Code]int{
	belay.CodeInvalid:      http.StatusBadRequest,
	belay.CodeUnauthorized: http.StatusUnauthorized,
	belay.CodeTooLarge:     http.StatusRequestEntityTooLarge,
	belay.CodeUnavailable:  http.StatusServiceUnavailable,
}

func (h *Handler) fail(w http.ResponseWriter, reqID string, err error) {
	code := belay.ErrorCode(err)
	status, ok := statuses[code]
	msg := belay.ErrorMessage(err)
	if !ok {
		status, code, msg = http.StatusInternalServerError, belay.CodeInternal, "internal error"
	}
	h.json(w, status, wire.ErrorBody{Error: wire.ErrorDetail{Code: code, Message: msg, RequestID: reqID}})
}

func (h *Handler) json(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		panic(fmt.Sprintf("webhook: marshal %T: %v", v, err))
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(append(b, '\n'))
}

func printable(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < 0x20 || s[i] > 0x7e {
			return false
		}
	}
	return true
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n]
}
