package dynamo

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/belay-dev/belay/internal/belay"
)

// A session lives in the partition "SESSION#<id>":
//
//	META         version, the request's chunk count, and the session's
//	             state without its request and turns (gzipped JSON)
//	SREQ#000, …  the session's request (its files, skills), gzipped JSON in
//	             chunks, written once
//	TURN#0001, … one turn each (gzipped JSON)
//
// Every change writes META on the condition that its version did not move
// since it was read, with the turn it changed, in one transaction; a
// change that loses the race reads again and decides anew.
const (
	prefixSessionReq  = "SREQ#"
	prefixSessionTurn = "TURN#"
)

func sessionPK(id string) string         { return "SESSION#" + id }
func sessionTurnSK(n int) string         { return fmt.Sprintf("%s%04d", prefixSessionTurn, n) }
func sessionRequestSK(i int) string      { return fmt.Sprintf("%s%03d", prefixSessionReq, i) }
func sessionDocAttr(b []byte) item       { return item{"doc": avB(b)} }
func isConditionFailed(code string) bool { return code == "ConditionalCheckFailed" }

// maxSessionWriteRetries bounds how often a change re-reads a session that
// moved under it.
const maxSessionWriteRetries = 8

// CreateSession stores the session's META and request chunks in one
// transaction, on the condition that its META does not exist. Returns
// invalid for a session belay.CheckSession refuses; conflict if its id
// exists.
func (s *Store) CreateSession(ctx context.Context, sess belay.Session) error {
	if err := belay.CheckSession(sess); err != nil {
		return err
	}
	if sess.Status != belay.SessionIdle || len(sess.Turns) > 0 {
		return belay.FieldErrorf(belay.CodeInvalid, "status", "a new session is idle and has no turns")
	}
	chunks, err := gzipChunks(sess.Request)
	if err != nil {
		return fmt.Errorf("create session %s: %w", sess.ID, err)
	}
	sess.Version = 1
	meta, err := s.sessionMeta(sess, len(chunks))
	if err != nil {
		return fmt.Errorf("create session %s: %w", sess.ID, err)
	}
	items := []types.TransactWriteItem{{Put: &types.Put{
		TableName: s.table, Item: meta,
		ConditionExpression:      aws.String("attribute_not_exists(#PK)"),
		ExpressionAttributeNames: exprNames("#PK"),
	}}}
	for i, c := range chunks {
		it := keyOf(sessionPK(sess.ID), sessionRequestSK(i))
		it["data"] = avB(c)
		it[attrTTL] = avN(s.ttlOf(sess.CreatedAt))
		items = append(items, types.TransactWriteItem{Put: &types.Put{TableName: s.table, Item: it}})
	}
	_, err = s.client.TransactWriteItems(ctx, &dynamodb.TransactWriteItemsInput{TransactItems: items})
	var canceled *types.TransactionCanceledException
	if errors.As(err, &canceled) && len(canceled.CancellationReasons) > 0 && isConditionFailed(reasonCode(canceled.CancellationReasons[0])) {
		return belay.Errorf(belay.CodeConflict, "session %s exists", sess.ID)
	}
	if err != nil {
		return fmt.Errorf("create session %s: %w", sess.ID, err)
	}
	return nil
}

// GetSession reads the session's partition. Returns not_found if it does
// not exist.
func (s *Store) GetSession(ctx context.Context, id string) (belay.Session, error) {
	sess, err := s.readSession(ctx, id)
	if err != nil {
		return belay.Session{}, fmt.Errorf("get session %s: %w", id, err)
	}
	return sess, nil
}

// StartTurn records t as the session's next turn (belay.Session.StartTurn).
func (s *Store) StartTurn(ctx context.Context, id string, t belay.Turn) (belay.Session, error) {
	return s.changeSession(ctx, "start turn of session", id, func(cur belay.Session) (belay.Session, bool, error) {
		next, err := cur.StartTurn(t)
		return next, err == nil, err
	})
}

// FinishTurn records the end of the session's running turn
// (belay.Session.FinishTurn).
func (s *Store) FinishTurn(ctx context.Context, id string, e belay.TurnEnd) (belay.Session, error) {
	return s.changeSession(ctx, "finish turn of session", id, func(cur belay.Session) (belay.Session, bool, error) {
		return cur.FinishTurn(e)
	})
}

// CloseSession closes the session; a closed one is returned as it is.
func (s *Store) CloseSession(ctx context.Context, id string, at time.Time) (belay.Session, error) {
	return s.changeSession(ctx, "close session", id, func(cur belay.Session) (belay.Session, bool, error) {
		next, changed := cur.Close(at)
		return next, changed, nil
	})
}

// changeSession reads the session, applies change and writes META (on the
// version read) with the last turn, retrying when another writer got there
// first.
func (s *Store) changeSession(ctx context.Context, op, id string, change func(belay.Session) (belay.Session, bool, error)) (belay.Session, error) {
	for attempt := 0; ; attempt++ {
		cur, err := s.readSession(ctx, id)
		if err != nil {
			return belay.Session{}, fmt.Errorf("%s %s: %w", op, id, err)
		}
		next, changed, err := change(cur)
		if err != nil {
			return belay.Session{}, err
		}
		if !changed {
			return cur, nil
		}
		if err := belay.CheckSession(next); err != nil {
			return belay.Session{}, err
		}
		next.Version = cur.Version + 1
		meta, err := s.sessionMeta(next, -1)
		if err != nil {
			return belay.Session{}, fmt.Errorf("%s %s: %w", op, id, err)
		}
		upd := &types.Update{
			TableName:                s.table,
			Key:                      keyOf(sessionPK(id), skMeta),
			UpdateExpression:         aws.String("SET #doc = :doc, #v = :next, #updatedAt = :u, #ttl = :ttl"),
			ConditionExpression:      aws.String("#v = :cur"),
			ExpressionAttributeNames: exprNames("#doc #v #updatedAt #ttl"),
			ExpressionAttributeValues: map[string]types.AttributeValue{
				":doc": meta["doc"], ":next": avN(next.Version), ":cur": avN(cur.Version),
				":u": avTime(next.UpdatedAt), ":ttl": meta[attrTTL],
			},
		}
		items := []types.TransactWriteItem{{Update: upd}}
		if last := next.LastTurn(); last != nil {
			doc, err := gzipJSON(last)
			if err != nil {
				return belay.Session{}, fmt.Errorf("%s %s: %w", op, id, err)
			}
			it := mergeItem(keyOf(sessionPK(id), sessionTurnSK(last.Turn)), sessionDocAttr(doc))
			it[attrTTL] = meta[attrTTL]
			items = append(items, types.TransactWriteItem{Put: &types.Put{TableName: s.table, Item: it}})
		}
		_, err = s.client.TransactWriteItems(ctx, &dynamodb.TransactWriteItemsInput{TransactItems: items})
		if err == nil {
			return next, nil
		}
		var canceled *types.TransactionCanceledException
		if !errors.As(err, &canceled) || len(canceled.CancellationReasons) == 0 ||
			!(isConditionFailed(reasonCode(canceled.CancellationReasons[0])) || hasReason(canceled.CancellationReasons, "TransactionConflict")) {
			return belay.Session{}, fmt.Errorf("%s %s: %w", op, id, err)
		}
		if attempt >= maxSessionWriteRetries {
			return belay.Session{}, belay.Errorf(belay.CodeConflict, "session %s is changing; try again", id)
		}
		if err := sleep(ctx, backoff(attempt)); err != nil {
			return belay.Session{}, err
		}
	}
}

// sessionMeta encodes the META item: the session without its request and
// turns. reqChunks < 0 leaves the chunk count out (it is written once).
func (s *Store) sessionMeta(sess belay.Session, reqChunks int) (item, error) {
	state := sess
	state.Request = belay.SessionRequest{}
	state.Turns = nil
	doc, err := gzipJSON(state)
	if err != nil {
		return nil, err
	}
	it := mergeItem(keyOf(sessionPK(sess.ID), skMeta), sessionDocAttr(doc))
	it["v"] = avN(sess.Version)
	it["updatedAt"] = avTime(sess.UpdatedAt)
	if reqChunks >= 0 {
		it["reqChunks"] = avN(int64(reqChunks))
	}
	it[attrTTL] = avN(s.ttlOf(sess.UpdatedAt))
	return it, nil
}

// readSession reads the whole partition with a consistent read and
// assembles the session.
func (s *Store) readSession(ctx context.Context, id string) (belay.Session, error) {
	in := &dynamodb.QueryInput{
		TableName:                 s.table,
		KeyConditionExpression:    aws.String("#PK = :pk"),
		ExpressionAttributeNames:  exprNames("#PK"),
		ExpressionAttributeValues: map[string]types.AttributeValue{":pk": avS(sessionPK(id))},
		ConsistentRead:            aws.Bool(true),
	}
	var meta item
	var chunks [][]byte
	var turns []belay.Turn
	for p := dynamodb.NewQueryPaginator(s.client, in); p.HasMorePages(); {
		out, err := p.NextPage(ctx)
		if err != nil {
			return belay.Session{}, err
		}
		for _, it := range out.Items {
			d := &decoder{it: it}
			switch sk := d.str(attrSK); {
			case sk == skMeta:
				meta = it
			case strings.HasPrefix(sk, prefixSessionReq):
				chunks = append(chunks, d.bytes("data"))
			case strings.HasPrefix(sk, prefixSessionTurn):
				var t belay.Turn
				if err := gunzipJSON(d.bytes("doc"), &t); err != nil {
					return belay.Session{}, fmt.Errorf("decode %s: %w", sk, err)
				}
				turns = append(turns, t)
			}
			if d.err != nil {
				return belay.Session{}, d.err
			}
		}
	}
	if meta == nil {
		return belay.Session{}, belay.Errorf(belay.CodeNotFound, "session %s not found", id)
	}
	d := &decoder{it: meta}
	var sess belay.Session
	if err := gunzipJSON(d.bytes("doc"), &sess); err != nil {
		return belay.Session{}, fmt.Errorf("decode session: %w", err)
	}
	sess.Version = d.num("v")
	if n := int(d.num("reqChunks")); n != len(chunks) {
		return belay.Session{}, fmt.Errorf("%d request chunks, want %d", len(chunks), n)
	}
	if d.err != nil {
		return belay.Session{}, d.err
	}
	if err := gunzipJSON(bytes.Join(chunks, nil), &sess.Request); err != nil {
		return belay.Session{}, fmt.Errorf("decode session request: %w", err)
	}
	sess.Turns = turns
	return sess, nil
}

func gzipJSON(v any) ([]byte, error) {
	raw, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("encode: %w", err)
	}
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	if _, err := zw.Write(raw); err != nil {
		return nil, err
	}
	if err := zw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

func gunzipJSON(b []byte, v any) error {
	zr, err := gzip.NewReader(bytes.NewReader(b))
	if err != nil {
		return err
	}
	raw, err := io.ReadAll(zr)
	if err != nil {
		return err
	}
	return json.Unmarshal(raw, v)
}

// gzipChunks gzips v's JSON and splits it into chunks that each fit an item.
func gzipChunks(v any) ([][]byte, error) {
	data, err := gzipJSON(v)
	if err != nil {
		return nil, err
	}
	var chunks [][]byte
	for len(data) > requestChunkBytes {
		chunks = append(chunks, data[:requestChunkBytes])
		data = data[requestChunkBytes:]
	}
	return append(chunks, data), nil
}

// mergeItem copies src's attributes into dst and returns dst.
func mergeItem(dst, src item) item {
	for k, v := range src {
		dst[k] = v
	}
	return dst
}
