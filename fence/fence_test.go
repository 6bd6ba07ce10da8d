package fence_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

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
	if got := testutil.ToFloat64(m.Rejections().WithLabelValues("report", "guard")); got != 1 {
		t.Fatalf("tenure_fence_rejections_total = %v, want 1", got)
	}
	wrote := false
	if err := g.Do("report", 30, func() error { wrote = true; return nil }); !errors.Is(err, fence.ErrStale) || wrote {
		t.Fatalf("Do with a stale term: %v, wrote=%v", err, wrote)
	}
}

// TestGuard_RefusesBadInput: what no holder can send is a configuration
// error, not a refusal, and moves nothing. A token above MaxInt64 was
// accepted before and blocked every real term of the resource for good; a
// nil write panicked after moving the fence.
func TestGuard_RefusesBadInput(t *testing.T) {
	reg := prometheus.NewRegistry()
	m, err := fence.NewMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	g := &fence.Guard{Metrics: m}
	for _, tc := range []struct {
		name     string
		resource string
		token    uint64
		write    func() error
	}{
		{"empty resource", "", 5, func() error { return nil }},
		{"resource not UTF-8", "res\xff", 5, func() error { return nil }}, // a label: Prometheus panicked on it
		{"token 0", "r", 0, func() error { return nil }},
		{"token above MaxInt64", "r", math.MaxInt64 + 1, func() error { return nil }},
		{"max uint64", "r", math.MaxUint64, func() error { return nil }},
		{"nil write", "r", 11, nil},
	} {
		if err := g.Do(tc.resource, tc.token, tc.write); !errors.Is(err, tenure.ErrInvalidConfig) {
			t.Errorf("%s: Do = %v, want ErrInvalidConfig", tc.name, err)
		}
		if tc.write != nil {
			if err := g.Check(tc.resource, tc.token); !errors.Is(err, tenure.ErrInvalidConfig) {
				t.Errorf("%s: Check = %v, want ErrInvalidConfig", tc.name, err)
			}
		}
	}
	if h := g.Highest("r"); h != 0 {
		t.Fatalf("bad input moved the fence to %d", h)
	}
	if err := g.Check("r", math.MaxInt64); err != nil {
		t.Fatalf("the largest real term: %v", err)
	}
	if got := testutil.ToFloat64(m.Rejections().WithLabelValues("r", "guard")); got != 0 {
		t.Fatalf("bad input counted as %v refusals, want 0", got)
	}
}

// TestGuard_ResourcesDoNotWaitForEachOther: a write in progress on one
// resource holds up that resource only, and Highest never waits. Before,
// one lock covered every resource: both calls below blocked until the
// write ended.
func TestGuard_ResourcesDoNotWaitForEachOther(t *testing.T) {
	var g fence.Guard
	writing, release := make(chan struct{}), make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- g.Do("a", 5, func() error { close(writing); <-release; return nil })
	}()
	<-writing
	other := make(chan error, 1)
	go func() {
		err := g.Check("b", 3)
		if h := g.Highest("a"); err == nil && h != 5 {
			err = fmt.Errorf("Highest(a) = %d during a's write, want 5", h)
		}
		other <- err
	}()
	answered := false
	select {
	case err := <-other:
		answered = true
		if err != nil {
			t.Error(err)
		}
	case <-time.After(5 * time.Second):
		t.Error("Check(b) and Highest(a) still waiting for a's write after 5 s")
	}
	// The same resource does wait: a newer term's check lands after the write.
	same := make(chan error, 1)
	go func() { same <- g.Check("a", 6) }()
	select {
	case err := <-same:
		t.Errorf("Check(a, 6) returned %v during a's write, want it to wait", err)
	case <-time.After(50 * time.Millisecond):
	}
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if err := <-same; err != nil {
		t.Fatal(err)
	}
	if !answered {
		<-other
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
	for _, bad := range []string{"", "abc", "-1", "0", "+35", " 35", "0x23", "9223372036854775808", "18446744073709551615", "18446744073709551616", "35, 36"} {
		if w := do(bad); w.Code != http.StatusBadRequest {
			t.Fatalf("term %q: %d, want 400", bad, w.Code)
		}
	}
	// Two header lines are two values, as "35, 36" on one line is: refused,
	// where the first value alone was taken before.
	r := httptest.NewRequest("POST", "/orders", nil)
	r.Header.Add(fence.HeaderTerm, "36")
	r.Header.Add(fence.HeaderTerm, "35")
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, r)
	if rec.Code != http.StatusBadRequest {
		t.Fatalf("two %s headers: %d, want 400", fence.HeaderTerm, rec.Code)
	}
	if g.Highest("orders") != 34 {
		t.Fatalf("refused requests moved the fence to %d", g.Highest("orders"))
	}
	if served != 1 {
		t.Fatalf("handler served %d requests, want 1", served)
	}
	if got := testutil.ToFloat64(m.Rejections().WithLabelValues("orders", "http")); got != 1 {
		t.Fatalf("rejections{http} = %v, want 1", got)
	}
}

// TestMiddleware_GivesUpWhenTheRequestEnds: a request queued behind a slow
// one for the same resource stops waiting when its context ends (503) and
// never reaches the handler. Before, it waited for the lock regardless.
func TestMiddleware_GivesUpWhenTheRequestEnds(t *testing.T) {
	var g fence.Guard
	inside, release := make(chan struct{}), make(chan struct{})
	var served atomic.Int32
	h := fence.Middleware(&g, "orders", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if served.Add(1) == 1 {
			close(inside)
			<-release
		}
	}))
	req := func(ctx context.Context, term string) *httptest.ResponseRecorder {
		r := httptest.NewRequest("POST", "/orders", nil).WithContext(ctx)
		r.Header.Set(fence.HeaderTerm, term)
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w
	}
	slow := make(chan int, 1)
	go func() { slow <- req(context.Background(), "7").Code }()
	<-inside
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	queued := make(chan *httptest.ResponseRecorder, 1)
	go func() { queued <- req(ctx, "8") }()
	select {
	case w := <-queued:
		queued <- w
		if w.Code != http.StatusServiceUnavailable {
			t.Errorf("request given up while queued: %d %q, want 503", w.Code, w.Body.String())
		}
	case <-time.After(5 * time.Second):
		t.Error("a request whose context ended still waits for the fence 5 s later")
	}
	close(release)
	if code := <-slow; code != http.StatusOK {
		t.Fatalf("slow request: %d", code)
	}
	<-queued
	if n := served.Load(); n != 1 || g.Highest("orders") != 7 {
		t.Fatalf("handler served %d requests, fence at %d; want 1 and 7", n, g.Highest("orders"))
	}
}

// TestMiddleware_RefusesBadWiring: a nil guard or handler, or no resource,
// fails at construction, not at the first request.
func TestMiddleware_RefusesBadWiring(t *testing.T) {
	ok := http.HandlerFunc(func(http.ResponseWriter, *http.Request) {})
	for name, build := range map[string]func(){
		"nil guard":      func() { fence.Middleware(nil, "r", ok) },
		"nil handler":    func() { fence.Middleware(&fence.Guard{}, "r", nil) },
		"empty resource": func() { fence.Middleware(&fence.Guard{}, "", ok) },
		// Every request would get 400 "invalid term" otherwise.
		"resource not UTF-8": func() { fence.Middleware(&fence.Guard{}, "r\xff", ok) },
		"typed nil handler":  func() { fence.Middleware(&fence.Guard{}, "r", (*nilHandler)(nil)) },
	} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("%s: Middleware did not panic", name)
				}
			}()
			build()
		}()
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

// TestMetrics_RejectedWithANonUTF8KeyCounts: Rejected is called by every
// verifier with the term's key, which etcdfence and zkfence take from a
// Term as given. A key that is not valid UTF-8 made client_golang panic
// there; it is now counted under the key with its bad bytes replaced.
func TestMetrics_RejectedWithANonUTF8KeyCounts(t *testing.T) {
	reg := prometheus.NewRegistry()
	m, err := fence.NewMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	m.Rejected("k\xff", "zookeeper")
	if got := testutil.ToFloat64(m.Rejections().WithLabelValues("k\uFFFD", "zookeeper")); got != 1 {
		t.Fatalf("rejections for the sanitized key = %v, want 1", got)
	}
}

// TestMiddleware_ASenderStalledMidBodyHoldsNoLock: an old leader (term 5)
// sends its headers and part of its body, then stalls (paused). A new
// leader's request (term 6) must not wait behind it; and when the old one
// resumes, its request is refused. Before, the old request held the
// resource's lock while its handler read the body, so the new one waited
// (its client gave up), and net/http could not tell the waiter its client
// had gone: it ran next later anyway.
func TestMiddleware_ASenderStalledMidBodyHoldsNoLock(t *testing.T) {
	g := &fence.Guard{}
	var mu sync.Mutex
	var ran []string
	h := fence.Middleware(g, "r", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		ran = append(ran, r.Header.Get(fence.HeaderTerm)+":"+string(b))
		mu.Unlock()
	}))
	srv := httptest.NewServer(h)
	defer srv.Close()
	old, err := net.Dial("tcp", srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer old.Close()
	if _, err := fmt.Fprintf(old, "POST / HTTP/1.1\r\nHost: x\r\n%s: 5\r\nContent-Length: 10\r\n\r\nab", fence.HeaderTerm); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond) // the old request is in the middleware
	cli := &http.Client{Timeout: 2 * time.Second}
	req, _ := http.NewRequest("POST", srv.URL, strings.NewReader("new"))
	req.Header.Set(fence.HeaderTerm, "6")
	begun := time.Now()
	resp, err := cli.Do(req)
	if err != nil {
		t.Fatalf("the new leader's request, behind a sender stalled mid-body: %v after %v", err, time.Since(begun))
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("the new leader's request: %d", resp.StatusCode)
	}
	if _, err := io.WriteString(old, "cdefghij"); err != nil { // the old leader resumes
		t.Fatal(err)
	}
	oldResp, err := http.ReadResponse(bufio.NewReader(old), nil)
	if err != nil {
		t.Fatal(err)
	}
	oldResp.Body.Close()
	if oldResp.StatusCode != http.StatusConflict {
		t.Errorf("the old leader's request after the new one's: %d, want 409", oldResp.StatusCode)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(ran) != 1 || ran[0] != "6:new" {
		t.Errorf("next ran for %q, want the new leader's request only", ran)
	}
}

// TestMiddleware_StaleSenderIsRefusedBeforeItsBody: once term 6 has been
// accepted, a request under term 5 is refused (409) as soon as its headers
// are in, without waiting for a body that may be large or may never come
// (the old leader paused mid-send). Before, the middleware read the whole
// body first: the answer came only once the sender sent the rest.
func TestMiddleware_StaleSenderIsRefusedBeforeItsBody(t *testing.T) {
	g := &fence.Guard{}
	var served atomic.Int32
	srv := httptest.NewServer(fence.Middleware(g, "r", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { served.Add(1) })))
	defer srv.Close()
	if err := g.Check("r", 6); err != nil {
		t.Fatal(err)
	}
	old, err := net.Dial("tcp", srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer old.Close()
	// 10,000 bytes announced: under the 256 KiB net/http reads of an
	// unread body before it answers, unless the connection is to close.
	if _, err := fmt.Fprintf(old, "POST / HTTP/1.1\r\nHost: x\r\n%s: 5\r\nContent-Length: 10000\r\n\r\nab", fence.HeaderTerm); err != nil {
		t.Fatal(err)
	}
	_ = old.SetReadDeadline(time.Now().Add(5 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(old), nil)
	if err != nil {
		t.Fatalf("a stale sender stalled mid-body got no answer: %v", err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusConflict || !strings.Contains(string(b), "stale term 5") {
		t.Fatalf("stale sender: %d %q, want 409 naming term 5", resp.StatusCode, b)
	}
	if served.Load() != 0 || g.Highest("r") != 6 {
		t.Fatalf("served %d, fence at %d; want 0 and 6", served.Load(), g.Highest("r"))
	}
}

// TestMiddleware_WithMaxBodyBoundsTheBody: WithMaxBody sets the largest
// body Middleware reads (413 above it; 0 takes only empty bodies), and a
// negative bound is refused at construction.
func TestMiddleware_WithMaxBodyBoundsTheBody(t *testing.T) {
	var got []string
	ok := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		got = append(got, string(b))
	})
	do := func(h http.Handler, body string) int {
		r := httptest.NewRequest("POST", "/", strings.NewReader(body))
		if body == "" {
			r.Body = http.NoBody
		}
		r.Header.Set(fence.HeaderTerm, "3")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w.Code
	}
	four := fence.Middleware(&fence.Guard{}, "r", ok, fence.WithMaxBody(4))
	if code := do(four, "1234"); code != http.StatusOK {
		t.Fatalf("4-byte body under a 4-byte bound: %d", code)
	}
	if code := do(four, "12345"); code != http.StatusRequestEntityTooLarge {
		t.Fatalf("5-byte body under a 4-byte bound: %d, want 413", code)
	}
	zero := fence.Middleware(&fence.Guard{}, "r", ok, fence.WithMaxBody(0))
	if code := do(zero, ""); code != http.StatusOK {
		t.Fatalf("empty body under a 0 bound: %d", code)
	}
	if code := do(zero, "x"); code != http.StatusRequestEntityTooLarge {
		t.Fatalf("1-byte body under a 0 bound: %d, want 413", code)
	}
	if len(got) != 2 || got[0] != "1234" || got[1] != "" {
		t.Fatalf("handler saw %q, want the two bodies within bounds", got)
	}
	defer func() {
		if recover() == nil {
			t.Error("WithMaxBody(-1): Middleware did not panic")
		}
	}()
	fence.Middleware(&fence.Guard{}, "r", ok, fence.WithMaxBody(-1))
}

// nilHandler is a handler type whose nil value is not a usable handler.
type nilHandler struct{ n int }

func (h *nilHandler) ServeHTTP(http.ResponseWriter, *http.Request) { h.n++ }
