package sqlite_test

import (
	"database/sql"
	"path/filepath"
	"testing"

	"github.com/belay-dev/belay/internal/sqlite"
	"github.com/belay-dev/belay/internal/storetest"
)

// BenchmarkConsume times one ConsumeModelRequest: a whole write
// transaction that reads the capability and spends one request.
func BenchmarkConsume(b *testing.B) {
	storetest.BenchmarkConsume(b, openStore)
}

// BenchmarkEmptyWriteTransaction is the floor BenchmarkConsume is read
// against: BEGIN IMMEDIATE; COMMIT through database/sql on one connection
// to a store's database file, with the store's settings (WAL,
// synchronous=NORMAL, busy timeout, foreign keys).
func BenchmarkEmptyWriteTransaction(b *testing.B) {
	path := filepath.Join(b.TempDir(), "belay.db")
	s, err := sqlite.Open(b.Context(), path, sqlite.Options{})
	if err != nil {
		b.Fatalf("Open: %v", err)
	}
	if err := s.Close(); err != nil {
		b.Fatalf("Close: %v", err)
	}
	db, err := sql.Open("sqlite", sqlite.DSN(path, false))
	if err != nil {
		b.Fatalf("sql.Open: %v", err)
	}
	defer db.Close()
	db.SetMaxOpenConns(1)
	ctx := b.Context()
	b.ReportAllocs()
	for b.Loop() {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			b.Fatalf("begin: %v", err)
		}
		if err := tx.Commit(); err != nil {
			b.Fatalf("commit: %v", err)
		}
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "ops/s")
}
