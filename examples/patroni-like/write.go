package main

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/tenure-go/tenure/fence/pgfence"
)

// FenceResource is the name of the fence row every primary moves to its
// term when it is promoted, and every fenced write checks.
const FenceResource = "primary"

// schema is created by the first primary. tenure_fence is pgfence's table;
// terms is the election history as the primaries recorded it; rows is the
// application's data, each row tagged with the term it was written under.
var schema = []string{
	`CREATE TABLE IF NOT EXISTS terms (token bigint PRIMARY KEY, node text NOT NULL, at timestamptz NOT NULL DEFAULT clock_timestamp())`,
	`CREATE TABLE IF NOT EXISTS rows (id bigserial PRIMARY KEY, term bigint NOT NULL, node text NOT NULL,
		payload text NOT NULL, at timestamptz NOT NULL DEFAULT clock_timestamp())`,
}

// readWrite begins read-write transactions on a connection: members run
// with default_transaction_read_only until their manager opens them for
// writes, and the manager itself must write the fence before that.
type readWrite struct{ conn *pgx.Conn }

func (r readWrite) Begin(ctx context.Context) (pgx.Tx, error) {
	return r.conn.BeginTx(ctx, pgx.TxOptions{AccessMode: pgx.ReadWrite})
}

// Write inserts payload into rows, tagged with term and the name of the
// member it commits on, in the same transaction as the fence check: the
// transaction commits only if term is at least the highest term this
// database's fence row has seen. A client holding an old term is refused
// with an error wrapping fence.ErrStale; a demoted primary accepts no
// transaction at all (its manager stopped it). conn must be connected to
// the primary; term is the one its /primary endpoint reports. It returns
// the row's id.
func Write(ctx context.Context, conn *pgx.Conn, term uint64, payload string) (int64, error) {
	var id int64
	err := pgfence.Fence{}.Do(ctx, conn, FenceResource, term, func(ctx context.Context, tx pgx.Tx) error {
		return tx.QueryRow(ctx,
			`INSERT INTO rows (term, node, payload) VALUES ($1, current_setting('cluster_name'), $2) RETURNING id`,
			int64(term), payload).Scan(&id)
	})
	if err != nil {
		return 0, fmt.Errorf("write under term %d: %w", term, err)
	}
	return id, nil
}

// recordTerm moves the fence row to term and records the term in the
// history, in one transaction, creating the schema on first use. It runs on
// a freshly promoted member before it opens for writes.
func recordTerm(ctx context.Context, conn *pgx.Conn, term uint64, node string) error {
	db := readWrite{conn}
	if err := (pgfence.Fence{}).Setup(ctx, db); err != nil {
		return err
	}
	tx, err := db.Begin(ctx)
	if err != nil {
		return err
	}
	for _, s := range schema {
		if _, err := tx.Exec(ctx, s); err != nil {
			_ = tx.Rollback(ctx)
			return err
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return err
	}
	return pgfence.Fence{}.Do(ctx, db, FenceResource, term, func(ctx context.Context, tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `INSERT INTO terms (token, node) VALUES ($1, $2) ON CONFLICT (token) DO NOTHING`, int64(term), node)
		return err
	})
}
