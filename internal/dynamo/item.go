package dynamo

import (
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/belay-dev/belay/internal/belay"
)

// The item layout. Every item of a run lives in the partition "RUN#<id>":
//
//	META             the run's state: status, times, usage, outcome, lastSeq
//	REQ#000, …       the canonical request, gzipped JSON split into chunks
//	                 (a request may exceed DynamoDB's 400 KB item limit, and
//	                 keeping it out of META keeps the per-event META update
//	                 cheap)
//	EVT#<seq>        one event, seq zero-padded to 20 digits so SK order is
//	                 seq order
//	CAP              the model-call capability
//	APPR#<id>        one approval
//	BATCH#<id>       the sequence range an idempotent event batch got
//
// and each idempotency key has its own item "IDEM#<sha256(key)>" / "IDEM",
// each claim code its item "CLAIM#<hex of the code's SHA-256>" / "CLAIM"
// (the caller of a claim knows only the code, not its run).
// META also carries the listing index keys: GSI1PK "RUNS" with GSI1SK
// "<createdAt>#<id>" (all runs), and GSI2PK "STATUS#<status>" with the same
// sort key (runs of one status).
const (
	skMeta       = "META"
	skCap        = "CAP"
	skIdem       = "IDEM"
	skClaim      = "CLAIM"
	prefixEvent  = "EVT#"
	prefixReq    = "REQ#"
	prefixAppr   = "APPR#"
	prefixBatch  = "BATCH#"
	gsi1AllRuns  = "RUNS"
	prefixStatus = "STATUS#"
)

// timeLayout is fixed-width UTC, so stored times sort as strings.
const timeLayout = "2006-01-02T15:04:05.000000000Z"

// requestChunkBytes bounds one REQ# chunk well under the 400 KB item limit.
const requestChunkBytes = 350_000

func runPK(id string) string            { return "RUN#" + id }
func eventSK(seq int64) string          { return fmt.Sprintf("%s%020d", prefixEvent, seq) }
func requestSK(i int) string            { return fmt.Sprintf("%s%03d", prefixReq, i) }
func approvalSK(id string) string       { return prefixAppr + id }
func batchSK(id string) string          { return prefixBatch + id }
func statusPK(s belay.RunStatus) string { return prefixStatus + string(s) }

// idemPK hashes the idempotency key: keys are caller-chosen and may be
// longer than a partition key may be.
func idemPK(key string) string {
	sum := sha256.Sum256([]byte(key))
	return "IDEM#" + hex.EncodeToString(sum[:])
}

// listSK orders runs by creation time, then id.
func listSK(createdAt time.Time, id string) string {
	return formatTime(createdAt) + "#" + id
}

type item = map[string]types.AttributeValue

// isItem reports whether it has the sort key sk.
func isItem(it item, sk string) bool {
	v, ok := it[attrSK].(*types.AttributeValueMemberS)
	return ok && v.Value == sk
}

func keyOf(pk, sk string) item { return item{attrPK: avS(pk), attrSK: avS(sk)} }

func avS(v string) types.AttributeValue { return &types.AttributeValueMemberS{Value: v} }
func avN(v int64) types.AttributeValue {
	return &types.AttributeValueMemberN{Value: strconv.FormatInt(v, 10)}
}
func avBool(v bool) types.AttributeValue      { return &types.AttributeValueMemberBOOL{Value: v} }
func avB(v []byte) types.AttributeValue       { return &types.AttributeValueMemberB{Value: v} }
func avTime(t time.Time) types.AttributeValue { return avS(formatTime(t)) }

func formatTime(t time.Time) string { return t.UTC().Format(timeLayout) }

// decoder reads attributes of one item and remembers the first malformed one,
// so that decoding code reads straight through and checks once.
type decoder struct {
	it  item
	err error
}

func (d *decoder) fail(name, want string) {
	if d.err == nil {
		d.err = fmt.Errorf("attribute %s: want %s", name, want)
	}
}

func (d *decoder) has(name string) bool { _, ok := d.it[name]; return ok }

func (d *decoder) str(name string) string {
	v, ok := d.it[name]
	if !ok {
		return ""
	}
	s, ok := v.(*types.AttributeValueMemberS)
	if !ok {
		d.fail(name, "string")
		return ""
	}
	return s.Value
}

func (d *decoder) num(name string) int64 {
	v, ok := d.it[name]
	if !ok {
		return 0
	}
	n, ok := v.(*types.AttributeValueMemberN)
	if !ok {
		d.fail(name, "number")
		return 0
	}
	i, err := strconv.ParseInt(n.Value, 10, 64)
	if err != nil {
		d.fail(name, "integer")
	}
	return i
}

func (d *decoder) boolean(name string) bool {
	v, ok := d.it[name]
	if !ok {
		return false
	}
	b, ok := v.(*types.AttributeValueMemberBOOL)
	if !ok {
		d.fail(name, "bool")
		return false
	}
	return b.Value
}

func (d *decoder) bytes(name string) []byte {
	v, ok := d.it[name]
	if !ok {
		return nil
	}
	b, ok := v.(*types.AttributeValueMemberB)
	if !ok {
		d.fail(name, "binary")
		return nil
	}
	return b.Value
}

func (d *decoder) time(name string) time.Time {
	s := d.str(name)
	if s == "" {
		return time.Time{}
	}
	t, err := time.Parse(timeLayout, s)
	if err != nil {
		d.fail(name, "time")
	}
	return t
}

// jsonAttr decodes a JSON-encoded string attribute into v; absent leaves v.
func (d *decoder) json(name string, v any) {
	s := d.str(name)
	if s == "" {
		return
	}
	if err := json.Unmarshal([]byte(s), v); err != nil {
		d.fail(name, "JSON")
	}
}

// runMeta is a run's META item decoded: the run without its request, and
// what the store needs to continue writing it.
type runMeta struct {
	run       belay.Run
	reqChunks int
	ttl       int64
}

func (m *runMeta) terminal() bool { return m.run.Status.Terminal() }

// metaItem encodes a new run's META item.
func metaItem(r belay.Run, reqChunks int, ttl int64) (item, error) {
	it := keyOf(runPK(r.ID), skMeta)
	it[attrGSI1PK] = avS(gsi1AllRuns)
	it[attrGSI1SK] = avS(listSK(r.CreatedAt, r.ID))
	it[attrGSI2PK] = avS(statusPK(r.Status))
	it[attrTTL] = avN(ttl)
	it["runId"] = avS(r.ID)
	it["status"] = avS(string(r.Status))
	it["requestHash"] = avS(r.RequestHash)
	it["reqChunks"] = avN(int64(reqChunks))
	it["createdAt"] = avTime(r.CreatedAt)
	it["updatedAt"] = avTime(r.UpdatedAt)
	for name, t := range map[string]time.Time{"startedAt": r.StartedAt, "finishedAt": r.FinishedAt} {
		if !t.IsZero() {
			it[name] = avTime(t)
		}
	}
	it["cancelRequested"] = avBool(r.CancelRequested)
	if r.Reason != "" {
		it["reason"] = avS(r.Reason)
	}
	if r.ExitCode != nil {
		it["exitCode"] = avN(int64(*r.ExitCode))
	}
	it["modelRequests"] = avN(int64(r.Usage.ModelRequests))
	it["maxRequests"] = avN(int64(r.Usage.MaxRequests))
	it["promptTokens"] = avN(r.Usage.PromptTokens)
	it["completionTokens"] = avN(r.Usage.CompletionTokens)
	if err := outcomeAttrs(it, r.Checks, r.ChangedFiles, r.Artifacts); err != nil {
		return nil, err
	}
	it["lastSeq"] = avN(r.LastSeq)
	if r.Attempt != 0 {
		it["attempt"] = avN(int64(r.Attempt))
	}
	if r.SandboxRef != "" {
		it["sandboxRef"] = avS(r.SandboxRef)
	}
	return it, nil
}

// outcomeAttrs sets the JSON-encoded outcome lists that are present.
func outcomeAttrs(it item, checks []belay.CheckResult, changed, artifacts []string) error {
	set := func(name string, v any) error {
		b, err := json.Marshal(v)
		if err != nil {
			return fmt.Errorf("encode %s: %w", name, err)
		}
		it[name] = avS(string(b))
		return nil
	}
	if checks != nil {
		if err := set("checks", checks); err != nil {
			return err
		}
	}
	if changed != nil {
		if err := set("changedFiles", changed); err != nil {
			return err
		}
	}
	if artifacts != nil {
		if err := set("artifacts", artifacts); err != nil {
			return err
		}
	}
	return nil
}

// decodeMeta decodes a META item (nil for none).
func decodeMeta(it item) (*runMeta, error) {
	if it == nil {
		return nil, nil
	}
	d := decoder{it: it}
	m := &runMeta{
		run: belay.Run{
			ID:              d.str("runId"),
			Status:          belay.RunStatus(d.str("status")),
			RequestHash:     d.str("requestHash"),
			CreatedAt:       d.time("createdAt"),
			UpdatedAt:       d.time("updatedAt"),
			StartedAt:       d.time("startedAt"),
			FinishedAt:      d.time("finishedAt"),
			CancelRequested: d.boolean("cancelRequested"),
			Reason:          d.str("reason"),
			Usage: belay.Usage{
				ModelRequests:    int(d.num("modelRequests")),
				MaxRequests:      int(d.num("maxRequests")),
				PromptTokens:     d.num("promptTokens"),
				CompletionTokens: d.num("completionTokens"),
			},
			LastSeq:           d.num("lastSeq"),
			Attempt:           int(d.num("attempt")),
			SandboxRef:        d.str("sandboxRef"),
			SandboxEvents:     int(d.num("sandboxEvents")),
			SandboxEventBytes: d.num("sandboxEventBytes"),
		},
		reqChunks: int(d.num("reqChunks")),
		ttl:       d.num(attrTTL),
	}
	if d.has("exitCode") {
		code := int(d.num("exitCode"))
		m.run.ExitCode = &code
	}
	d.json("checks", &m.run.Checks)
	d.json("changedFiles", &m.run.ChangedFiles)
	d.json("artifacts", &m.run.Artifacts)
	if d.err != nil {
		return nil, fmt.Errorf("decode run %s: %w", m.run.ID, d.err)
	}
	return m, nil
}

// encodeRequest gzips the request's JSON and splits it into chunks that each
// fit one item.
func encodeRequest(req belay.RunRequest) ([][]byte, error) {
	raw, err := json.Marshal(req)
	if err != nil {
		return nil, fmt.Errorf("encode request: %w", err)
	}
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	if _, err := zw.Write(raw); err != nil {
		return nil, fmt.Errorf("compress request: %w", err)
	}
	if err := zw.Close(); err != nil {
		return nil, fmt.Errorf("compress request: %w", err)
	}
	data := buf.Bytes()
	var chunks [][]byte
	for len(data) > requestChunkBytes {
		chunks = append(chunks, data[:requestChunkBytes])
		data = data[requestChunkBytes:]
	}
	return append(chunks, data), nil
}

// decodeRequest reassembles a request from its chunks, in order.
func decodeRequest(chunks [][]byte) (belay.RunRequest, error) {
	var req belay.RunRequest
	zr, err := gzip.NewReader(bytes.NewReader(bytes.Join(chunks, nil)))
	if err != nil {
		return req, fmt.Errorf("decompress request: %w", err)
	}
	raw, err := io.ReadAll(zr)
	if err != nil {
		return req, fmt.Errorf("decompress request: %w", err)
	}
	if err := json.Unmarshal(raw, &req); err != nil {
		return req, fmt.Errorf("decode request: %w", err)
	}
	return req, nil
}

// eventItem encodes one event.
func eventItem(runID string, e belay.Event, ttl int64) item {
	it := keyOf(runPK(runID), eventSK(e.Seq))
	it["seq"] = avN(e.Seq)
	it["type"] = avS(e.Type)
	if e.Source != belay.SourceControl {
		it["source"] = avS(e.Source)
	}
	if !e.Time.IsZero() {
		it["time"] = avTime(e.Time)
	}
	if len(e.Data) > 0 {
		it["data"] = avS(string(e.Data))
	}
	it[attrTTL] = avN(ttl)
	return it
}

func decodeEvent(it item) (belay.Event, error) {
	d := decoder{it: it}
	e := belay.Event{Seq: d.num("seq"), Type: d.str("type"), Time: d.time("time"), Source: d.str("source")}
	if e.Source == "" {
		// Written before events had a source, or by the control plane,
		// whose events leave it out.
		e.Source = belay.SourceControl
	}
	if data := d.str("data"); data != "" {
		e.Data = json.RawMessage(data)
	}
	if d.err != nil {
		return e, fmt.Errorf("decode event %s: %w", d.str(attrSK), d.err)
	}
	return e, nil
}

// capabilityItem encodes a fresh capability. Expiry is stored as Unix
// nanoseconds so the consume condition compares numbers.
func capabilityItem(c belay.Capability, ttl int64) item {
	it := keyOf(runPK(c.RunID), skCap)
	it["runId"] = avS(c.RunID)
	it["model"] = avS(c.Model)
	it["state"] = avS(string(belay.CapabilityActive))
	it["expiresAt"] = avN(c.ExpiresAt.UnixNano())
	it["maxRequests"] = avN(int64(c.MaxRequests))
	it["usedRequests"] = avN(0)
	it[attrTTL] = avN(ttl)
	return it
}

func decodeCapability(it item) (belay.Capability, error) {
	d := decoder{it: it}
	c := belay.Capability{
		RunID:        d.str("runId"),
		Model:        d.str("model"),
		State:        belay.CapabilityState(d.str("state")),
		ExpiresAt:    time.Unix(0, d.num("expiresAt")).UTC(),
		MaxRequests:  int(d.num("maxRequests")),
		UsedRequests: int(d.num("usedRequests")),
	}
	if d.err != nil {
		return c, fmt.Errorf("decode capability: %w", d.err)
	}
	return c, nil
}

// approvalItem encodes an approval. position is the sequence number of its
// approval.requested event, which orders approvals requested at the same
// instant in the order they were stored.
func approvalItem(a belay.Approval, position, ttl int64) item {
	it := keyOf(runPK(a.RunID), approvalSK(a.ID))
	it["position"] = avN(position)
	it["approvalId"] = avS(a.ID)
	it["runId"] = avS(a.RunID)
	it["tool"] = avS(a.Tool)
	if len(a.Arguments) > 0 {
		it["arguments"] = avS(string(a.Arguments))
	}
	it["status"] = avS(string(a.Status))
	if a.Decision != "" {
		it["decision"] = avS(string(a.Decision))
	}
	if a.Reason != "" {
		it["reason"] = avS(a.Reason)
	}
	if a.DecidedBy != "" {
		it["decidedBy"] = avS(a.DecidedBy)
	}
	for name, t := range map[string]time.Time{"requestedAt": a.RequestedAt, "expiresAt": a.ExpiresAt, "decidedAt": a.DecidedAt} {
		if !t.IsZero() {
			it[name] = avTime(t)
		}
	}
	it[attrTTL] = avN(ttl)
	return it
}

func decodeApproval(it item) (belay.Approval, error) {
	d := decoder{it: it}
	a := belay.Approval{
		ID:          d.str("approvalId"),
		RunID:       d.str("runId"),
		Tool:        d.str("tool"),
		Status:      belay.ApprovalStatus(d.str("status")),
		Decision:    belay.Decision(d.str("decision")),
		Reason:      d.str("reason"),
		DecidedBy:   d.str("decidedBy"),
		RequestedAt: d.time("requestedAt"),
		ExpiresAt:   d.time("expiresAt"),
		DecidedAt:   d.time("decidedAt"),
	}
	if args := d.str("arguments"); args != "" {
		a.Arguments = json.RawMessage(args)
	}
	if d.err != nil {
		return a, fmt.Errorf("decode approval %s: %w", a.ID, d.err)
	}
	return a, nil
}

// requestToken derives a ClientRequestToken (at most 36 characters) from the
// parts that identify one logical write, so that a repeat of exactly that
// write within DynamoDB's ten-minute window is answered without writing again.
func requestToken(parts ...string) string {
	sum := sha256.Sum256([]byte(strings.Join(parts, "\x00")))
	return hex.EncodeToString(sum[:16])
}
