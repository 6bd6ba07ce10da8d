"""kazoo side of BenchmarkFailover (failover_bench_test.go): `etcdctl lock`
for ZooKeeper. Takes kazoo's Lock on a path with one client (one session
of the given timeout), runs a command while it holds it, and releases the
lock and closes the session when the command ends or on SIGTERM. A holder
killed with SIGKILL leaves its session to expire on the server.

Usage:

    python3 kazoo_lock.py <connect string> <lock path> <session timeout ms> CMD [ARG...]
"""

import signal
import subprocess
import sys

from kazoo.client import KazooClient


def main():
    if len(sys.argv) < 5:
        sys.stderr.write("usage: kazoo_lock.py <connect> <lock path> <session timeout ms> CMD [ARG...]\n")
        return 64
    connect, path, timeout_ms, cmd = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4:]
    child = None

    def on_term(signum, frame):
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, on_term)
    zk = KazooClient(hosts=connect, timeout=timeout_ms / 1000.0)
    zk.start(timeout=30)
    lock = zk.Lock(path, "kazoo")
    code = 0
    try:
        lock.acquire()
        child = subprocess.Popen(cmd)
        code = child.wait()
    except SystemExit as e:
        code = e.code
        if child is not None and child.poll() is None:
            child.terminate()
            child.wait()
    finally:
        try:
            lock.release()
        finally:
            zk.stop()
            zk.close()
    return code


if __name__ == "__main__":
    sys.exit(main())
