package alarmpipe

import (
	"os"
	"testing"
	"time"
)

func pipe(t *testing.T) (r, w *os.File) {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close(); w.Close() })
	return r, w
}

// TestServe_FiresAtTheInstantNotBefore: an alarm set 200 ms ahead fires
// once, not before its instant, and Serve then returns eof when the
// writer closes.
func TestServe_FiresAtTheInstantNotBefore(t *testing.T) {
	r, w := pipe(t)
	at := Now() + int64(200*time.Millisecond)
	if _, err := w.WriteString("set\n"); err != nil {
		t.Fatal(err)
	}
	fired := make(chan int64, 2)
	done := make(chan bool, 1)
	go func() {
		eof, err := Serve(int(r.Fd()), func(l string, a *Alarm) bool {
			if l == "set" {
				a.Set(at)
			}
			return true
		}, func() { fired <- Now() })
		done <- eof && err == nil
	}()
	select {
	case f := <-fired:
		if f < at {
			t.Fatalf("fired %v before the instant", time.Duration(at-f))
		}
		t.Logf("fired %v after the instant", time.Duration(f-at))
	case <-time.After(5 * time.Second):
		t.Fatal("the alarm never fired")
	}
	w.Close()
	select {
	case ok := <-done:
		if !ok {
			t.Fatal("Serve did not return eof at the writer's close")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Serve did not return at the writer's close")
	}
	if len(fired) != 0 {
		t.Fatal("the alarm fired twice")
	}
}

// TestServe_UnreadLinesComeBeforeAPassedInstant: every line is in the
// pipe before Serve starts, the alarm's instant already passed: a later
// line that clears it, or that ends Serve, wins, and nothing fires.
func TestServe_UnreadLinesComeBeforeAPassedInstant(t *testing.T) {
	for _, last := range []string{"clear", "stop"} {
		t.Run(last, func(t *testing.T) {
			r, w := pipe(t)
			if _, err := w.WriteString("passed\n" + last + "\n"); err != nil {
				t.Fatal(err)
			}
			if last == "clear" {
				w.Close()
			}
			fired := false
			eof, err := Serve(int(r.Fd()), func(l string, a *Alarm) bool {
				switch l {
				case "passed":
					a.Set(Now() - int64(time.Second))
				case "clear":
					a.Clear()
				case "stop":
					return false
				}
				return true
			}, func() { fired = true })
			if err != nil || fired || eof != (last == "clear") {
				t.Fatalf("Serve = %v, %v; fired %v", eof, err, fired)
			}
		})
	}
}

// TestEvery_CallsUntilFalseOrStop: f runs at once and then every period,
// until it returns false; stop then returns at once, and may be called
// again. Stopped early, f is not called again.
func TestEvery_CallsUntilFalseOrStop(t *testing.T) {
	calls := make(chan int, 10)
	n := 0
	stop := Every(5*time.Millisecond, func() bool {
		n++
		calls <- n
		return n < 3
	})
	for want := 1; want <= 3; want++ {
		select {
		case got := <-calls:
			if got != want {
				t.Fatalf("call %d, want %d", got, want)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("call %d never came", want)
		}
	}
	stop()
	stop()
	if len(calls) != 0 {
		t.Fatalf("f ran after it returned false")
	}

	ran := make(chan struct{}, 100)
	stop = Every(time.Hour, func() bool { ran <- struct{}{}; return true })
	<-ran
	stop()
	if len(ran) != 0 {
		t.Fatal("f ran again after stop")
	}
}
