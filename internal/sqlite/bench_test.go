package sqlite_test

import (
	"context"
	"database/sql"
	"path/filepath"
	"testing"

	"github.com/belay-dev/belay/internal/belay"
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

// BenchmarkModelCall times a proxied model call's two store writes against
// an empty write transaction and a write that changes one row, both on the
// store's own connection (see storetest.BenchmarkModelCall).
func BenchmarkModelCall(b *testing.B) {
	var st *sqlite.Store
	open := func(tb testing.TB, opts storetest.Options) belay.Store {
		st = openStore(tb, opts).(*sqlite.Store)
		return st
	}
	storetest.BenchmarkModelCall(b, open,
		storetest.Baseline{Name: "empty write tx", Write: func(ctx context.Context) error { return sqlite.EmptyWrite(st, ctx) }},
		storetest.Baseline{Name: "one changed row", Write: func(ctx context.Context) error { return sqlite.OneRowWrite(st, ctx, "run-bench-call") }},
	)
}

// BenchmarkRequestSize times an event and a spend on a run with a small
// request against one with a tree at the reference limits (see
// storetest.BenchmarkRequestSize).
func BenchmarkRequestSize(b *testing.B) {
	storetest.BenchmarkRequestSize(b, openStore)
}
