# tenure: the two commands of the README, and the benchmark.

.PHONY: test demo bench

# The whole test suite; fetches what it needs.
test:
	./scripts/test.sh

# Three candidates on an embedded etcd: resign, kill and cut-off failovers.
demo:
	go run ./cmd/tenure demo

# Handoff latency against the peers, same servers, same run: etcd (raw
# concurrency.Election) and ZooKeeper (go-zookeeper's Lock, Curator, kazoo).
bench:
	go test -count=1 -run '^$$' -bench 'BenchmarkHandoff|BenchmarkZKHandoff' -benchtime 300x -timeout 30m ./test/
