package fence

import (
	"fmt"
	"net/http"
	"strconv"
)

// HeaderTerm is the request header that carries the sender's term.
const HeaderTerm = "X-Tenure-Term"

// Middleware refuses requests whose HeaderTerm is lower than the highest
// term g has accepted for resource: 409 Conflict with a body naming both
// terms. A request without a valid term gets 400. Accepted requests reach
// next while the guard is held, so a newer leader's request cannot
// interleave with an older one's. Refusals count as verifier "http".
func Middleware(g *Guard, resource string, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		raw := r.Header.Get(HeaderTerm)
		token, err := strconv.ParseUint(raw, 10, 64)
		if raw == "" || err != nil || token == 0 {
			http.Error(w, fmt.Sprintf("missing or invalid %s header %q: requests must carry the sender's term", HeaderTerm, raw), http.StatusBadRequest)
			return
		}
		g.mu.Lock()
		defer g.mu.Unlock()
		if err := g.admitLocked(resource, token, "http"); err != nil {
			http.Error(w, err.Error(), http.StatusConflict)
			return
		}
		next.ServeHTTP(w, r)
	})
}
