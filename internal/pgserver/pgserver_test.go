package pgserver

import (
	"context"
	"errors"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/goleak"

	"github.com/tenure-go/tenure/internal/testnet"
)

// pgxpool's Close waits for its connections but not for its health-check
// goroutine, which ends just after; goleak.VerifyTestMain retries for a
// while, which covers it, so no goleak option is needed.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func startServer(t *testing.T) *Server {
	t.Helper()
	if err := Installed(); err != nil {
		t.Fatal(err)
	}
	began := time.Now()
	s, err := Start(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		s.Close()
		if t.Failed() {
			t.Logf("tail of %s:\n%s", s.LogFile(), testnet.LogTail(s.LogFile(), 0))
		}
	})
	t.Logf("PostgreSQL (%s) accepting connections on %s after %v", s.bin, s.Addr(), time.Since(began).Round(time.Millisecond))
	return s
}

func openPool(t *testing.T, dsn string) *pgxpool.Pool {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if err := pool.Ping(ctx); err != nil {
		t.Fatal(err)
	}
	return pool
}

// TestConcurrentUpdates starts a server, creates a database and runs two
// transactions that update the same row: the second waits for the first's
// row lock, then sees its update, so neither increment is lost.
func TestConcurrentUpdates(t *testing.T) {
	s := startServer(t)
	const db = "tenure-test" // needs quoting
	if err := s.CreateDatabase(db); err != nil {
		t.Fatal(err)
	}
	if err := s.CreateDatabase(db); err == nil {
		t.Fatal("second CreateDatabase of the same name succeeded")
	}
	if want := "postgres://postgres@" + s.Addr() + "/" + db + "?sslmode=disable"; s.DSN(db) != want {
		t.Errorf("DSN = %q, want %q", s.DSN(db), want)
	}
	pool := openPool(t, s.DSN(db))
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()

	var name string
	if err := pool.QueryRow(ctx, "SELECT current_database()").Scan(&name); err != nil || name != db {
		t.Fatalf("current_database() = %q, %v; want %q", name, err, db)
	}
	if _, err := pool.Exec(ctx, "CREATE TABLE counter (id int PRIMARY KEY, n int NOT NULL); INSERT INTO counter VALUES (1, 0)"); err != nil {
		t.Fatal(err)
	}

	tx1, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx1.Rollback(ctx)
	if _, err := tx1.Exec(ctx, "UPDATE counter SET n = n + 1 WHERE id = 1"); err != nil {
		t.Fatal(err)
	}

	// The second transaction's update blocks on tx1's row lock.
	second := make(chan error, 1)
	go func() {
		second <- func() error {
			tx2, err := pool.Begin(ctx)
			if err != nil {
				return err
			}
			defer tx2.Rollback(ctx)
			if _, err := tx2.Exec(ctx, "UPDATE counter SET n = n + 10 WHERE id = 1"); err != nil {
				return err
			}
			return tx2.Commit(ctx)
		}()
	}()
	for waiting := 0; waiting != 1; {
		if err := pool.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE 'UPDATE counter%'").Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		select {
		case err := <-second:
			t.Fatalf("second transaction ended (%v) while the first held the row", err)
		case <-time.After(10 * time.Millisecond):
		}
	}

	var n int
	if err := tx1.QueryRow(ctx, "SELECT n FROM counter WHERE id = 1").Scan(&n); err != nil || n != 1 {
		t.Fatalf("first transaction sees n = %d, %v; want 1", n, err)
	}
	if err := tx1.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-second; err != nil {
		t.Fatalf("second transaction: %v", err)
	}
	if err := pool.QueryRow(ctx, "SELECT n FROM counter WHERE id = 1").Scan(&n); err != nil || n != 11 {
		t.Fatalf("after both commits n = %d, %v; want 11", n, err)
	}

	// Serializable transactions that both read and write the same row: one
	// of them must fail with a serialization failure (SQLSTATE 40001).
	txA, err := pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.Serializable})
	if err != nil {
		t.Fatal(err)
	}
	defer txA.Rollback(ctx)
	txB, err := pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.Serializable})
	if err != nil {
		t.Fatal(err)
	}
	defer txB.Rollback(ctx)
	for _, tx := range []pgx.Tx{txA, txB} {
		if err := tx.QueryRow(ctx, "SELECT n FROM counter WHERE id = 1").Scan(&n); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := txA.Exec(ctx, "UPDATE counter SET n = n + 100 WHERE id = 1"); err != nil {
		t.Fatal(err)
	}
	if err := txA.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	_, err = txB.Exec(ctx, "UPDATE counter SET n = n + 1000 WHERE id = 1")
	if err == nil {
		err = txB.Commit(ctx)
	}
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "40001" {
		t.Fatalf("second serializable transaction: %v, want SQLSTATE 40001", err)
	}
}

// TestClose checks that Close stops the server even with a client connected,
// frees its port, keeps its directory and is idempotent.
func TestClose(t *testing.T) {
	s := startServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, s.DSN("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "BEGIN"); err != nil { // an open transaction
		t.Fatal(err)
	}

	began := time.Now()
	s.Close()
	if d := time.Since(began); d > StopTimeout/2 {
		t.Errorf("Close took %v with a client connected: not a fast shutdown", d)
	}
	t.Logf("Close took %v", time.Since(began).Round(time.Millisecond))
	s.Close()
	if c, err := net.DialTimeout("tcp", s.Addr(), time.Second); err == nil {
		c.Close()
		t.Errorf("%s still accepts connections after Close", s.Addr())
	}
	if _, err := os.Stat(s.DataDir()); err != nil {
		t.Errorf("data directory: %v", err)
	}
	log, err := os.ReadFile(s.LogFile())
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(log), "database system is shut down") {
		t.Errorf("log does not report a clean shutdown; tail:\n%s", testnet.LogTail(s.LogFile(), 0))
	}
}

// TestStartTwice runs two servers side by side, on different ports.
func TestStartTwice(t *testing.T) {
	a, b := startServer(t), startServer(t)
	if a.Port() == b.Port() {
		t.Fatalf("both servers on port %d", a.Port())
	}
	for _, s := range []*Server{a, b} {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		conn, err := pgx.Connect(ctx, s.DSN("postgres"))
		if err != nil {
			cancel()
			t.Fatal(err)
		}
		var port int
		err = conn.QueryRow(ctx, "SELECT current_setting('port')::int").Scan(&port)
		conn.Close(ctx)
		cancel()
		if err != nil || port != s.Port() {
			t.Errorf("server on %s reports port %d, %v", s.Addr(), port, err)
		}
	}
}

func TestParseVersion(t *testing.T) {
	for _, c := range []struct {
		a, b string
		less bool
	}{
		{"9.6", "15", true},
		{"15", "9.6", false},
		{"15", "16", true},
		{"16", "16", false},
		{"9", "9.6", true},
	} {
		a, okA := parseVersion(c.a)
		b, okB := parseVersion(c.b)
		if !okA || !okB {
			t.Fatalf("parseVersion(%q, %q) failed", c.a, c.b)
		}
		if got := versionLess(a, b); got != c.less {
			t.Errorf("versionLess(%s, %s) = %v, want %v", c.a, c.b, got, c.less)
		}
	}
	for _, bad := range []string{"", "main", "15.x", "-1"} {
		if _, ok := parseVersion(bad); ok {
			t.Errorf("parseVersion(%q) succeeded", bad)
		}
	}
}
