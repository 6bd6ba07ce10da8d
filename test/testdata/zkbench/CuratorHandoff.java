// CuratorHandoff is the Curator side of BenchmarkZKHandoff (zk_bench_test.go):
// N contender threads, each with its own CuratorFramework client (its own
// ZooKeeper connection and session), loop InterProcessMutex acquire →
// record → release → acquire on one lock path, and the driver measures the
// handoff latency itself: the time from the moment a holder decides to
// release (just before release()) until the next holder's acquire()
// returns.
//
// Usage (single-file source launch, Java 11+):
//
//	java -cp <curator, zookeeper, guava and slf4j jars> CuratorHandoff.java \
//	    <connect string> <lock path> <contenders> <warm-up handoffs> <handoffs> <session timeout ms>
//
// Once every contender is queued, the first <warm-up handoffs> handoffs run
// untimed and unrecorded (the JIT compiles the hot paths meanwhile: cold,
// Curator's first few hundred handoffs are 2-3 times slower); the next
// <handoffs> are timed and recorded.
//
// Protocol on stdout, one line each:
//
//	queued         every contender is queued under the lock path; warm-up starts
//	start          the warm-up handoffs are done; timing starts
//	progress K     K handoffs so far, warm-up included (every 100 ms, from
//	               the main thread)
//	finished       the last handoff was recorded; timing stops (start and
//	               finished come from the contender threads, outside the
//	               timed intervals)
//	lat NS         one handoff latency in nanoseconds (handoffs lines)
//	elapsed NS     first release to last acquisition, in nanoseconds
//	error TEXT     a failure (two holders at once, an exception); exit code 1
//	ok             clean end: every client closed
//
// On stdin, one line each: "go" after "start" (the benchmark has read its
// counters: the first timed release waits for it), "stop" after
// "finished" (the benchmark has read them again: only then do the
// waiters stop and the clients close, whose requests must not count).
// Closing stdin aborts the run: the driver closes its clients and exits 2.
// Curator's and ZooKeeper's own logging goes to stderr at WARN.
import java.io.BufferedOutputStream;
import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.io.FileDescriptor;
import java.io.FileOutputStream;
import java.io.PrintStream;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.atomic.AtomicReference;

import org.apache.curator.framework.CuratorFramework;
import org.apache.curator.framework.CuratorFrameworkFactory;
import org.apache.curator.framework.recipes.locks.InterProcessMutex;
import org.apache.curator.retry.RetryNTimes;

public class CuratorHandoff {
    static final PrintStream out = new PrintStream(new BufferedOutputStream(new FileOutputStream(FileDescriptor.out), 1 << 16), false);

    static synchronized void say(String line) {
        out.println(line);
        out.flush();
    }

    // Handoff state, guarded by mu (as handoffState in the Go benchmark).
    static final Object mu = new Object();
    static long release;
    static boolean haveRelease;
    static long first;
    static long last;
    static int handoffs;
    static long[] lats;

    static final AtomicInteger holders = new AtomicInteger(); // must stay ≤ 1
    static final CountDownLatch start = new CountDownLatch(1);
    static final CountDownLatch finished = new CountDownLatch(1); // the last handoff, a failure, or an abort
    static final CountDownLatch go = new CountDownLatch(1);       // "go" on stdin, a failure, or an abort
    static final CountDownLatch stop = new CountDownLatch(1);     // "stop" on stdin, a failure, or an abort
    static volatile boolean stopping;
    static final AtomicReference<String> failure = new AtomicReference<>();
    static volatile boolean aborted;

    static void fail(String why) {
        failure.compareAndSet(null, why);
        say("error " + why.replace('\n', ' '));
        finished.countDown();
        go.countDown();
        stop.countDown();
    }

    static CuratorFramework client(String connect, int sessionMs) throws InterruptedException {
        CuratorFramework c = CuratorFrameworkFactory.builder()
                .connectString(connect)
                .sessionTimeoutMs(sessionMs)
                .connectionTimeoutMs(Math.min(15000, sessionMs))
                .retryPolicy(new RetryNTimes(3, 100))
                .build();
        c.start();
        if (!c.blockUntilConnected(30, TimeUnit.SECONDS)) {
            throw new IllegalStateException("not connected to " + connect + " after 30 s");
        }
        return c;
    }

    static void contend(int i, InterProcessMutex m, int warmup, int count) {
        try {
            while (true) {
                m.acquire();
                int h = holders.incrementAndGet();
                if (h != 1) {
                    fail("contender " + i + " acquired while " + (h - 1) + " other(s) hold the lock");
                }
                // The first holder keeps the lock until every contender has
                // queued behind it; later holders pass straight through.
                start.await();
                synchronized (mu) {
                    long now = System.nanoTime();
                    if (haveRelease) {
                        if (handoffs >= warmup) {
                            lats[handoffs - warmup] = now - release;
                            last = now;
                        }
                        handoffs++;
                    }
                    if (handoffs == warmup) {
                        say("start"); // before the release time is read: not timed
                        go.await();   // the benchmark reads its counters first
                    }
                    if (handoffs >= warmup + count) {
                        say("finished");
                        finished.countDown(); // keep the lock: nobody else may win after this
                        return;
                    }
                    holders.decrementAndGet();
                    release = System.nanoTime();
                    haveRelease = true;
                    if (handoffs == warmup) {
                        first = release;
                    }
                }
                m.release();
            }
        } catch (Exception e) {
            if (!stopping) {
                fail("contender " + i + ": " + e);
            }
        }
    }

    public static void main(String[] args) throws Exception {
        if (args.length != 6) {
            System.err.println("usage: CuratorHandoff <connect> <lock path> <contenders> <warm-up handoffs> <handoffs> <session timeout ms>");
            System.exit(64);
        }
        String connect = args[0], path = args[1];
        int n = Integer.parseInt(args[2]), warmup = Integer.parseInt(args[3]), count = Integer.parseInt(args[4]),
                sessionMs = Integer.parseInt(args[5]);
        lats = new long[count];

        // Closing stdin (the benchmark giving up) aborts the run.
        Thread stdin = new Thread(() -> {
            try {
                BufferedReader in = new BufferedReader(new InputStreamReader(System.in));
                for (String line; (line = in.readLine()) != null; ) {
                    if (line.equals("go")) {
                        go.countDown();
                    } else if (line.equals("stop")) {
                        stop.countDown();
                    }
                }
            } catch (Exception e) {
            }
            if (!stopping) {
                aborted = true;
                fail("aborted: stdin closed");
            }
        }, "stdin");
        stdin.setDaemon(true);
        stdin.start();

        CuratorFramework admin = client(connect, sessionMs);
        List<CuratorFramework> clients = new ArrayList<>();
        List<Thread> threads = new ArrayList<>();
        int code = 0;
        try {
            for (int i = 0; i < n; i++) {
                clients.add(client(connect, sessionMs));
            }
            for (int i = 0; i < n; i++) {
                final int id = i;
                final InterProcessMutex m = new InterProcessMutex(clients.get(i), path);
                Thread t = new Thread(() -> contend(id, m, warmup, count), "contender-" + i);
                threads.add(t);
                t.start();
            }
            // Start the clock once all n nodes are queued under the path.
            long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(60);
            while (failure.get() == null) {
                if (admin.checkExists().forPath(path) != null && admin.getChildren().forPath(path).size() == n) {
                    break;
                }
                if (System.nanoTime() > deadline) {
                    fail("contenders not all queued after 60 s");
                    break;
                }
                Thread.sleep(2);
            }
            if (failure.get() == null) {
                say("queued");
                start.countDown();
                while (!finished.await(100, TimeUnit.MILLISECONDS)) {
                    int k;
                    synchronized (mu) {
                        k = handoffs;
                    }
                    say("progress " + k);
                }
                stop.await(60, TimeUnit.SECONDS); // the benchmark reads its counters first
            }
        } catch (Exception e) {
            fail("driver: " + e);
        } finally {
            // Stop the waiters (an interrupted acquire deletes its node),
            // then close every client, which ends its session and with it
            // every node it still holds.
            stopping = true;
            start.countDown();
            for (Thread t : threads) {
                t.interrupt();
            }
            for (Thread t : threads) {
                t.join(10000);
                if (t.isAlive()) {
                    fail(t.getName() + " still running 10 s after the interrupt");
                }
            }
            // In parallel: one after the other, 1,000 clients take minutes.
            clients.parallelStream().forEach(CuratorFramework::close);
            admin.close();
        }
        if (failure.get() != null) {
            code = aborted ? 2 : 1;
        } else {
            StringBuilder sb = new StringBuilder();
            synchronized (mu) {
                for (int i = 0; i < handoffs - warmup; i++) {
                    sb.append("lat ").append(lats[i]).append('\n');
                }
                sb.append("elapsed ").append(last - first).append('\n');
            }
            out.print(sb);
            say("ok");
        }
        out.flush();
        System.exit(code);
    }
}
