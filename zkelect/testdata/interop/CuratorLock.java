// CuratorLock takes part in a lock with Apache Curator's InterProcessMutex,
// for tenure's interoperability tests (zkelect/interop_test.go).
//
// Usage: java CuratorLock <connectString> <lockPath> <name> <holdMillis>
//
// It prints, one line each, on stdout:
//
//	QUEUED <name> <node>            once its lock node exists (found as the
//	                                child of lockPath whose ephemeralOwner is
//	                                this client's session)
//	ACQUIRED <name> <unix nanos>    when acquire() has returned
//	RELEASING <name> <unix nanos>   just before release(): the lock is no
//	                                longer used from here on
//	RELEASED <name> <unix nanos>    when release() has returned
//
// and exits 0. It holds the lock for holdMillis, or, when holdMillis is 0,
// until a line "release" arrives on stdin or stdin closes. The node's data
// is <name> (InterProcessMutex's getLockNodeBytes, which by default leaves
// Curator's default data, the client's IP address).
import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.time.Instant;
import java.util.List;
import java.util.concurrent.TimeUnit;

import org.apache.curator.framework.CuratorFramework;
import org.apache.curator.framework.CuratorFrameworkFactory;
import org.apache.curator.framework.recipes.locks.InterProcessMutex;
import org.apache.curator.retry.ExponentialBackoffRetry;
import org.apache.log4j.ConsoleAppender;
import org.apache.log4j.Level;
import org.apache.log4j.Logger;
import org.apache.log4j.PatternLayout;
import org.apache.zookeeper.data.Stat;

public final class CuratorLock {
    private static final Object printLock = new Object();
    private static volatile boolean queued;

    private static long nanos() {
        Instant now = Instant.now();
        return now.getEpochSecond() * 1_000_000_000L + now.getNano();
    }

    private static void say(String line) {
        synchronized (printLock) {
            System.out.println(line);
            System.out.flush();
        }
    }

    // findOwn prints QUEUED once a child of lockPath owned by this session
    // exists; it returns whether it has been printed.
    private static boolean findOwn(CuratorFramework client, String lockPath, String name) throws Exception {
        synchronized (printLock) {
            if (queued) {
                return true;
            }
            if (client.checkExists().forPath(lockPath) == null) {
                return false;
            }
            long session = client.getZookeeperClient().getZooKeeper().getSessionId();
            List<String> children = client.getChildren().forPath(lockPath);
            for (String c : children) {
                Stat st = client.checkExists().forPath(lockPath + "/" + c);
                if (st != null && st.getEphemeralOwner() == session) {
                    say("QUEUED " + name + " " + c);
                    queued = true;
                    return true;
                }
            }
            return false;
        }
    }

    public static void main(String[] args) throws Exception {
        if (args.length != 4) {
            System.err.println("usage: CuratorLock connectString lockPath name holdMillis");
            System.exit(2);
        }
        String connect = args[0], lockPath = args[1], name = args[2];
        long holdMillis = Long.parseLong(args[3]);

        // Curator and ZooKeeper log through slf4j to log4j 1.2: warnings only, on stderr.
        Logger root = Logger.getRootLogger();
        root.removeAllAppenders();
        root.addAppender(new ConsoleAppender(new PatternLayout("%d{HH:mm:ss.SSS} %-5p %c{1}: %m%n"), "System.err"));
        root.setLevel(Level.WARN);

        CuratorFramework client = CuratorFrameworkFactory.builder()
                .connectString(connect)
                .sessionTimeoutMs(2000)
                .connectionTimeoutMs(2000)
                .retryPolicy(new ExponentialBackoffRetry(100, 5))
                .build();
        client.start();
        if (!client.blockUntilConnected(20, TimeUnit.SECONDS)) {
            System.err.println("CuratorLock: not connected to " + connect);
            System.exit(1);
        }
        InterProcessMutex mutex = new InterProcessMutex(client, lockPath) {
            @Override
            protected byte[] getLockNodeBytes() {
                return name.getBytes(StandardCharsets.UTF_8);
            }
        };

        Thread watcher = new Thread(() -> {
            try {
                while (!findOwn(client, lockPath, name)) {
                    Thread.sleep(10);
                }
            } catch (InterruptedException e) {
                // acquired, or exiting
            } catch (Exception e) {
                System.err.println("CuratorLock: looking for the own node: " + e);
            }
        });
        watcher.setDaemon(true);
        watcher.start();

        mutex.acquire();
        long acquired = nanos();
        findOwn(client, lockPath, name); // QUEUED always comes first
        watcher.interrupt();
        say("ACQUIRED " + name + " " + acquired);

        if (holdMillis > 0) {
            Thread.sleep(holdMillis);
        } else {
            BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
            String line;
            while ((line = in.readLine()) != null && !line.trim().equals("release")) {
                // wait for "release" or end of input
            }
        }

        say("RELEASING " + name + " " + nanos());
        mutex.release();
        say("RELEASED " + name + " " + nanos());
        client.close();
        System.exit(0);
    }
}
