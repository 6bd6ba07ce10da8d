#!/usr/bin/python3
"""kazoo_lock takes part in a lock with kazoo's Lock recipe, for tenure's
interoperability tests (zkelect/interop_test.go).

Usage: kazoo_lock.py <connectString> <lockPath> <name> <holdMillis>

The lock is client.Lock(lockPath, identifier=name,
extra_lock_patterns=("-lock-",)) (extra_lock_patterns exists since kazoo
2.7.1), so that kazoo counts Curator's and tenure's "_c_<uuid>-lock-<seq>"
nodes as contenders next to its own "<uuid hex>__lock__<seq>". The node's
data is <name>.

It prints, one line each, on stdout:

    QUEUED <name> <node>            once its lock node exists
    ACQUIRED <name> <unix nanos>    when acquire() has returned
    RELEASING <name> <unix nanos>   just before release(): the lock is no
                                    longer used from here on
    RELEASED <name> <unix nanos>    when release() has returned

and exits 0. It holds the lock for holdMillis, or, when holdMillis is 0,
until a line "release" arrives on stdin or stdin closes.
"""
import logging
import sys
import threading
import time

from kazoo.client import KazooClient

_print_lock = threading.Lock()
_queued = False


def say(line):
    with _print_lock:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


def report_queued(lock, name):
    """Prints QUEUED once lock.node is known; returns whether it has."""
    global _queued
    with _print_lock:
        if _queued:
            return True
        node = lock.node
        if node is None:
            return False
        sys.stdout.write("QUEUED %s %s\n" % (name, node))
        sys.stdout.flush()
        _queued = True
        return True


def main():
    if len(sys.argv) != 5:
        sys.stderr.write("usage: kazoo_lock.py connectString lockPath name holdMillis\n")
        return 2
    connect, lock_path, name, hold_millis = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    client = KazooClient(hosts=connect, timeout=2.0)
    client.start(timeout=20)
    lock = client.Lock(lock_path, identifier=name, extra_lock_patterns=("-lock-",))

    done = threading.Event()

    def watch():
        while not done.is_set() and not report_queued(lock, name):
            time.sleep(0.005)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()

    lock.acquire()
    acquired = time.time_ns()
    done.set()
    report_queued(lock, name)  # QUEUED always comes first
    say("ACQUIRED %s %d" % (name, acquired))

    if hold_millis > 0:
        time.sleep(hold_millis / 1000.0)
    else:
        for line in sys.stdin:
            if line.strip() == "release":
                break

    say("RELEASING %s %d" % (name, time.time_ns()))
    lock.release()
    say("RELEASED %s %d" % (name, time.time_ns()))
    client.stop()
    client.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
