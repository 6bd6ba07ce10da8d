package fence_test

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/goleak"

	"github.com/tenure-go/tenure"
	"github.com/tenure-go/tenure/fence"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestGuard_RefusesLowerTerms is the brief's example: A gets 33, B gets 34
// and writes, A wakes and writes with 33.
func TestGuard_RefusesLowerTerms(t *testing.T) {
	reg := prometheus.NewRegistry()
	m, err := fence.NewMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	g := &fence.Guard{Metrics: m}
	if err := g.Check("report", 33); err != nil {
		t.Fatal(err)
	}
	if err := g.Check("report", 34); err != nil {
		t.Fatal(err)
	}
	if err := g.Check("report", 34); err != nil {
		t.Fatalf("the same term writing again: %v", err)
	}
	err = g.Check("report", 33)
	var se *fence.StaleError
	if !errors.Is(err, fence.ErrStale) || !errors.As(err, &se) || se.Token != 33 || se.Highest != 34 || se.Resource != "report" {
		t.Fatalf("stale write = %v, want StaleError{report, 33, 34}", err)
	}
	if err := g.Check("other", 1); err != nil {
		t.Fatalf("resources are independent: %v", err)
	}
	if err := g.Check("report", 0); !errors.Is(err, fence.ErrStale) {
		t.Fatalf("token 0 = %v, want refused", err)
	}
	if got := testutil.ToFloat64(m.Rejections().WithLabelValues("report", "guard")); got != 2 {
		t.Fatalf("tenure_fence_rejections_total = %v, want 2", got)
	}
	wrote := false
	if err := g.Do("report", 30, func() error { wrote = true; return nil }); !errors.Is(err, fence.ErrStale) || wrote {
		t.Fatalf("Do with a stale term: %v, wrote=%v", err, wrote)
	}
}

// TestGuard_ConcurrentTermsNeverAcceptLowerAfterHigher: whatever the
// interleaving, once a term is accepted no lower term is.
func TestGuard_ConcurrentTermsNeverAcceptLowerAfterHigher(t *testing.T) {
	var g fence.Guard
	var mu sync.Mutex
	var accepted []uint64
	var wg sync.WaitGroup
	for tok := uint64(1); tok <= 200; tok++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_ = g.Do("r", tok, func() error {
				mu.Lock()
				accepted = append(accepted, tok)
				mu.Unlock()
				return nil
			})
		}()
	}
	wg.Wait()
	for i := 1; i < len(accepted); i++ {
		if accepted[i] < accepted[i-1] {
			t.Fatalf("accepted %d after %d", accepted[i], accepted[i-1])
		}
	}
	if g.Highest("r") != accepted[len(accepted)-1] {
		t.Fatalf("Highest = %d, last accepted %d", g.Highest("r"), accepted[len(accepted)-1])
	}
}

func TestMiddleware_StaleTermGets409(t *testing.T) {
	reg := prometheus.NewRegistry()
	m, _ := fence.NewMetrics(reg)
	g := &fence.Guard{Metrics: m}
	served := 0
	h := fence.Middleware(g, "orders", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { served++ }))
	do := func(term string) *httptest.ResponseRecorder {
		r := httptest.NewRequest("POST", "/orders", nil)
		if term != "" {
			r.Header.Set(fence.HeaderTerm, term)
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w
	}
	if w := do("34"); w.Code != 200 {
		t.Fatalf("term 34: %d", w.Code)
	}
	w := do("33")
	if w.Code != http.StatusConflict || !strings.Contains(w.Body.String(), "stale term 33") || !strings.Contains(w.Body.String(), "34 already accepted") {
		t.Fatalf("term 33: %d %q, want 409 naming both terms", w.Code, w.Body.String())
	}
	for _, bad := range []string{"", "abc", "-1", "0"} {
		if w := do(bad); w.Code != http.StatusBadRequest {
			t.Fatalf("term %q: %d, want 400", bad, w.Code)
		}
	}
	if served != 1 {
		t.Fatalf("handler served %d requests, want 1", served)
	}
	if got := testutil.ToFloat64(m.Rejections().WithLabelValues("orders", "http")); got != 1 {
		t.Fatalf("rejections{http} = %v, want 1", got)
	}
}

// TestRequire_RefusesAdvisoryTerms: the strong mode refuses the zero term
// and a term from an efficiency-only backend, and admits a real one.
func TestRequire_RefusesAdvisoryTerms(t *testing.T) {
	var g fence.Guard
	redis := tenure.Term{Token: 7, Key: "report", Backend: "redis", Advisory: true}
	if err := g.CheckTerm("report", redis); !errors.Is(err, tenure.ErrInvalidConfig) || !strings.Contains(err.Error(), "redis") {
		t.Fatalf("advisory term: got %v, want ErrInvalidConfig naming redis", err)
	}
	if g.Highest("report") != 0 {
		t.Fatalf("a refused advisory term moved the guard to %d", g.Highest("report"))
	}
	if err := fence.Require(tenure.Term{}); !errors.Is(err, tenure.ErrInvalidConfig) {
		t.Fatalf("zero term: got %v", err)
	}
	etcd := tenure.Term{Token: 7, Key: "report", Backend: "etcd"}
	if err := g.CheckTerm("report", etcd); err != nil {
		t.Fatalf("linearizable term refused: %v", err)
	}
	if err := g.CheckTerm("report", tenure.Term{Token: 6, Backend: "etcd"}); !errors.Is(err, fence.ErrStale) {
		t.Fatalf("lower term: got %v, want ErrStale", err)
	}
}
