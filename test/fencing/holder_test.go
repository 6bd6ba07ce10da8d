package fencing_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tenure-go/tenure/fence"
	"github.com/tenure-go/tenure/fence/pgfence"
)

// fatalTB turns the site helpers' t.Fatal into a panic in the holder
// process, which has no *testing.T.
type fatalTB struct{ testing.TB }

func (fatalTB) Helper()                   {}
func (fatalTB) Cleanup(func())            {}
func (fatalTB) Fatal(args ...any)         { panic(fmt.Sprint(args...)) }
func (fatalTB) Fatalf(f string, a ...any) { panic(fmt.Sprintf(f, a...)) }

// holderMain is holder A: it takes the lock, prints "LOCKED <term>", and
// for every "write <value>" line on stdin writes value through the backend
// fence, PostgreSQL and HTTP with its term, whatever its lock's context
// says (a process frozen past its lease does not know it yet), printing
// "RESULT <verifier> ok|stale|error:<msg>".
func holderMain() int {
	var t fatalTB
	key := os.Getenv("HOLDER_KEY")
	var s site
	switch os.Getenv("HOLDER_BACKEND") {
	case "etcd":
		s = etcdSite(t, os.Getenv("HOLDER_ETCD"))
	default:
		s = zkSite(t, os.Getenv("HOLDER_ZK"))
	}
	ctx := context.Background()
	m := s.newLock(t, key, "A")
	term, err := m.Lock(ctx)
	if err != nil {
		fmt.Fprintln(os.Stderr, "holder: Lock:", err)
		return 1
	}
	pool, err := pgxpool.New(ctx, os.Getenv("HOLDER_PG"))
	if err != nil {
		fmt.Fprintln(os.Stderr, "holder:", err)
		return 1
	}
	defer pool.Close()
	fmt.Printf("LOCKED %d %s\n", term.Token, term.Entry)
	report := func(verifier string, err error) {
		switch {
		case err == nil:
			fmt.Printf("RESULT %s ok\n", verifier)
		case errors.Is(err, fence.ErrStale):
			fmt.Printf("RESULT %s stale\n", verifier)
		default:
			fmt.Printf("RESULT %s error:%s\n", verifier, strings.ReplaceAll(err.Error(), " ", "_"))
		}
	}
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		value, ok := strings.CutPrefix(in.Text(), "write ")
		if !ok {
			continue
		}
		wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		report(s.backend, s.write(t, term, value))
		report("postgres", pgfence.Fence{}.Do(wctx, pool, key, term.Token, insert(key, value, term.Token)))
		if code := post(t, os.Getenv("HOLDER_URL"), term.Token, value); code == 409 {
			report("http", fence.ErrStale)
		} else if code != 200 {
			report("http", fmt.Errorf("HTTP %d", code))
		} else {
			report("http", nil)
		}
		cancel()
	}
	return 0
}
