package chaos

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"sync"

	"github.com/tenure-go/tenure/fence"
)

// register is the protected resource: one value per key, written only
// through a fence.Guard that refuses tokens lower than the highest it has
// accepted. It runs in the checker (the test process) and serves the
// candidate processes over loopback HTTP:
//
//	POST /w?key=K&tok=T&val=V   200 written, 409 stale term
//	GET  /r?key=K               200 "<token> <value>" ("0 -" before any write)
//
// It keeps the log of accepted writes, in the order applied, for invariant
// 1. With unfenced set (the broken variant) it skips the guard.
type register struct {
	unfenced bool
	guard    fence.Guard

	mu       sync.Mutex
	state    map[string]accepted
	accepted map[string][]accepted
	refused  map[string]int

	srv  *http.Server
	ln   net.Listener
	done chan struct{}
}

// accepted is one write the register applied.
type accepted struct {
	tok uint64
	val string
	at  int64 // mono() when applied
}

func newRegister(unfenced bool) (*register, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	r := &register{unfenced: unfenced, state: map[string]accepted{}, accepted: map[string][]accepted{}, refused: map[string]int{}, ln: ln, done: make(chan struct{})}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /w", r.write)
	mux.HandleFunc("GET /r", r.read)
	r.srv = &http.Server{Handler: mux}
	go func() { defer close(r.done); _ = r.srv.Serve(ln) }()
	return r, nil
}

func (r *register) URL() string { return "http://" + r.ln.Addr().String() }

func (r *register) Close() {
	_ = r.srv.Close()
	<-r.done
}

func (r *register) write(w http.ResponseWriter, req *http.Request) {
	key, val := req.URL.Query().Get("key"), req.URL.Query().Get("val")
	tok, err := strconv.ParseUint(req.URL.Query().Get("tok"), 10, 64)
	if err != nil || key == "" || val == "" {
		http.Error(w, "bad write", http.StatusBadRequest)
		return
	}
	apply := func() error {
		r.mu.Lock()
		defer r.mu.Unlock()
		a := accepted{tok: tok, val: val, at: mono()}
		r.state[key] = a
		r.accepted[key] = append(r.accepted[key], a)
		return nil
	}
	if r.unfenced {
		err = apply()
	} else {
		err = r.guard.Do(key, tok, apply)
	}
	if errors.Is(err, fence.ErrStale) {
		r.mu.Lock()
		r.refused[key]++
		r.mu.Unlock()
		http.Error(w, err.Error(), http.StatusConflict)
		return
	}
	fmt.Fprintln(w, "ok")
}

func (r *register) read(w http.ResponseWriter, req *http.Request) {
	r.mu.Lock()
	a, ok := r.state[req.URL.Query().Get("key")]
	r.mu.Unlock()
	if !ok {
		fmt.Fprintln(w, "0 -")
		return
	}
	fmt.Fprintf(w, "%d %s\n", a.tok, a.val)
}

// history returns key's accepted writes, in the order applied, and how many
// writes were refused.
func (r *register) history(key string) ([]accepted, int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]accepted(nil), r.accepted[key]...), r.refused[key]
}

// firstAcceptedAtOrAbove returns when the first write with a token ≥ tok
// was accepted for key, or 0 if none was.
func (r *register) firstAcceptedAtOrAbove(key string, tok uint64) int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, a := range r.accepted[key] {
		if a.tok >= tok {
			return a.at
		}
	}
	return 0
}
