#!/usr/bin/env bash
# tenure's whole test suite, on a fresh machine: fetches what the tests need,
# checks formatting and vet, runs the core with the race detector, then the
# rest. The etcd the tests use is embedded (started and stopped by the tests
# themselves on free loopback ports), so no server has to be installed.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v go >/dev/null 2>&1; then
  echo "test.sh: Go is required (https://go.dev/doc/install)" >&2
  exit 1
fi

step() { printf '\n== %s\n' "$*"; }

step "modules"
go mod download

step "gofmt"
unformatted=$(gofmt -l $(git ls-files '*.go' 2>/dev/null || find . -name '*.go' -not -path './.git/*'))
if [ -n "$unformatted" ]; then
  printf 'gofmt would change:\n%s\n' "$unformatted" >&2
  exit 1
fi

step "go vet"
go vet ./...

step "tests (race detector on the core; goleak in every package's TestMain)"
go test -race -count=1 -timeout 15m ./election/... ./etcdelect/...
go test -count=1 -timeout 15m ./cmd/... ./internal/... ./test/...

step "benchmarks, a few iterations each so they cannot rot (make bench measures)"
go test -count=1 -run '^$' -bench . -benchtime 5x -timeout 10m ./test/
