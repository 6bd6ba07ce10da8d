// Package pgfence fences writes to PostgreSQL: the caller's write runs in
// the same transaction as an update of a fence row that succeeds only when
// the write's term is at least the highest the row has seen. A stale holder's
// transaction finds no row to update and is rolled back; a concurrent newer
// holder's update blocks it on the row lock until it commits, after which the
// older term no longer qualifies.
//
// That waiting is READ COMMITTED's: an update that waited re-reads the row
// and re-checks its condition. Do therefore runs its transaction at READ
// COMMITTED whatever the server's default_transaction_isolation (under
// REPEATABLE READ or SERIALIZABLE the waiting transaction would fail with a
// serialization error instead, the rightful newer holder's included), except
// when the caller passes its own transaction (see Beginner).
package pgfence

import (
	"context"
	"errors"
	"fmt"
	"math"
	"regexp"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/tenure-go/tenure"
	"github.com/tenure-go/tenure/fence"
	"github.com/tenure-go/tenure/internal/isnil"
)

// DefaultTable is the fence table's name when Fence.Table is empty.
const DefaultTable = "tenure_fence"

// Beginner starts transactions: *pgx.Conn and *pgxpool.Pool both do, and
// Do starts theirs at READ COMMITTED (through their BeginTx). A
// *pgxpool.Pool is safe for concurrent use; a *pgx.Conn is not, and runs
// one transaction at a time. A pgx.Tx is a Beginner too: Do then runs in a
// savepoint of the caller's transaction, at the caller's isolation level,
// which must be READ COMMITTED for a waiting newer term to succeed (at
// REPEATABLE READ or SERIALIZABLE, Do returns PostgreSQL's serialization
// error, SQLSTATE 40001, and the caller retries the whole transaction).
type Beginner interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// txBeginner is what *pgx.Conn and *pgxpool.Pool offer beyond Begin.
type txBeginner interface {
	BeginTx(ctx context.Context, opts pgx.TxOptions) (pgx.Tx, error)
}

// rollbackTimeout bounds a rollback made after the caller's context ended,
// and a commit.
const rollbackTimeout = 5 * time.Second

// rollback rolls tx back on a context that ctx's end does not stop, within
// rollbackTimeout. On an ended context pgx sends nothing: a savepoint in
// the caller's own transaction would stay, and its work, the fence row's
// move included, would commit with the caller's transaction.
func rollback(ctx context.Context, tx pgx.Tx) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), rollbackTimeout)
	defer cancel()
	_ = tx.Rollback(rctx)
}

// begin starts Do's transaction at READ COMMITTED. A pgx.Tx runs Do in a
// savepoint, at its own level (see Beginner). Any other Beginner (a wrapper
// offering Begin alone) starts at the server's default level, which may be
// stricter: the transaction is set to READ COMMITTED, unless it is a
// savepoint of a transaction the wrapper holds, which runs at that
// transaction's level, as a pgx.Tx does. Any other failure to set the
// level is returned: Do never runs at a level it did not choose.
func begin(ctx context.Context, db Beginner) (pgx.Tx, error) {
	if b, ok := db.(txBeginner); ok {
		return b.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.ReadCommitted})
	}
	tx, err := db.Begin(ctx)
	if err != nil {
		return nil, err
	}
	if _, ok := db.(pgx.Tx); ok {
		return tx, nil
	}
	var level string
	if err := tx.QueryRow(ctx, `SHOW transaction_isolation`).Scan(&level); err != nil {
		rollback(ctx, tx)
		return nil, err
	}
	if level == "read committed" {
		return tx, nil
	}
	if _, err := tx.Exec(ctx, `SET TRANSACTION ISOLATION LEVEL READ COMMITTED`); err != nil {
		rollback(ctx, tx)
		if !inSubtransaction(err) {
			return nil, fmt.Errorf("pgfence: setting READ COMMITTED: %w", err)
		}
		// PostgreSQL refuses it in a savepoint: the Beginner wraps a
		// transaction of the caller's, and Do runs at its level, as for
		// a pgx.Tx (see Beginner).
		return db.Begin(ctx)
	}
	return tx, nil
}

// inSubtransaction reports whether err is PostgreSQL's refusal of SET
// TRANSACTION in a savepoint: SQLSTATE 25001 (active_sql_transaction).
// PostgreSQL gives the same code once a query has taken a snapshot, which
// cannot happen here: begin's SHOW takes none.
func inSubtransaction(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "25001"
}

// Fence guards writes with a fence table. The zero value uses DefaultTable
// and counts nothing. A Fence is a plain value, safe for concurrent use as
// long as the Beginner given to each call is (pass a *pgxpool.Pool, not one
// *pgx.Conn, to concurrent calls).
type Fence struct {
	// Table is the fence table (created by Setup). Default: DefaultTable.
	// It must be a lower-case SQL identifier (a reserved word such as
	// "user" is fine: it is quoted); Setup and Do refuse any other name
	// with an error wrapping tenure.ErrInvalidConfig.
	Table string
	// Metrics, when set, counts refusals (verifier "postgres"). Default:
	// nil, counts nothing.
	Metrics *fence.Metrics
}

var ident = regexp.MustCompile(`^[a-z_][a-z0-9_]{0,62}$`)

func (f Fence) table() (string, error) {
	t := f.Table
	if t == "" {
		t = DefaultTable
	}
	if !ident.MatchString(t) {
		return "", fmt.Errorf("%w: pgfence: table name %q is not a lower-case SQL identifier", tenure.ErrInvalidConfig, t)
	}
	return pgx.Identifier{t}.Sanitize(), nil
}

// Setup creates the fence table if it does not exist:
// (name text primary key, token bigint not null). Concurrent calls, from
// several processes starting at once, are safe: they take turns on a
// transaction-level advisory lock named after the table (PostgreSQL's
// CREATE TABLE IF NOT EXISTS is not safe under concurrency).
func (f Fence) Setup(ctx context.Context, db Beginner) error {
	t, err := f.table()
	if err != nil {
		return err
	}
	if isnil.Nil(db) {
		return fmt.Errorf("%w: pgfence: no database (nil Beginner)", tenure.ErrInvalidConfig)
	}
	tx, err := db.Begin(ctx)
	if err != nil {
		return err
	}
	defer rollback(ctx, tx) // after Commit it is a no-op
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtext('tenure pgfence ' || $1))`, t); err != nil {
		return fmt.Errorf("pgfence: lock for creating %s: %w", t, err)
	}
	if _, err := tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS `+t+` (name text PRIMARY KEY, token bigint NOT NULL)`); err != nil {
		return fmt.Errorf("pgfence: create %s: %w", t, err)
	}
	return tx.Commit(ctx)
}

// Do runs write in a transaction that also moves resource's fence row to
// token, and commits both only if token is at least the row's current
// token. Otherwise it rolls back and returns a *fence.StaleError naming the
// highest token seen. Errors from write roll back too, the fence row's move
// included (unlike fence.Guard, which cannot undo it), and are returned.
// A ctx that ends before the commit fails Do with its error, and nothing
// commits, in the caller's transaction either; the commit itself, once
// begun, is not cut short by ctx (it is bounded at 5 s). An empty resource, a nil write, and token 0 or above math.MaxInt64 are
// refused with an error wrapping tenure.ErrInvalidConfig.
func (f Fence) Do(ctx context.Context, db Beginner, resource string, token uint64, write func(ctx context.Context, tx pgx.Tx) error) error {
	t, err := f.table()
	if err != nil {
		return err
	}
	switch {
	case isnil.Nil(db):
		return fmt.Errorf("%w: pgfence: no database (nil Beginner)", tenure.ErrInvalidConfig)
	case token == 0 || token > math.MaxInt64:
		return fmt.Errorf("%w: pgfence: token %d out of range", tenure.ErrInvalidConfig, token)
	case resource == "":
		return fmt.Errorf("%w: pgfence: empty resource name", tenure.ErrInvalidConfig)
	case write == nil:
		return fmt.Errorf("%w: pgfence: Do without a write", tenure.ErrInvalidConfig)
	}
	tx, err := begin(ctx, db)
	if err != nil {
		return err
	}
	defer rollback(ctx, tx) // after Commit it is a no-op
	if _, err := tx.Exec(ctx, `INSERT INTO `+t+` (name, token) VALUES ($1, 0) ON CONFLICT (name) DO NOTHING`, resource); err != nil {
		return fmt.Errorf("pgfence: %w", err)
	}
	tag, err := tx.Exec(ctx, `UPDATE `+t+` SET token = $2 WHERE name = $1 AND token <= $2`, resource, int64(token))
	if err != nil {
		return fmt.Errorf("pgfence: %w", err)
	}
	if tag.RowsAffected() == 0 {
		var highest int64
		if err := tx.QueryRow(ctx, `SELECT token FROM `+t+` WHERE name = $1`, resource).Scan(&highest); err != nil && !errors.Is(err, pgx.ErrNoRows) {
			return fmt.Errorf("pgfence: %w", err)
		}
		f.Metrics.Rejected(resource, "postgres")
		return &fence.StaleError{Resource: resource, Token: token, Highest: uint64(highest)}
	}
	if err := write(ctx, tx); err != nil {
		return err
	}
	// An ended ctx fails Do, and the deferred rollback (on a fresh
	// context) undoes everything. pgx's Commit of a savepoint on an ended
	// ctx would send nothing yet mark it released, and the write would
	// commit with the caller's transaction after Do reported a failure.
	// Once begun, the commit runs to its end, so that its error is its
	// outcome.
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("pgfence: %w", err)
	}
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), rollbackTimeout)
	defer cancel()
	return tx.Commit(cctx)
}

// DoTerm is Do with term's token, after refusing an advisory term (see
// fence.Require): the strong mode for callers that hold a tenure.Term.
func (f Fence) DoTerm(ctx context.Context, db Beginner, resource string, term tenure.Term, write func(ctx context.Context, tx pgx.Tx) error) error {
	if err := fence.Require(term); err != nil {
		return err
	}
	return f.Do(ctx, db, resource, term.Token, write)
}
