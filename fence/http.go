package fence

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/tenure-go/tenure/internal/isnil"
)

// MaxBody is the default bound of the request body Middleware reads before
// it waits for the resource's lock: 32 MiB. A larger body gets 413. Set
// another with WithMaxBody.
const MaxBody = 32 << 20

// MiddlewareOption configures Middleware.
type MiddlewareOption func(*middlewareConfig)

type middlewareConfig struct {
	maxBody int64
}

// WithMaxBody bounds the request body Middleware reads, and keeps in
// memory, before it waits for the resource's lock: a larger body gets 413.
// Every request waiting for the lock holds its body, so n times the
// requests that may wait at once is the memory they can take. Default:
// MaxBody. 0 accepts only requests without a body. A negative n is a
// programming error: Middleware panics at once.
func WithMaxBody(n int64) MiddlewareOption {
	return func(c *middlewareConfig) { c.maxBody = n }
}

// HeaderTerm is the request header that carries the sender's term.
const HeaderTerm = "X-Tenure-Term"

// Middleware refuses requests whose HeaderTerm is lower than the highest
// term g has accepted for resource: 409 Conflict with a body naming both
// terms. A request without exactly one valid term (a decimal from 1 to
// math.MaxInt64, in one header value) gets 400. Accepted requests reach
// next while the resource's lock is held, so a newer leader's request
// cannot interleave with an older one's; a request whose context ends while
// it waits for that lock gets 503 and does not reach next. The body is read
// (up to MaxBody, or WithMaxBody's bound) before the wait: a sender that
// stalls mid-body (a paused old leader) holds no lock, and a waiting
// request whose client hangs up is seen to (net/http notices a closed
// connection only once the body has been read). A request whose term is
// already below the highest accepted is refused before its body is read
// (terms only grow, so it would be refused after too). next must not use
// g for the same resource (see Guard). Refusals count as verifier "http".
//
// A nil g or next, an empty resource, one that is not valid UTF-8 (every
// request would be refused as if its term were bad) or a negative
// WithMaxBody is a programming error: Middleware panics at once, as net/http does for a
// nil handler, instead of failing every request.
func Middleware(g *Guard, resource string, next http.Handler, opts ...MiddlewareOption) http.Handler {
	if g == nil || isnil.Nil(next) || resource == "" || !utf8.ValidString(resource) {
		panic("fence: Middleware needs a Guard, a resource name (valid UTF-8) and a handler")
	}
	cfg := middlewareConfig{maxBody: MaxBody}
	for _, o := range opts {
		if o != nil {
			o(&cfg)
		}
	}
	if cfg.maxBody < 0 {
		panic(fmt.Sprintf("fence: Middleware: WithMaxBody(%d): a bound in bytes, not negative", cfg.maxBody))
	}
	rf := g.resource(resource)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		raw := r.Header.Values(HeaderTerm)
		var token uint64
		var err error
		if len(raw) != 1 {
			err = fmt.Errorf("%d values", len(raw))
		} else if token, err = strconv.ParseUint(raw[0], 10, 64); err == nil {
			err = checkInput(resource, token)
		}
		if err != nil {
			http.Error(w, fmt.Sprintf("missing or invalid %s header %q: requests must carry the sender's term, once", HeaderTerm, strings.Join(raw, ", ")), http.StatusBadRequest)
			return
		}
		if err := g.stale(rf, resource, token, "http"); err != nil {
			// Stale already: not worth its body, which may be large and
			// slow to come. Close the connection rather than read the
			// rest of the body first, which net/http would (up to
			// 256 KiB) before it sent this answer.
			if r.ProtoMajor == 1 { // HTTP/2 streams end on their own
				w.Header().Set("Connection", "close")
			}
			http.Error(w, err.Error(), http.StatusConflict)
			return
		}
		if r.Body != nil && r.Body != http.NoBody {
			body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, cfg.maxBody))
			if err != nil {
				var tooBig *http.MaxBytesError
				if errors.As(err, &tooBig) {
					http.Error(w, fmt.Sprintf("request body above %d bytes", cfg.maxBody), http.StatusRequestEntityTooLarge)
					return
				}
				http.Error(w, "reading the request body: "+err.Error(), http.StatusBadRequest)
				return
			}
			r.Body = io.NopCloser(bytes.NewReader(body))
		}
		select {
		case rf.lock <- struct{}{}:
		case <-r.Context().Done():
			http.Error(w, "gave up waiting for the fence: "+context.Cause(r.Context()).Error(), http.StatusServiceUnavailable)
			return
		}
		defer func() { <-rf.lock }()
		if err := g.admitLocked(rf, resource, token, "http"); err != nil {
			http.Error(w, err.Error(), http.StatusConflict)
			return
		}
		next.ServeHTTP(w, r)
	})
}
