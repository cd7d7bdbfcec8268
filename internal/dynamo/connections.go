package dynamo

import (
	"context"
	"errors"
	"fmt"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/belay-dev/belay/internal/belay"
)

// A WebSocket connection of a session is two items, written and removed
// together: "SESSION#<session>" / "CONN#<id>" (the connection, with what
// was pushed to it: listed with its session) and "WSCONN#<id>" / "WSCONN"
// (which session it is on: API Gateway names only the connection).
const (
	prefixSessionConn = "CONN#"
	skConnection      = "WSCONN"
)

func connectionPK(id string) string { return "WSCONN#" + id }

// PutConnection writes both items of c in one transaction.
func (s *Store) PutConnection(ctx context.Context, c belay.Connection) error {
	if err := belay.CheckConnection(c); err != nil {
		return err
	}
	ttl := avN(s.ttlOf(c.ConnectedAt))
	main := keyOf(sessionPK(c.SessionID), prefixSessionConn+c.ID)
	main["connectionId"] = avS(c.ID)
	main["connectedAt"] = avTime(c.ConnectedAt)
	main["sent"] = avN(c.Sent)
	main[attrTTL] = ttl
	lookup := keyOf(connectionPK(c.ID), skConnection)
	lookup["sessionId"] = avS(c.SessionID)
	lookup[attrTTL] = ttl
	_, err := s.client.TransactWriteItems(ctx, &dynamodb.TransactWriteItemsInput{TransactItems: []types.TransactWriteItem{
		{Put: &types.Put{TableName: s.table, Item: main}},
		{Put: &types.Put{TableName: s.table, Item: lookup}},
	}})
	if err != nil {
		return fmt.Errorf("put connection %s: %w", c.ID, err)
	}
	return nil
}

// GetConnection reads the lookup item, then the connection. Returns
// not_found.
func (s *Store) GetConnection(ctx context.Context, id string) (belay.Connection, error) {
	out, err := s.client.GetItem(ctx, &dynamodb.GetItemInput{TableName: s.table, Key: keyOf(connectionPK(id), skConnection), ConsistentRead: aws.Bool(true)})
	if err != nil {
		return belay.Connection{}, fmt.Errorf("get connection %s: %w", id, err)
	}
	if out.Item == nil {
		return belay.Connection{}, belay.Errorf(belay.CodeNotFound, "connection %s not found", id)
	}
	sessionID := (&decoder{it: out.Item}).str("sessionId")
	got, err := s.client.GetItem(ctx, &dynamodb.GetItemInput{TableName: s.table,
		Key: keyOf(sessionPK(sessionID), prefixSessionConn+id), ConsistentRead: aws.Bool(true)})
	if err != nil {
		return belay.Connection{}, fmt.Errorf("get connection %s: %w", id, err)
	}
	if got.Item == nil {
		return belay.Connection{}, belay.Errorf(belay.CodeNotFound, "connection %s not found", id)
	}
	return decodeConnection(sessionID, got.Item)
}

func decodeConnection(sessionID string, it item) (belay.Connection, error) {
	d := &decoder{it: it}
	c := belay.Connection{ID: d.str("connectionId"), SessionID: sessionID, ConnectedAt: d.time("connectedAt"), Sent: d.num("sent")}
	if d.err != nil {
		return belay.Connection{}, fmt.Errorf("decode connection: %w", d.err)
	}
	return c, nil
}

// DeleteConnection removes both items; a missing connection is fine.
func (s *Store) DeleteConnection(ctx context.Context, id string) error {
	c, err := s.GetConnection(ctx, id)
	if belay.IsCode(err, belay.CodeNotFound) {
		_, err := s.client.DeleteItem(ctx, &dynamodb.DeleteItemInput{TableName: s.table, Key: keyOf(connectionPK(id), skConnection)})
		return err
	}
	if err != nil {
		return err
	}
	_, err = s.client.TransactWriteItems(ctx, &dynamodb.TransactWriteItemsInput{TransactItems: []types.TransactWriteItem{
		{Delete: &types.Delete{TableName: s.table, Key: keyOf(sessionPK(c.SessionID), prefixSessionConn+id)}},
		{Delete: &types.Delete{TableName: s.table, Key: keyOf(connectionPK(id), skConnection)}},
	}})
	if err != nil {
		return fmt.Errorf("delete connection %s: %w", id, err)
	}
	return nil
}

// SessionConnections queries the session's partition for its connections.
func (s *Store) SessionConnections(ctx context.Context, sessionID string) ([]belay.Connection, error) {
	in := &dynamodb.QueryInput{
		TableName:                 s.table,
		KeyConditionExpression:    aws.String("#PK = :pk AND begins_with(#SK, :conn)"),
		ExpressionAttributeNames:  exprNames("#PK #SK"),
		ExpressionAttributeValues: map[string]types.AttributeValue{":pk": avS(sessionPK(sessionID)), ":conn": avS(prefixSessionConn)},
		ConsistentRead:            aws.Bool(true),
	}
	out := []belay.Connection{}
	for p := dynamodb.NewQueryPaginator(s.client, in); p.HasMorePages(); {
		page, err := p.NextPage(ctx)
		if err != nil {
			return nil, fmt.Errorf("list connections of %s: %w", sessionID, err)
		}
		for _, it := range page.Items {
			c, err := decodeConnection(sessionID, it)
			if err != nil {
				return nil, err
			}
			out = append(out, c)
		}
	}
	return out, nil
}

// AdvanceConnection updates sent on the condition that it is `from`.
func (s *Store) AdvanceConnection(ctx context.Context, id string, from, to int64) (bool, error) {
	c, err := s.GetConnection(ctx, id)
	if belay.IsCode(err, belay.CodeNotFound) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	_, err = s.client.UpdateItem(ctx, &dynamodb.UpdateItemInput{
		TableName:                 s.table,
		Key:                       keyOf(sessionPK(c.SessionID), prefixSessionConn+id),
		UpdateExpression:          aws.String("SET #sent = :to"),
		ConditionExpression:       aws.String("attribute_exists(#PK) AND #sent = :from"),
		ExpressionAttributeNames:  exprNames("#sent #PK"),
		ExpressionAttributeValues: map[string]types.AttributeValue{":to": avN(to), ":from": avN(from)},
	})
	var failed *types.ConditionalCheckFailedException
	if errors.As(err, &failed) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("advance connection %s: %w", id, err)
	}
	return true, nil
}
