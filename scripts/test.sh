#!/usr/bin/env bash
# tenure's whole test suite, on a fresh machine: installs what the tests need
# (ZooKeeper, Curator, kazoo, a JDK, PostgreSQL and Redis from Debian's packages,
# when missing), checks formatting and vet, runs the core and the backends with
# the race detector, then the rest. The servers are started and stopped by the
# tests themselves on free loopback ports: etcd embedded in the test process,
# ZooKeeper and PostgreSQL as child processes (internal/zkserver,
# internal/pgserver).
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v go >/dev/null 2>&1; then
  echo "test.sh: Go is required (https://go.dev/doc/install)" >&2
  exit 1
fi

step() { printf '\n== %s\n' "$*"; }

# ZooKeeper's jars and PostgreSQL's programs for the tests' own servers
# (internal/zkserver and internal/pgserver start and stop them; nothing is
# started here, and the cluster Debian's postgresql package may start on port
# 5432 goes unused), Curator and kazoo for the interop tests, javac to
# compile their small Java program, and promtool (in Debian's prometheus
# package; its server is not used) for examples/cron-report's alert tests.
step "system packages"
need=()
for pkg in zookeeper libcurator-recipes-java python3-kazoo postgresql redis-server prometheus; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed' || need+=("$pkg")
done
command -v javac >/dev/null 2>&1 || need+=(default-jdk-headless)
# The race detector needs cgo: a C compiler and the C library's headers.
command -v gcc >/dev/null 2>&1 || need+=(gcc)
dpkg-query -W -f='${Status}' libc6-dev 2>/dev/null | grep -q 'install ok installed' || need+=(libc6-dev)
if [ ${#need[@]} -eq 0 ]; then
  echo "zookeeper, libcurator-recipes-java, python3-kazoo, postgresql, redis-server, prometheus (promtool), javac and gcc are installed"
else
  if ! command -v apt-get >/dev/null 2>&1; then
    echo "test.sh: the tests need the Debian packages ${need[*]}, and this machine has no apt-get" >&2
    exit 1
  fi
  if [ "$(id -u)" -ne 0 ]; then
    echo "test.sh: the tests need the Debian packages ${need[*]}; run as root, or first:" >&2
    echo "  sudo apt-get update && sudo apt-get install -y --no-install-recommends ${need[*]}" >&2
    exit 1
  fi
  echo "installing: ${need[*]}"
  apt-get update
  DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${need[@]}"
fi

step "modules"
go mod download
# etcdctl, for the benchmarks against `etcdctl lock` (its own tools module).
(cd test/testdata/etcdctl && go mod download)

step "gofmt"
unformatted=$(gofmt -l $(git ls-files '*.go' 2>/dev/null || find . -name '*.go' -not -path './.git/*'))
if [ -n "$unformatted" ]; then
  printf 'gofmt would change:\n%s\n' "$unformatted" >&2
  exit 1
fi

step "go vet"
go vet ./...

step "tests (race detector on the core; goleak in every package's TestMain)"
go test -race -count=1 -timeout 15m ./election/... ./etcdelect/... ./zkelect/... ./redislock/... ./fence/...
go test -count=1 -timeout 15m ./cmd/... ./internal/... ./test/... ./examples/...

step "benchmarks, a few iterations each so they cannot rot (make bench measures)"
go test -count=1 -run '^$' -bench . -benchtime 5x -timeout 10m ./test/ -args -zkbench.warmup=0
