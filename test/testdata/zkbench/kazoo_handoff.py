"""kazoo side of BenchmarkZKHandoff (zk_bench_test.go).

N contender threads, each with its own KazooClient (its own ZooKeeper
connection and session), loop kazoo Lock acquire -> record -> release ->
acquire on one lock path, and the driver measures the handoff latency
itself: the time from the moment a holder decides to release (just before
release()) until the next holder's acquire() returns.

Usage:

    python3 kazoo_handoff.py <connect string> <lock path> <contenders> \
        <warm-up handoffs> <handoffs> <session timeout ms>

Once every contender is queued, the first <warm-up handoffs> handoffs run
untimed and unrecorded; the next <handoffs> are timed and recorded.

Protocol on stdout, one line each (the same as CuratorHandoff.java):

    queued         every contender is queued under the lock path; warm-up starts
    start          the warm-up handoffs are done; timing starts
    progress K     K handoffs so far, warm-up included (every 100 ms)
    finished       the last handoff was recorded; timing stops
    lat NS         one handoff latency in nanoseconds (handoffs lines)
    elapsed NS     first release to last acquisition, in nanoseconds
    error TEXT     a failure (two holders at once, an exception); exit code 1
    ok             clean end: every client closed

On stdin, one line each: "go" after "start" (the benchmark has read its
counters: the first timed release waits for it), "stop" after "finished"
(the benchmark has read them again: only then do the waiters stop and the
clients close, whose requests must not count). Closing stdin aborts the
run: the driver closes its clients and exits 2. kazoo's own logging goes to stderr at WARNING.
"""

import logging
import os
import sys
import threading
import time

from kazoo.client import KazooClient

out_lock = threading.Lock()


def say(line):
    with out_lock:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


class State:
    """Handoff state, guarded by mu (as handoffState in the Go benchmark)."""

    def __init__(self, warmup, count):
        self.mu = threading.Lock()
        self.warmup = warmup
        self.count = count
        self.release = 0
        self.have_release = False
        self.first = 0
        self.last = 0
        self.handoffs = 0
        self.lats = []
        self.holders = 0  # must stay <= 1; guarded by holders_mu
        self.holders_mu = threading.Lock()
        self.start = threading.Event()
        self.finished = threading.Event()  # the last handoff, a failure, or an abort
        self.go = threading.Event()  # "go" on stdin, a failure, or an abort
        self.stop = threading.Event()  # "stop" on stdin, a failure, or an abort
        self.stopping = False
        self.failure = None
        self.aborted = False

    def fail(self, why):
        with self.holders_mu:
            if self.failure is None:
                self.failure = why
        say("error " + why.replace("\n", " "))
        self.finished.set()
        self.go.set()
        self.stop.set()


def contend(st, i, lock):
    try:
        while True:
            lock.acquire()
            if st.stopping:
                return
            with st.holders_mu:
                st.holders += 1
                h = st.holders
            if h != 1:
                st.fail("contender %d acquired while %d other(s) hold the lock" % (i, h - 1))
            # The first holder keeps the lock until every contender has
            # queued behind it; later holders pass straight through.
            st.start.wait()
            if st.stopping:
                return
            with st.mu:
                now = time.perf_counter_ns()
                if st.have_release:
                    if st.handoffs >= st.warmup:
                        st.lats.append(now - st.release)
                        st.last = now
                    st.handoffs += 1
                if st.handoffs == st.warmup:
                    say("start")  # before the release time is read: not timed
                    st.go.wait()  # the benchmark reads its counters first
                if st.handoffs >= st.warmup + st.count:
                    say("finished")
                    st.finished.set()  # keep the lock: nobody else may win after this
                    return
                with st.holders_mu:
                    st.holders -= 1
                st.release = time.perf_counter_ns()
                st.have_release = True
                if st.handoffs == st.warmup:
                    st.first = st.release
            lock.release()
    except Exception as e:  # noqa: BLE001 - any failure ends the run
        if not st.stopping:
            st.fail("contender %d: %r" % (i, e))


def main():
    if len(sys.argv) != 7:
        sys.stderr.write(
            "usage: kazoo_handoff.py <connect> <lock path> <contenders> "
            "<warm-up handoffs> <handoffs> <session timeout ms>\n"
        )
        return 64
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    connect, path = sys.argv[1], sys.argv[2]
    n, warmup, count, session_ms = (int(a) for a in sys.argv[3:7])
    st = State(warmup, count)

    def watch_stdin():
        # Closing stdin (the benchmark giving up) aborts the run.
        try:
            for line in sys.stdin:
                if line.strip() == "go":
                    st.go.set()
                elif line.strip() == "stop":
                    st.stop.set()
        except Exception:  # noqa: BLE001
            pass
        if not st.stopping:
            st.aborted = True
            st.fail("aborted: stdin closed")

    threading.Thread(target=watch_stdin, name="stdin", daemon=True).start()

    def client():
        c = KazooClient(hosts=connect, timeout=session_ms / 1000.0)
        c.start(timeout=30)
        return c

    admin = client()
    clients, locks, threads = [], [], []
    try:
        for i in range(n):
            c = client()
            clients.append(c)
            locks.append(c.Lock(path, str(i)))
        for i in range(n):
            t = threading.Thread(target=contend, args=(st, i, locks[i]), name="contender-%d" % i)
            threads.append(t)
            t.start()
        # Start the clock once all n nodes are queued under the path.
        deadline = time.monotonic() + 60
        while st.failure is None:
            if admin.exists(path) is not None and len(admin.get_children(path)) == n:
                break
            if time.monotonic() > deadline:
                st.fail("contenders not all queued after 60 s")
                break
            time.sleep(0.002)
        if st.failure is None:
            say("queued")
            st.start.set()
            while not st.finished.wait(0.1):
                with st.mu:
                    k = st.handoffs
                say("progress %d" % k)
            st.stop.wait(60)  # the benchmark reads its counters first
    except Exception as e:  # noqa: BLE001
        st.fail("driver: %r" % (e,))
    finally:
        # Stop the waiters (a cancelled acquire deletes its node), then
        # close every client, which ends its session and with it every node
        # it still holds.
        st.stopping = True
        st.start.set()
        for lock in locks:
            lock.cancel()
        for t in threads:
            t.join(10)
            if t.is_alive():
                st.fail("%s still running 10 s after the cancel" % t.name)
        for c in clients + [admin]:
            c.stop()
            c.close()
    if st.failure is not None:
        code = 2 if st.aborted else 1
    else:
        with st.mu:
            lines = ["lat %d" % l for l in st.lats]
            lines.append("elapsed %d" % (st.last - st.first))
        with out_lock:
            sys.stdout.write("\n".join(lines) + "\n")
        say("ok")
        code = 0
    sys.stdout.flush()
    sys.stderr.flush()
    # Threads still blocked anywhere must not keep the process alive.
    os._exit(code)


if __name__ == "__main__":
    sys.exit(main())
