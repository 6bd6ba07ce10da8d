package pgfence_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
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

// pool connects to the test database; params are session settings.
func pool(t *testing.T, params ...string) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(params); i += 2 {
		cfg.ConnConfig.RuntimeParams[params[i]] = params[i+1]
	}
	cfg.MaxConns = 32
	p, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

// dropAfter drops the named tables when the test ends, so that a second
// run (-count=2) starts from nothing.
func dropAfter(t *testing.T, db *pgxpool.Pool, tables ...string) {
	t.Helper()
	drop := func() {
		for _, tb := range tables {
			if _, err := db.Exec(context.Background(), `DROP TABLE IF EXISTS `+pgx.Identifier{tb}.Sanitize()); err != nil {
				t.Error(err)
			}
		}
	}
	drop()
	t.Cleanup(drop)
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
	dropAfter(t, db, "fence_concurrent", "writes")
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
	dropAfter(t, db, "fence_rollback")
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
	nop := func(context.Context, pgx.Tx) error { return nil }
	if err := (pgfence.Fence{}).Do(ctx, nil, "r", 5, nop); !errors.Is(err, tenure.ErrInvalidConfig) {
		t.Fatalf("nil database = %v", err) // a nil pointer panic before
	}
	if err := (pgfence.Fence{}).Setup(ctx, nil); !errors.Is(err, tenure.ErrInvalidConfig) {
		t.Fatalf("Setup on a nil database = %v", err)
	}
	// A nil *pgxpool.Pool in the interface (var p *pgxpool.Pool; if ... {p =
	// ...}): a nil pointer panic before.
	var none *pgxpool.Pool
	if err := (pgfence.Fence{}).Do(ctx, none, "r", 5, nop); !errors.Is(err, tenure.ErrInvalidConfig) {
		t.Fatalf("a nil *pgxpool.Pool = %v", err)
	}
	if err := (pgfence.Fence{}).Setup(ctx, none); !errors.Is(err, tenure.ErrInvalidConfig) {
		t.Fatalf("Setup on a nil *pgxpool.Pool = %v", err)
	}
	// With a write that would run: a nil one is refused on its own.
	if err := (pgfence.Fence{}).Do(ctx, db, "r", 0, nop); !errors.Is(err, tenure.ErrInvalidConfig) {
		t.Fatalf("token 0 = %v", err)
	}
	if err := (pgfence.Fence{}).Do(ctx, db, "r", 1<<63, nop); !errors.Is(err, tenure.ErrInvalidConfig) {
		t.Fatalf("token 2^63 = %v", err)
	}
	if err := (pgfence.Fence{}).Do(ctx, db, "", 5, nop); !errors.Is(err, tenure.ErrInvalidConfig) {
		t.Fatalf("empty resource = %v", err)
	}
	if err := (pgfence.Fence{}).Do(ctx, db, "r", 5, nil); !errors.Is(err, tenure.ErrInvalidConfig) {
		t.Fatalf("nil write = %v", err)
	}
	// A reserved word is an identifier like any other: it is quoted. It
	// failed with a syntax error before.
	dropAfter(t, db, "user")
	f := pgfence.Fence{Table: "user"}
	if err := f.Setup(ctx, db); err != nil {
		t.Fatalf("Setup(table user): %v", err)
	}
	if err := f.Do(ctx, db, "r", 5, nop); err != nil {
		t.Fatalf("Do(table user): %v", err)
	}
}

// TestDo_ReadCommittedWhateverTheServerDefault: with the session default at
// REPEATABLE READ or SERIALIZABLE, a newer term that waits on the fence row
// behind an older one still commits once the older one has, and an older
// term that waits behind a newer one is refused as stale. Both failed with
// a serialization error (SQLSTATE 40001) before Do chose its isolation.
func TestDo_ReadCommittedWhateverTheServerDefault(t *testing.T) {
	for _, level := range []string{"repeatable read", "serializable"} {
		t.Run(level, func(t *testing.T) {
			ctx := context.Background()
			db := pool(t, "default_transaction_isolation", level)
			table := "fence_" + strings.ReplaceAll(level, " ", "_")
			dropAfter(t, db, table)
			f := pgfence.Fence{Table: table}
			if err := f.Setup(ctx, db); err != nil {
				t.Fatal(err)
			}
			if err := f.Do(ctx, db, "r", 1, func(context.Context, pgx.Tx) error { return nil }); err != nil {
				t.Fatal(err)
			}
			// first holds the row lock until released; second waits on it.
			race := func(first, second uint64) (error, error) {
				inside, release := make(chan struct{}), make(chan struct{})
				firstErr := make(chan error, 1)
				go func() {
					firstErr <- f.Do(ctx, db, "r", first, func(context.Context, pgx.Tx) error {
						close(inside)
						<-release
						return nil
					})
				}()
				<-inside
				secondErr := make(chan error, 1)
				go func() {
					secondErr <- f.Do(ctx, db, "r", second, func(context.Context, pgx.Tx) error { return nil })
				}()
				waitForLockWait(t, db)
				close(release)
				return <-firstErr, <-secondErr
			}
			e1, e2 := race(10, 11)
			if e1 != nil || e2 != nil {
				t.Errorf("older 10 holds, newer 11 waits: %v, %v; want both committed", e1, e2)
			}
			e1, e2 = race(13, 12)
			if e1 != nil || !errors.Is(e2, fence.ErrStale) {
				t.Errorf("newer 13 holds, older 12 waits: %v, %v; want 13 committed and 12 stale", e1, e2)
			}
		})
	}
}

// waitForLockWait returns once a session of the test database waits for a
// lock (the second writer, on the fence row).
func waitForLockWait(t *testing.T, db *pgxpool.Pool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		var n int
		if err := db.QueryRow(context.Background(), `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n > 0 {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatal("no session waited for the fence row within 10 s")
}

// TestSetup_ConcurrentCallsAllSucceed: service instances that start at
// once each call Setup; CREATE TABLE IF NOT EXISTS alone fails some of
// them (23505 on pg_type) when they race.
func TestSetup_ConcurrentCallsAllSucceed(t *testing.T) {
	ctx := context.Background()
	db := pool(t)
	for round := 0; round < 20; round++ {
		dropAfter(t, db, "fence_setup")
		f := pgfence.Fence{Table: "fence_setup"}
		var wg sync.WaitGroup
		errs := make(chan error, 8)
		for i := 0; i < 8; i++ {
			wg.Add(1)
			go func() { defer wg.Done(); errs <- f.Setup(ctx, db) }()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			if err != nil {
				t.Fatalf("round %d: concurrent Setup: %v", round, err)
			}
		}
	}
}

// beginOnly is a Beginner with Begin alone (a wrapper, like patroni-like's
// readWrite).
type beginOnly struct {
	b interface {
		Begin(context.Context) (pgx.Tx, error)
	}
}

func (w beginOnly) Begin(ctx context.Context) (pgx.Tx, error) { return w.b.Begin(ctx) }

// TestDo_BeginOnlyBeginnerRunsAtReadCommitted: Do needs READ COMMITTED for
// a newer term waiting behind an older one to commit. A Beginner with Begin
// alone starts at the server's default level; under a default of
// SERIALIZABLE the newer term failed to serialize (SQLSTATE 40001).
func TestDo_BeginOnlyBeginnerRunsAtReadCommitted(t *testing.T) {
	ctx := context.Background()
	db := pool(t, "default_transaction_isolation", "serializable")
	dropAfter(t, db, "fence_wrap")
	f := pgfence.Fence{Table: "fence_wrap"}
	if err := f.Setup(ctx, db); err != nil {
		t.Fatal(err)
	}
	if err := f.Do(ctx, db, "r", 1, func(context.Context, pgx.Tx) error { return nil }); err != nil {
		t.Fatal(err)
	}
	inside, release := make(chan struct{}), make(chan struct{})
	firstErr := make(chan error, 1)
	go func() {
		firstErr <- f.Do(ctx, beginOnly{db}, "r", 10, func(context.Context, pgx.Tx) error { close(inside); <-release; return nil })
	}()
	<-inside
	secondErr := make(chan error, 1)
	go func() {
		secondErr <- f.Do(ctx, beginOnly{db}, "r", 11, func(context.Context, pgx.Tx) error { return nil })
	}()
	waitForLockWait(t, db)
	close(release)
	e1, e2 := <-firstErr, <-secondErr
	t.Logf("Begin-only Beginner, server default serializable: older 10: %v; newer 11: %v", e1, e2)
	if e1 != nil {
		t.Errorf("the older term failed: %v", e1)
	}
	if e2 != nil {
		t.Errorf("the newer term was refused: %v", e2)
	}
}

// dyingBeginner is a Begin-only Beginner whose transaction's connection is
// terminated by the server just before Do sets the isolation level.
type dyingBeginner struct {
	db     *pgxpool.Pool
	begins *int
}

func (w dyingBeginner) Begin(ctx context.Context) (pgx.Tx, error) {
	*w.begins++
	tx, err := w.db.Begin(ctx)
	if err != nil {
		return nil, err
	}
	return dyingTx{Tx: tx, db: w.db}, nil
}

type dyingTx struct {
	pgx.Tx
	db *pgxpool.Pool
}

func (tx dyingTx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	if strings.HasPrefix(sql, "SET TRANSACTION") {
		pid := tx.Conn().PgConn().PID()
		if _, err := tx.db.Exec(ctx, `SELECT pg_terminate_backend($1)`, pid); err != nil {
			return pgconn.CommandTag{}, err
		}
	}
	return tx.Tx.Exec(ctx, sql, args...)
}

// TestDo_FailureToSetReadCommittedIsReturned: only PostgreSQL's refusal
// in a savepoint lets Do run at another level than READ COMMITTED. Before,
// any failure of SET TRANSACTION (here the connection dies) made Do begin
// again and run, at the server's default level (SERIALIZABLE here).
func TestDo_FailureToSetReadCommittedIsReturned(t *testing.T) {
	ctx := context.Background()
	db := pool(t, "default_transaction_isolation", "serializable")
	dropAfter(t, db, "fence_dying")
	f := pgfence.Fence{Table: "fence_dying"}
	if err := f.Setup(ctx, db); err != nil {
		t.Fatal(err)
	}
	begins, wrote := 0, false
	err := f.Do(ctx, dyingBeginner{db: db, begins: &begins}, "r", 3, func(context.Context, pgx.Tx) error { wrote = true; return nil })
	t.Logf("Do, connection terminated before SET TRANSACTION: %v (%d Begin calls)", err, begins)
	if err == nil || !strings.Contains(err.Error(), "READ COMMITTED") {
		t.Errorf("Do = %v, want the failure to set READ COMMITTED", err)
	}
	if wrote {
		t.Error("Do ran the write although it could not set READ COMMITTED")
	}
	if begins != 1 {
		t.Errorf("Do called Begin %d times, want 1", begins)
	}
	var n int
	if err := db.QueryRow(ctx, `SELECT count(*) FROM fence_dying`).Scan(&n); err != nil || n != 0 {
		t.Errorf("fence rows = %d, %v; want none", n, err)
	}
}

// TestDo_BeginOnlyWrapperOfATxRunsAtItsLevel: a Begin-only Beginner that
// wraps a transaction of the caller's makes savepoints, in which
// PostgreSQL refuses SET TRANSACTION; Do then runs at the caller's level,
// as for a pgx.Tx, instead of failing.
func TestDo_BeginOnlyWrapperOfATxRunsAtItsLevel(t *testing.T) {
	ctx := context.Background()
	db := pool(t)
	dropAfter(t, db, "fence_wrap_tx")
	f := pgfence.Fence{Table: "fence_wrap_tx"}
	if err := f.Setup(ctx, db); err != nil {
		t.Fatal(err)
	}
	tx, err := db.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	wrote := false
	if err := f.Do(ctx, beginOnly{tx}, "r", 5, func(context.Context, pgx.Tx) error { wrote = true; return nil }); err != nil {
		t.Fatalf("Do through a Begin-only wrapper of a REPEATABLE READ transaction: %v", err)
	}
	if !wrote {
		t.Fatal("Do did not run the write")
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	var token int64
	if err := db.QueryRow(ctx, `SELECT token FROM fence_wrap_tx WHERE name = 'r'`).Scan(&token); err != nil || token != 5 {
		t.Fatalf("fence row = %d, %v; want 5", token, err)
	}
}

// TestDo_WriteErrorAfterCancelRollsBackInTheCallersTransaction: Do runs in
// the caller's transaction (a savepoint), and the write fails after the
// context was cancelled. The savepoint must still be rolled back: a
// rollback on the cancelled context is never sent, and the caller, who
// commits its transaction on another context, would commit the fence
// row's move and the failed write's partial work with it.
func TestDo_WriteErrorAfterCancelRollsBackInTheCallersTransaction(t *testing.T) {
	bg := context.Background()
	db := pool(t)
	dropAfter(t, db, "fence_cancel", "fence_cancel_data")
	f := pgfence.Fence{Table: "fence_cancel"}
	if err := f.Setup(bg, db); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(bg, `CREATE TABLE fence_cancel_data (v text)`); err != nil {
		t.Fatal(err)
	}
	outer, err := db.Begin(bg)
	if err != nil {
		t.Fatal(err)
	}
	defer outer.Rollback(bg) //nolint:errcheck // after Commit it is a no-op
	ctx, cancel := context.WithCancel(bg)
	boom := errors.New("boom")
	err = f.Do(ctx, outer, "r", 9, func(ctx context.Context, tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO fence_cancel_data VALUES ('partial')`); err != nil {
			return err
		}
		cancel() // the caller gives up, and the write fails
		return boom
	})
	if !errors.Is(err, boom) {
		t.Fatalf("Do = %v, want the write's error", err)
	}
	if err := outer.Commit(bg); err != nil {
		t.Fatalf("commit of the caller's transaction: %v", err)
	}
	var n int
	if err := db.QueryRow(bg, `SELECT count(*) FROM fence_cancel_data`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("%d row(s) of the failed write committed (%v), want none", n, err)
	}
	if err := db.QueryRow(bg, `SELECT count(*) FROM fence_cancel WHERE token > 0`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("the failed write's fence move committed (%d row(s), %v)", n, err)
	}
}

// TestDo_CancelAfterASuccessfulWriteIsNotCommittedInTheCallersTransaction:
// Do in the caller's transaction (a savepoint) whose write succeeds while
// the caller's ctx ends returns an error, and then nothing of it may
// commit with the caller's transaction. Before, pgx's savepoint Commit on
// an ended ctx sent no RELEASE but marked the savepoint closed, so the
// rollback sent nothing either: Do reported the ctx's error, and the write
// and the fence move committed with the caller's transaction.
func TestDo_CancelAfterASuccessfulWriteIsNotCommittedInTheCallersTransaction(t *testing.T) {
	bg := context.Background()
	db := pool(t)
	dropAfter(t, db, "fence_cancel_ok", "fence_cancel_ok_data")
	f := pgfence.Fence{Table: "fence_cancel_ok"}
	if err := f.Setup(bg, db); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(bg, `CREATE TABLE fence_cancel_ok_data (v text)`); err != nil {
		t.Fatal(err)
	}
	outer, err := db.Begin(bg)
	if err != nil {
		t.Fatal(err)
	}
	defer outer.Rollback(bg) //nolint:errcheck // after Commit it is a no-op
	ctx, cancel := context.WithCancel(bg)
	doErr := f.Do(ctx, outer, "r", 9, func(ctx context.Context, tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO fence_cancel_ok_data VALUES ('done')`); err != nil {
			return err
		}
		cancel() // the caller gives up just as the write is done
		return nil
	})
	if doErr == nil {
		t.Fatal("Do = nil after its ctx ended before the commit; want the ctx's error")
	}
	if err := outer.Commit(bg); err != nil {
		t.Fatalf("commit of the caller's transaction: %v", err)
	}
	var n int
	if err := db.QueryRow(bg, `SELECT count(*) FROM fence_cancel_ok_data`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("Do returned %v, yet %d row(s) of its write committed (%v)", doErr, n, err)
	}
	if err := db.QueryRow(bg, `SELECT count(*) FROM fence_cancel_ok WHERE token > 0`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("Do failed, yet its fence move committed (%d row(s), %v)", n, err)
	}
}
