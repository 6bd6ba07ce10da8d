package etcdelect_test

import (
	"errors"
	"testing"
	"time"

	"github.com/tenure-go/tenure"
	"github.com/tenure-go/tenure/election"
	"github.com/tenure-go/tenure/election/electiontest"
	"github.com/tenure-go/tenure/etcdelect"
)

// TestLost_EntryDeletedUnderALeaseWithLessThanASecondLeftIsOwnership: etcd
// reports a lease's time to live in whole seconds, truncated (0 for a live
// lease with 0.9 s left; -1 for one not found). An entry deleted by someone
// else while the session's lease had less than a second left was taken for
// the session's expiry: the session ended and the loss was reported as
// tenure.ErrSessionExpired. It is an ownership loss, and the session lives.
func TestLost_EntryDeletedUnderALeaseWithLessThanASecondLeftIsOwnership(t *testing.T) {
	ctx := ctxT(t, 30*time.Second)
	cli := newClient(t, endpoint)
	defer cli.Close()
	// Renewed every 2.9 s: between 2.05 and 2.9 s after the grant, the
	// server reports a TTL of 0.
	sess, err := etcdelect.New(cli).OpenSession(ctx, election.SessionOptions{TTL: 3 * time.Second, RenewInterval: 2900 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer sess.Close(ctx)
	tk, err := sess.Enqueue(ctx, electiontest.Key(t), "a")
	if err != nil {
		t.Fatal(err)
	}
	id, ok := etcdelect.EntryLease(tk.Key, tk.Name)
	if !ok {
		t.Fatalf("entry %q names no lease", tk.Name)
	}
	deadline := time.Now().Add(2900 * time.Millisecond)
	for {
		r, err := cli.TimeToLive(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if r.TTL == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the lease's TTL never read 0 before its renewal (last %d)", r.TTL)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if _, err := cli.Delete(ctx, tk.Name); err != nil {
		t.Fatal(err)
	}
	_, err = sess.Ahead(ctx, tk)
	if !errors.Is(err, tenure.ErrOwnershipLost) || errors.Is(err, tenure.ErrSessionExpired) {
		t.Fatalf("Ahead after the entry was deleted: %v, want tenure.ErrOwnershipLost", err)
	}
	if err := sess.Err(); err != nil {
		t.Fatalf("the session ended: %v", err)
	}
}
