package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/belay-dev/belay/internal/belay"
)

// RecordDelivery stores d unless a delivery with its provider and id is
// stored, in one transaction, and returns what is stored. Returns invalid
// for a delivery belay.CheckDelivery refuses.
func (s *Store) RecordDelivery(ctx context.Context, d belay.Delivery) (belay.Delivery, bool, error) {
	if err := belay.CheckDelivery(d); err != nil {
		return belay.Delivery{}, false, err
	}
	if err := checkTimes("receivedAt", d.ReceivedAt); err != nil {
		return belay.Delivery{}, false, err
	}
	stored, recorded := d, false
	err := s.update(ctx, func(tx *sql.Tx) error {
		var receivedAt sql.NullInt64
		err := tx.QueryRowContext(ctx, "SELECT run_id, ignored, received_at FROM deliveries WHERE provider = ? AND id = ?",
			d.Provider, d.ID).Scan(&stored.RunID, &stored.Ignored, &receivedAt)
		switch {
		case err == nil:
			stored.ReceivedAt = fromNanos(receivedAt)
			return nil
		case !errors.Is(err, sql.ErrNoRows):
			return fmt.Errorf("look up delivery: %w", err)
		}
		if _, err := tx.ExecContext(ctx, "INSERT INTO deliveries (provider, id, run_id, ignored, received_at) VALUES (?, ?, ?, ?, ?)",
			d.Provider, d.ID, d.RunID, d.Ignored, nanos(d.ReceivedAt)); err != nil {
			return fmt.Errorf("insert delivery: %w", err)
		}
		stored, recorded = d, true
		stored.ReceivedAt = d.ReceivedAt.UTC()
		return nil
	})
	if err != nil {
		return belay.Delivery{}, false, wrap("record delivery "+d.Provider+"/"+d.ID, err)
	}
	return stored, recorded, nil
}
