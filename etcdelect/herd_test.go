package etcdelect_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tenure-go/tenure/election"
	"github.com/tenure-go/tenure/election/electiontest"
	"github.com/tenure-go/tenure/etcdelect"
)

// serverTraffic reads the embedded server's gRPC counters (registered on
// the default registry): unary calls started, and messages received and
// sent on streams, lease keep-alives left out (a background of one per
// candidate every RenewInterval).
func serverTraffic(t *testing.T) (unary, streamIn, streamOut float64) {
	t.Helper()
	mfs, err := prometheus.DefaultGatherer.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			var typ, method string
			for _, l := range m.GetLabel() {
				switch l.GetName() {
				case "grpc_type":
					typ = l.GetValue()
				case "grpc_method":
					method = l.GetValue()
				}
			}
			if method == "LeaseKeepAlive" {
				continue
			}
			v := m.GetCounter().GetValue()
			switch {
			case mf.GetName() == "grpc_server_started_total" && typ == "unary":
				unary += v
			case mf.GetName() == "grpc_server_msg_received_total" && typ != "unary":
				streamIn += v
			case mf.GetName() == "grpc_server_msg_sent_total" && typ != "unary":
				streamOut += v
			}
		}
	}
	if unary == 0 {
		t.Fatal("no grpc_server_* metrics on the default registry")
	}
	return unary, streamIn, streamOut
}

// TestHandoffCostDoesNotGrowWithTheQueue: the server traffic of a handoff
// (the holder resigns, the next waiter leads) is the same with 49 waiters
// as with 4: one delete, one watch event to the one waiter that watches the
// holder, its reads. A herd (every waiter watching the holder, or
// re-reading the queue on every change) would grow with the queue.
func TestHandoffCostDoesNotGrowWithTheQueue(t *testing.T) {
	const handoffs = 4
	perHandoff := func(n int) (unary, in, out float64) {
		ctx := ctxT(t, 2*time.Minute)
		key := fmt.Sprintf("%s-%d", electiontest.Key(t), n)
		es := make([]*election.Elector, n)
		for i := range es {
			cli := newClient(t, endpoint)
			e, err := election.New(etcdelect.New(cli), election.Config{Key: key, Identity: fmt.Sprint(i), TTL: 5 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() {
				cctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				_ = e.Close(cctx)
				cli.Close()
			})
			es[i] = e
		}
		if _, err := es[0].Campaign(ctx); err != nil {
			t.Fatal(err)
		}
		won := make([]chan error, n)
		for i := 1; i < n; i++ {
			won[i] = make(chan error, 1)
			go func() { _, err := es[i].Campaign(ctx); won[i] <- err }()
			waitPos(t, es[i], i)
		}
		time.Sleep(100 * time.Millisecond) // let the queueing traffic settle
		u0, in0, out0 := serverTraffic(t)
		for h := range handoffs {
			if err := es[h].Resign(ctx); err != nil {
				t.Fatal(err)
			}
			if err := <-won[h+1]; err != nil {
				t.Fatal(err)
			}
		}
		time.Sleep(100 * time.Millisecond) // the last handoff's tail
		u1, in1, out1 := serverTraffic(t)
		return (u1 - u0) / handoffs, (in1 - in0) / handoffs, (out1 - out0) / handoffs
	}
	su, si, so := perHandoff(5)
	lu, li, lo := perHandoff(50)
	t.Logf("per handoff with 4 waiters: %.2f unary calls, %.2f stream messages in, %.2f out; with 49: %.2f, %.2f, %.2f", su, si, so, lu, li, lo)
	if small, large := su+si+so, lu+li+lo; large > small+2 {
		t.Errorf("a handoff costs %.2f server messages with 49 waiters against %.2f with 4: it grows with the queue", large, small)
	}
}
