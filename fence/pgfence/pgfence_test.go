package pgfence_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/goleak"

	"github.com/tenure-go/tenure"
	"github.com/tenure-go/tenure/fence"
	"github.com/tenure-go/tenure/fence/pgfence"
	"github.com/tenure-go/tenure/internal/pgserver"
)

var dsn string

func TestMain(m *testing.M) {
	code := func() int {
		if err := pgserver.Installed(); err != nil {
			fmt.Fprintln(os.Stderr, "pgfence tests need PostgreSQL:", err)
			return 1
		}
		dir, err := os.MkdirTemp("", "tenure-pgfence-")
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer os.RemoveAll(dir)
		srv, err := pgserver.Start(filepath.Join(dir, "pg"))
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer srv.Close()
		if err := srv.CreateDatabase("fence"); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		dsn = srv.DSN("fence")
		return m.Run()
	}()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

func pool(t *testing.T) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 32
	p, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

// TestDo_ConcurrentTermsNeverCommitLowerAfterHigher: 30 writers with terms
// 1..30 race, each holding its transaction open a random while. Commits
// happen in non-decreasing term order; every refusal names a higher term
// already committed; the fence ends at the highest committed term.
func TestDo_ConcurrentTermsNeverCommitLowerAfterHigher(t *testing.T) {
	ctx := context.Background()
	db := pool(t)
	reg := prometheus.NewRegistry()
	m, err := fence.NewMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	f := pgfence.Fence{Table: "fence_concurrent", Metrics: m}
	if err := f.Setup(ctx, db); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(ctx, `CREATE TABLE writes (token bigint, committed_at timestamptz DEFAULT clock_timestamp())`); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	refused := map[uint64]uint64{}
	for tok := uint64(1); tok <= 30; tok++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			time.Sleep(time.Duration(rand.IntN(20)) * time.Millisecond)
			err := f.Do(ctx, db, "orders", tok, func(ctx context.Context, tx pgx.Tx) error {
				time.Sleep(time.Duration(rand.IntN(10)) * time.Millisecond)
				_, err := tx.Exec(ctx, `INSERT INTO writes (token) VALUES ($1)`, int64(tok))
				return err
			})
			var se *fence.StaleError
			switch {
			case errors.As(err, &se):
				mu.Lock()
				refused[tok] = se.Highest
				mu.Unlock()
			case err != nil:
				t.Errorf("term %d: %v", tok, err)
			}
		}()
	}
	wg.Wait()
	rows, err := db.Query(ctx, `SELECT token FROM writes ORDER BY committed_at`)
	if err != nil {
		t.Fatal(err)
	}
	committed, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		t.Fatal(err)
	}
	if !sort.SliceIsSorted(committed, func(i, j int) bool { return committed[i] < committed[j] }) {
		t.Fatalf("commits out of term order: %v", committed)
	}
	if len(committed)+len(refused) != 30 {
		t.Fatalf("%d committed + %d refused != 30", len(committed), len(refused))
	}
	for tok, highest := range refused {
		if highest <= tok {
			t.Fatalf("term %d refused with highest %d", tok, highest)
		}
	}
	var fenceTok int64
	if err := db.QueryRow(ctx, `SELECT token FROM fence_concurrent WHERE name = 'orders'`).Scan(&fenceTok); err != nil {
		t.Fatal(err)
	}
	if fenceTok != committed[len(committed)-1] {
		t.Fatalf("fence at %d, last commit %d", fenceTok, committed[len(committed)-1])
	}
	if got := testutil.ToFloat64(m.Rejections().WithLabelValues("orders", "postgres")); got != float64(len(refused)) {
		t.Fatalf("rejections = %v, want %d", got, len(refused))
	}
	t.Logf("30 racing terms: %d committed in term order, %d refused", len(committed), len(refused))
}

func TestDo_WriteErrorRollsBackTheFence(t *testing.T) {
	ctx := context.Background()
	db := pool(t)
	f := pgfence.Fence{Table: "fence_rollback"}
	if err := f.Setup(ctx, db); err != nil {
		t.Fatal(err)
	}
	boom := errors.New("boom")
	if err := f.Do(ctx, db, "r", 9, func(context.Context, pgx.Tx) error { return boom }); !errors.Is(err, boom) {
		t.Fatalf("Do = %v, want the write's error", err)
	}
	// The failed write did not move the fence: a lower term still passes.
	if err := f.Do(ctx, db, "r", 5, func(context.Context, pgx.Tx) error { return nil }); err != nil {
		t.Fatalf("term 5 after a rolled-back term 9: %v", err)
	}
}

func TestFence_RefusesBadInput(t *testing.T) {
	ctx := context.Background()
	db := pool(t)
	if err := (pgfence.Fence{Table: "Robert'); DROP TABLE x;--"}).Setup(ctx, db); !errors.Is(err, tenure.ErrInvalidConfig) {
		t.Fatalf("a hostile table name = %v, want ErrInvalidConfig", err)
	}
	if err := (pgfence.Fence{}).Do(ctx, db, "r", 0, nil); !errors.Is(err, tenure.ErrInvalidConfig) {
		t.Fatalf("token 0 = %v", err)
	}
	if err := (pgfence.Fence{}).Do(ctx, db, "r", 1<<63, nil); !errors.Is(err, tenure.ErrInvalidConfig) {
		t.Fatalf("token 2^63 = %v", err)
	}
}
