# tenure: the two commands of the README, and the benchmark.

.PHONY: test demo bench chaos

# The whole test suite; fetches what it needs.
test:
	./scripts/test.sh

# Three candidates on an embedded etcd: resign, kill and cut-off failovers.
demo:
	go run ./cmd/tenure demo

# Every benchmark against the peers, on the same servers in one run
# (internal/cmd/benchreport runs `go test -bench . ./test/`): handoff latency
# and acquires/s at 2 to 1,000 contenders on etcd, ZooKeeper and Redis,
# crash failover and pause overlap with real processes, cost per candidate
# and per handoff. Writes docs/benchmarks.md, the run's raw output in
# docs/benchmarks.txt (render again with benchreport -in) and the plots in
# docs/img.
# Fails if a benchmark fails (two holders, a stall), never on speed. The
# handoff benchmarks run in four rounds (-bench.repeat) in a balanced
# order; the report gives each figure's median. A round times 300
# handoffs, ZooKeeper's 1,000 below 1,000 contenders (-zkbench.count), and
# every backend's 200 at 1,000 contenders (-bench.big).
BENCH_ARGS ?= -bench.contenders=2,10,100,1000 -bench.big=200 -bench.rounds=5 -bench.ttl=3s -bench.repeat=4 -zkbench.count=1000
bench:
	go run ./internal/cmd/benchreport -benchtime 300x -timeout 120m -out docs/benchmarks.md -img docs/img -- $(BENCH_ARGS)

# The reduced set CI can run (under five minutes on 2 cores): every
# implementation at 2, 10 and 100 contenders, 30 handoffs each, two crash
# failovers each at a 2 s TTL, the pause overlap. Reports into a temporary
# directory (printed), leaves docs/ alone; fails only if a benchmark fails.
.PHONY: bench-quick
bench-quick:
	@dir=$$(mktemp -d) && \
	go run ./internal/cmd/benchreport -benchtime 30x -timeout 15m -out $$dir/benchmarks.md -img $$dir/img \
	  -title "bench-quick: the reduced set (30 handoffs per cell, 2 failovers); make bench measures." \
	  -- -bench.contenders=2,10,100 -zkbench.warmup=30 -bench.rounds=2 -bench.ttl=2s; \
	status=$$?; echo "bench-quick report: $$dir/benchmarks.md"; exit $$status

# The fault-injection safety suite's long mode (test/chaos): every scenario
# on a three-member etcd cluster, a three-server ZooKeeper ensemble and one
# redis-server (Redis skips expire and leaderkill; only ZooKeeper runs
# partition), for CHAOS_DURATION per backend, then the table. The backends run side by side as parallel
# subtests, at most GOMAXPROCS at a time (on 2 cores one waits for another
# to finish). CHAOS_BACKENDS (comma-separated: etcd,zookeeper,redis) narrows
# the backends. The last line is "violations: N"; the exit status is
# non-zero on any violation. CHAOS_LANES (4) elections run in parallel,
# CHAOS_ROUNDS (5) faults each per run.
CHAOS_DURATION ?= 3m
chaos:
	@dir=$$(mktemp -d) && go test -c -o $$dir/chaos.test ./test/chaos/ && \
	(cd test/chaos && CHAOS_DURATION=$(CHAOS_DURATION) $$dir/chaos.test -test.run '^TestChaos$$' -test.timeout 0 -test.v); \
	status=$$?; rm -rf $$dir; exit $$status
