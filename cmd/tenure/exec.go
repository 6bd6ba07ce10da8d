package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"go.uber.org/zap"

	"github.com/tenure-go/tenure"
	"github.com/tenure-go/tenure/election"
	"github.com/tenure-go/tenure/internal/alarmpipe"
	"github.com/tenure-go/tenure/zkelect"
)

type execFlags struct {
	common
	ttl         time.Duration
	identity    string
	noWait      bool
	grace       time.Duration
	graceSet    bool // by the flag or TENURE_GRACE, not the default
	metricsAddr string
	metricsFile string
}

func cmdExec(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("exec", flag.ContinueOnError)
	var f execFlags
	f.register(fs)
	fs.DurationVar(&f.ttl, "ttl", 10*time.Second, "session TTL: how long a crashed holder keeps KEY (whole seconds on etcd; the session timeout on zk)")
	fs.StringVar(&f.identity, "identity", "", "identity shown to observers (default hostname-pid)")
	fs.BoolVar(&f.noWait, "no-wait", false, "if KEY is held, exit 0 at once without running CMD (cron on N replicas)")
	fs.DurationVar(&f.grace, "grace", time.Second, "time CMD gets between SIGTERM and SIGKILL when leadership is lost (on zk at most 3/8 of --ttl less max(TTL/10, 100ms); the default shrinks to fit)")
	fs.StringVar(&f.metricsAddr, "metrics-addr", "", "serve /metrics, /healthz, /leader (200 on the holder, 503 elsewhere) and /status on HOST:PORT")
	fs.StringVar(&f.metricsFile, "metrics-file", "", "on exit, write this run's metrics to FILE in Prometheus text format (atomically; for node_exporter's textfile collector: cron jobs exit before any scrape)")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), `Usage: tenure exec --key KEY [flags] -- CMD [ARG...]

Waits for KEY (first come, first served), runs CMD while holding it, and
releases KEY the moment CMD exits; exits with CMD's status. CMD runs in a
session (and process group) of its own with TENURE_TERM (the fencing
token: pass it to whatever CMD writes to), TENURE_KEY, TENURE_IDENTITY,
TENURE_BACKEND and TENURE_ENDPOINTS set (a bare tenure leader inside CMD
reports KEY).

On SIGTERM, SIGINT or SIGHUP (unless started ignoring it, as under nohup),
tenure sends SIGTERM to CMD's process group (and to any process of CMD's
outside it whose parent has exited; one whose parent lives is left to
it, as GNU timeout passes the signal on), waits for CMD and releases KEY
at once; a second such signal sends SIGKILL to every process of CMD's,
in its group or not, and one during a release that hangs stops waiting
for it. What CMD leaves running when it exits is stopped (SIGTERM,
SIGKILL --grace later, or at once on a signal) before KEY is released.
CMD's processes are what descends from it, and what they leave behind
(which the kernel gives to tenure), in CMD's session or in one they made
(setsid). Ctrl-Z is ignored while CMD runs; CMD has no
controlling terminal, so give a CMD that reads input a file or a pipe.

If leadership is lost while CMD runs (the lease could not be renewed), CMD
gets SIGTERM and, --grace later, SIGKILL, both before the server can
expire the lease and elect another holder; what CMD leaves running gets
its SIGKILL by the same deadline, even if CMD exits before it. A tenure
that cannot run then (stopped by SIGSTOP or a debugger, starved) leaves
it to its guard process, which SIGKILLs them shortly after that
deadline, still before the server can expire the lease; a tenure paused
together with its guard (a frozen VM) SIGKILLs them the moment it runs
again. tenure then exits 4. If tenure itself is killed, the kernel
kills CMD, and a guard process (tenure __guard) kills what is left of
CMD's session and every process whose environment holds this run's
TENURE_TERM, TENURE_KEY, TENURE_IDENTITY, TENURE_BACKEND and
TENURE_ENDPOINTS: only a process that left the session (setsid) and
dropped those variables escapes.

Examples:
  tenure exec --key backup --endpoints 10.0.0.1:2379 -- ./backup.sh
  tenure exec --key report --no-wait --ttl 30s -- ./report --date today
  tenure exec --backend zk --endpoints zk1:2181,zk2:2181 --key /locks/backup -- ./backup.sh
  tenure exec --backend redis --endpoints redis:6379 --key report --no-wait --ttl 2m \
      --metrics-file /var/lib/node_exporter/report.prom -- ./report   (efficiency only)

Flags:
`)
		fs.PrintDefaults()
	}
	rest, err := parse(fs, args, stdout)
	fs.Visit(func(fl *flag.Flag) { f.graceSet = f.graceSet || fl.Name == "grace" })
	if _, ok := os.LookupEnv("TENURE_GRACE"); ok {
		f.graceSet = true
	}
	if errors.Is(err, flag.ErrHelp) {
		return exitOK
	}
	if err == nil && len(rest) == 0 {
		err = errors.New("no command given: tenure exec --key KEY -- CMD [ARG...]")
	}
	var cfg election.Config
	if err == nil {
		cfg, err = f.config()
	}
	if err != nil {
		fmt.Fprintf(stderr, "tenure exec: %s\n", oneLine(envHint(fs, err)))
		return exitUsage
	}
	// A command that cannot be found is reported now, not once KEY has
	// been waited for (or, with --no-wait, never, while others hold it).
	if _, err := exec.LookPath(rest[0]); err != nil {
		fmt.Fprintf(stderr, "tenure exec: cannot run %s: %s; not campaigning for %s\n", rest[0], oneLine(err), f.key)
		if f.metricsFile != "" {
			// An alert on the file must see the failure, not the last
			// run's figures.
			reg := prometheus.NewRegistry()
			reg.MustRegister(exitCodeGauge(f.key, exitCannotRun))
			if err := prometheus.WriteToTextfile(f.metricsFile, reg); err != nil {
				fmt.Fprintf(stderr, "tenure exec: --metrics-file: %s\n", oneLine(err))
			}
		}
		return exitCannotRun
	}
	return execRun(f, cfg, rest, f.logger(stderr), stdout, stderr)
}

// config derives the elector's configuration. The lease deadline must leave
// room for CMD to be stopped: SIGTERM at the deadline, SIGKILL grace later,
// and both before the server can expire the lease. So the deadline margin
// is grace plus a safety of TTL/10 (at least 100 ms).
func (f *execFlags) config() (election.Config, error) {
	if err := f.validate(); err != nil {
		return election.Config{}, err
	}
	if err := f.checkTTL(f.ttl); err != nil {
		return election.Config{}, err
	}
	if f.grace < 0 {
		return election.Config{}, fmt.Errorf("--grace %v must not be negative", f.grace)
	}
	if err := checkListenAddr(f.metricsAddr); err != nil {
		return election.Config{}, fmt.Errorf("--metrics-addr %q: %w", f.metricsAddr, err)
	}
	safety := max(f.ttl/10, 100*time.Millisecond)
	if f.backend == "zookeeper" && !f.graceSet {
		// The default shrinks to what a ZooKeeper session of this TTL
		// allows (zkelect.MaxDeadlineMargin); a --grace given is checked.
		f.grace = max(0, min(f.grace, zkelect.MaxDeadlineMargin(f.ttl)-safety))
	}
	margin := f.grace + safety
	if f.backend == "zookeeper" && zkelect.CheckDeadlineMargin(f.ttl, margin) != nil {
		return election.Config{}, fmt.Errorf("--grace %v is too long for --ttl %v on ZooKeeper: --grace plus max(TTL/10, 100ms) must be at most 3/8 of the TTL (%v); raise --ttl or lower --grace", f.grace, f.ttl, zkelect.MaxDeadlineMargin(f.ttl))
	}
	renew := min(f.ttl/3, (f.ttl-margin)/2)
	if renew <= 0 {
		return election.Config{}, fmt.Errorf("--grace %v leaves no room in --ttl %v: CMD must be stopped before the lease can expire; raise --ttl or lower --grace", f.grace, f.ttl)
	}
	cfg := election.Config{
		Key: f.key, Identity: f.identity, TTL: f.ttl,
		RenewInterval: renew, DeadlineMargin: margin,
		StopTimeout: max(f.grace, time.Millisecond),
	}.WithDefaults()
	if cfg.StopTimeout >= cfg.DeadlineMargin {
		cfg.StopTimeout = cfg.DeadlineMargin / 2
	}
	return cfg, cfg.Validate()
}

// stopSignals end a tenure exec: while waiting, the campaign; while CMD
// runs, CMD (SIGTERM to its group; a second one, SIGKILL). SIGHUP is one
// of them: a closed terminal or ssh session must release KEY, not leave
// it to expire with a killed CMD. But a SIGHUP or SIGINT that tenure's
// parent set to be ignored stays ignored (Go's Notify would undo it):
// `nohup tenure exec ...` must survive its terminal, and a shell's
// background job ignores Ctrl-C.
var stopSignals = func() []os.Signal {
	sigs := []os.Signal{syscall.SIGTERM}
	for _, s := range []os.Signal{syscall.SIGINT, syscall.SIGHUP} {
		if !signal.Ignored(s) {
			sigs = append(sigs, s)
		}
	}
	return sigs
}()

func execRun(f execFlags, cfg election.Config, argv []string, log *zap.Logger, stdout, stderr io.Writer) int {
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, stopSignals...)
	defer signal.Stop(sigs)
	// tenure writes only to stderr, and a write there must not kill it:
	// with stderr piped into a reader that is gone (`tenure exec ... 2>&1
	// | tee log`, tee killed by the same Ctrl-C), Go's runtime would end
	// the process by SIGPIPE at the next log line, before it stops CMD
	// and releases KEY (waiters would sit out the TTL). Caught, the write
	// fails and is dropped. (Caught, not ignored: CMD, after exec, gets
	// SIGPIPE's default again; an ignored one would stay ignored in it.)
	// Not stopped on return: a write by what still runs after (a release
	// left in the background, a log line) must not kill tenure either.
	signal.Notify(make(chan os.Signal, 1), syscall.SIGPIPE)
	// A signal while waiting for KEY cancels the campaign; another one
	// (again) stops waiting for its clean-up.
	ctx, caught, again, unwatch := cancelOnSignal(sigs)
	defer unwatch()

	b, closeBackend, err := f.open(ctx, cfg.TTL)
	if err != nil {
		if s := caught(); s != nil {
			fmt.Fprintf(stderr, "tenure exec: %v while connecting; not running %s\n", s, argv[0])
			return 128 + int(s.(syscall.Signal))
		}
		fmt.Fprintf(stderr, "tenure exec: %s\n", oneLine(err))
		return exitUsage
	}
	stop := newShutdown(cfg.CleanupTimeout)
	// Once execRun returns, a stop signal ends the wait for the clean-up
	// below (what runs goes on until tenure exits: KEY, if still held,
	// expires with the session). Registered first, it stops last.
	shutdownWatch := make(chan struct{})
	defer close(shutdownWatch)
	defer stop.do(func(context.Context) error { closeBackend(); return nil })
	opts := []election.Option{election.WithLogger(log)}
	// reg holds tenure's own series; the endpoint adds the Go runtime's
	// and the process's, the metrics file does not (node_exporter's
	// textfile collector would clash with its own go_* and process_*).
	var reg *prometheus.Registry
	var served prometheus.Gatherers
	if f.metricsAddr != "" || f.metricsFile != "" {
		reg = prometheus.NewRegistry()
		proc := prometheus.NewRegistry()
		proc.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
		served = prometheus.Gatherers{reg, proc}
		m, err := election.NewMetrics(reg)
		if err != nil {
			fmt.Fprintf(stderr, "tenure exec: %s\n", oneLine(err))
			return exitFailure
		}
		opts = append(opts, election.WithMetrics(m))
	}
	e, err := election.New(b, cfg, opts...)
	if err != nil {
		fmt.Fprintf(stderr, "tenure exec: %s\n", oneLine(err))
		return exitUsage
	}
	if f.metricsFile != "" {
		// Registered before the Close below, so it runs after it: the
		// file holds the run's final counts.
		defer func() {
			if err := prometheus.WriteToTextfile(f.metricsFile, reg); err != nil {
				fmt.Fprintf(stderr, "tenure exec: --metrics-file: %s\n", oneLine(err))
			}
		}()
	}
	defer stop.do(func(ctx context.Context) error { return e.Close(ctx) })
	defer func() {
		unwatch() // the campaign's watch no longer takes signals
		go func() {
			var s os.Signal
			select {
			case s = <-again: // taken by the campaign's watch, not acted on
			case s = <-sigs:
			case <-shutdownWatch:
				return
			}
			fmt.Fprintf(stderr, "tenure exec: %v while closing: not waiting for the clean-up (if %s is still held, it expires with the session)\n", s, f.key)
			stop.abort()
		}()
	}()
	if f.metricsAddr != "" {
		stopServing, err := serveHTTP(f.metricsAddr, e.Handler(served))
		if err != nil {
			fmt.Fprintf(stderr, "tenure exec: --metrics-addr: %s\n", oneLine(err))
			return exitUsage
		}
		// Registered after the Close above, so it runs before it: a
		// scrape after the Close would take the closed Elector's series
		// (they are collected once more, then dropped), and the file
		// would lack them.
		defer stopServing()
	}

	var term tenure.Term
	type campaigned struct {
		term tenure.Term
		err  error
	}
	res := make(chan campaigned, 1)
	go func() {
		var c campaigned
		if f.noWait {
			c.term, c.err = e.TryCampaign(ctx)
		} else {
			c.term, c.err = e.Campaign(ctx)
		}
		res <- c
	}()
	select {
	case c := <-res:
		term, err = c.term, c.err
	case s := <-again:
		select {
		case c := <-res:
			// The campaign has returned too (elected as the first signal
			// came, say): handled below, which resigns a term won.
			term, err = c.term, c.err
		default:
			// The campaign, cancelled by the first signal, is removing
			// its entry (which takes up to CleanupTimeout when the backend
			// does not answer): the user will not wait. Not leading,
			// tenure may go; the entry, if still there, expires with the
			// session.
			stop.abort()
			first := caught()
			fmt.Fprintf(stderr, "tenure exec: %v again while waiting for %s: not waiting for the campaign's clean-up; not running %s\n", s, f.key, argv[0])
			return 128 + int(first.(syscall.Signal))
		}
	}
	switch {
	case errors.Is(err, tenure.ErrLocked):
		who := "another candidate"
		lctx, cancel := context.WithTimeout(context.Background(), f.dialTimeout)
		l, lerr := e.Leader(lctx)
		cancel()
		if lerr == nil && !l.Vacant {
			who = fmt.Sprintf("%s (term %d)", shown(l.Term.Identity), l.Term.Token)
		}
		fmt.Fprintf(stderr, "tenure exec: %s is held by %s; not running %s (--no-wait)\n", f.key, who, argv[0])
		return exitOK
	case errors.Is(err, tenure.ErrInvalidConfig):
		fmt.Fprintf(stderr, "tenure exec: %s\n", oneLine(err))
		return exitUsage
	case err != nil && caught() != nil:
		s := caught()
		fmt.Fprintf(stderr, "tenure exec: %v while waiting for %s; not running %s\n", s, f.key, argv[0])
		return 128 + int(s.(syscall.Signal))
	case err != nil:
		fmt.Fprintf(stderr, "tenure exec: campaign for %s failed: %s\n", f.key, oneLine(err))
		return exitFailure
	}
	// Signals now go to CMD; one that came just as we were elected stops
	// us here.
	unwatch()
	if s := caught(); s != nil {
		_ = stop.do(e.Resign)
		fmt.Fprintf(stderr, "tenure exec: %v while taking %s; not running %s\n", s, f.key, argv[0])
		return 128 + int(s.(syscall.Signal))
	}
	code := supervise(e, f, term, argv, sigs, stop, stdout, stderr)
	if reg != nil {
		// Whether the work was done, which tenure_transitions_total
		// ("elected") does not say: a cron job's alert needs it. Made
		// here, so that it is absent when CMD was not run.
		_ = reg.Register(exitCodeGauge(f.key, code)) // the only one of its name
	}
	return code
}

// exitCodeGauge is tenure_exec_exit_code for key, set to code.
func exitCodeGauge(key string, code int) prometheus.Gauge {
	g := prometheus.NewGauge(prometheus.GaugeOpts{
		Name:        "tenure_exec_exit_code",
		Help:        "The status tenure exec exited with once it held the key: the command's own, 128+N when a signal N ended it, 4 when leadership was lost (while it ran, or just before it would have started), 127 when it could not start; also 127 when the command could not be found (then before any campaign). Absent when tenure exec did not hold the key (--no-wait found it held, the campaign failed or was interrupted).",
		ConstLabels: prometheus.Labels{"key": key},
	})
	g.Set(float64(code))
	return g
}

// cancelOnSignal returns a ctx that the first signal on sigs cancels, and
// caught, which returns that signal (nil before one came); again receives
// the second signal. unwatch stops the watch (cancelling ctx) and waits
// until it has stopped, so that later signals on sigs are the caller's; it
// may be called again.
func cancelOnSignal(sigs <-chan os.Signal) (ctx context.Context, caught func() os.Signal, again <-chan os.Signal, unwatch func()) {
	ctx, cancel := context.WithCancel(context.Background())
	var got atomic.Value // os.Signal
	second := make(chan os.Signal, 1)
	stopped, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		select {
		case s := <-sigs:
			got.Store(s)
			cancel()
		case <-stopped:
			return
		}
		select {
		case s := <-sigs:
			second <- s
		case <-stopped:
		}
	}()
	caught = func() os.Signal {
		s, _ := got.Load().(os.Signal)
		return s
	}
	var once sync.Once
	return ctx, caught, second, func() {
		once.Do(func() { close(stopped) })
		cancel()
		<-done
	}
}

// shutdown bounds tenure exec's way out. The release when CMD exits, the
// elector's Close and the backend's share one deadline, CleanupTimeout
// after the first of them began: a backend that stops answering (a frozen
// server, a blackholed link) does not hold tenure past it. KEY then
// expires with the session, as when tenure is killed.
type shutdown struct {
	timeout time.Duration
	once    sync.Once
	by      time.Time
	quit    chan struct{} // closed by abort
	abort1  sync.Once
}

func newShutdown(timeout time.Duration) *shutdown {
	return &shutdown{timeout: timeout, quit: make(chan struct{})}
}

// abort ends the shared deadline now: the user will not wait (a signal
// during the release). What runs goes on in the background until tenure
// exits; KEY expires with the session.
func (s *shutdown) abort() { s.abort1.Do(func() { close(s.quit) }) }

// do runs f with a ctx that ends at the shared deadline, and returns f's
// error, or the ctx's when the deadline came first (f then goes on in the
// background, until tenure exits).
func (s *shutdown) do(f func(context.Context) error) error {
	s.once.Do(func() { s.by = time.Now().Add(s.timeout) })
	ctx, cancel := context.WithDeadline(context.Background(), s.by)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- f(ctx) }()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	case <-s.quit:
		return errAborted
	}
}

// errDeadlinePassed is why a term ended when tenure finds its lease
// deadline passed before the lease itself has said so.
var errDeadlinePassed = errors.New("the lease deadline passed while tenure could not run")

// errAborted is shutdown.do's error after abort.
var errAborted = errors.New("not waited for: tenure was signalled to stop")

// supervise runs CMD while e leads and returns tenure's exit status.
func supervise(e *election.Elector, f execFlags, term tenure.Term, argv []string, sigs <-chan os.Signal, stop *shutdown, stdout, stderr io.Writer) int {
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, stdout, stderr
	// What CMD learns of its term. Together these entries also mark this
	// run's processes, for the guard (see startGuard).
	run := []string{
		"TENURE_TERM=" + strconv.FormatUint(term.Token, 10),
		"TENURE_KEY=" + term.Key,
		"TENURE_IDENTITY=" + term.Identity,
		"TENURE_BACKEND=" + term.Backend,
		// So that a tenure leader inside CMD reports this lock, also when
		// --endpoints was a flag. (TLS and auth settings are not passed.)
		"TENURE_ENDPOINTS=" + f.endpoints.list,
	}
	cmd.Env = append(childEnv(), run...) // without the credentials and TLS settings
	// Own session, and so own process group, so that a signal reaches
	// CMD's children too, and the guard finds CMD's processes by their
	// session once tenure is gone (see tree.go). If tenure itself is
	// killed, the kernel kills CMD (the parent-death signal) and the guard
	// kills the rest (see startGuard, below).
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Pdeathsig: syscall.SIGKILL}
	// tenure's lines from here on go through say, which never blocks: a
	// stderr whose reader stalled must not hold up a signal to CMD or a
	// SIGKILL at its deadline.
	say := newNotes(stderr)
	defer say.close(time.Second)
	signalled := false // a stop signal came while CMD or what it left ran
	// release waits for the release of KEY, bounded by stop. A signal
	// meanwhile that is the second (one came before, or during it) ends
	// the wait: the user will not wait, and KEY expires with the session.
	release := func() {
		done := make(chan error, 1)
		go func() { done <- stop.do(e.Resign) }()
		for {
			select {
			case err := <-done:
				if err != nil {
					say.printf("tenure exec: releasing %s failed (it expires with the session): %s\n", f.key, oneLine(err))
				}
				return
			case s := <-sigs:
				if !signalled {
					signalled = true
					say.printf("tenure exec: %v while releasing %s: another signal stops waiting for it\n", s, f.key)
					continue
				}
				stop.abort()
				say.printf("tenure exec: %v while releasing %s: not waiting for it (if not released, it expires with the session)\n", s, f.key)
				return
			}
		}
	}
	// A suspended tenure cannot renew its lease while CMD, in its own
	// session, runs on: Ctrl-Z is caught, and dropped, from before CMD
	// starts, and so is SIGTTIN. (Caught, not ignored: an ignored signal
	// would be ignored in CMD too, since exec keeps SIG_IGN.) SIGTTOU,
	// which stops a background job that writes to its terminal (with
	// `stty tostop`: a log line on stderr), is ignored: then the write
	// goes through (caught, the kernel would restart the write and send
	// it again, for good). CMD inherits that, but in a session of its
	// own it has no controlling terminal that could send it SIGTTOU.
	tstp := make(chan os.Signal, 1)
	signal.Notify(tstp, syscall.SIGTSTP, syscall.SIGTTIN)
	defer signal.Stop(tstp)
	signal.Ignore(syscall.SIGTTOU)
	// What CMD starts and leaves behind becomes tenure's child when CMD
	// exits: it stays in the tree tenure signals (see tree.go), and
	// stopGroup can reap it at once (init may take its time).
	_, _, _ = syscall.RawSyscall6(syscall.SYS_PRCTL, prSetChildSubreaper, 1, 0, 0, 0, 0)
	// Orphans of CMD's processes that have exited are reaped as they go
	// (see reapOrphans), until supervise returns; SIGCHLD is caught from
	// before CMD starts, so that none is missed.
	chld := make(chan os.Signal, 1)
	signal.Notify(chld, syscall.SIGCHLD)
	defer signal.Stop(chld)
	// Before CMD: tenure's children then are not CMD's. Before the last
	// look at the term too: it reads all of /proc, which takes a while on
	// a busy host, and nothing may come between that look and the start.
	// The guard starts before CMD (see startGuard), and before the tree's
	// look at /proc: it is one of tenure's children from before CMD.
	g, err := startGuard(run)
	if err != nil {
		say.printf("tenure exec: warning: no guard for %s's children if tenure is killed: %s\n", argv[0], oneLine(err))
		g = nil
	}
	cmdStarted := false
	defer func() {
		if g != nil && !cmdStarted {
			g.done() // CMD never ran: nothing to guard
		}
	}()
	tree := newCmdTree()
	if g != nil {
		if p, ok := readProcStat(g.proc.Process.Pid); ok {
			tree.guard = p
		}
	}
	if beforeStart != nil {
		beforeStart()
	}
	// The term may have ended since Campaign returned (the lease's
	// deadline passed while tenure was descheduled, say): CMD must not
	// start then, not even for the moment before the loss is acted on.
	// IsLeader reads the deadline itself, before the lease's timer has
	// fired and closed Done.
	if !e.IsLeader() {
		why := "the lease deadline passed"
		if err := e.Err(); err != nil {
			why = oneLine(err)
		}
		say.printf("tenure exec: lost leadership of %s before %s started: %s; not running it\n", term, argv[0], why)
		return exitLostLead
	}
	// A stop signal since the campaign returned (during the look at /proc,
	// say) waits here: CMD is not started, as for one before the election.
	// One from now on is CMD's.
	select {
	case s := <-sigs:
		signalled = true
		release()
		say.printf("tenure exec: %v while taking %s; not running %s\n", s, f.key, argv[0])
		return 128 + int(s.(syscall.Signal))
	default:
	}
	if err := cmd.Start(); err != nil {
		release()
		say.printf("tenure exec: cannot run %s: %s\n", argv[0], oneLine(err))
		return exitCannotRun
	}
	// The guard learns CMD's session first: until then, a tenure killed
	// would leave what CMD starts running.
	cmdStarted = true
	guardDone := func() {}
	if beforeGuardWatch != nil {
		beforeGuardWatch()
	}
	if g != nil {
		if err := g.watch(cmd.Process.Pid); err != nil {
			say.printf("tenure exec: warning: no guard for %s's children if tenure is killed: %s\n", argv[0], oneLine(err))
		}
		guardDone = g.done
	}
	stopBackstop := func() {}
	if g != nil {
		stopBackstop = guardBackstop(e, g, f.grace)
		defer stopBackstop()
	}
	tree.cmd = procStat{pid: cmd.Process.Pid}
	if p, ok := readProcStat(cmd.Process.Pid); ok { // not reaped before cmd.Wait
		tree.cmd = p
	}
	if afterCmdStart != nil {
		afterCmdStart()
	}
	stopReaping, reaperDone := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(reaperDone)
		reapOrphans(cmd.Process.Pid) // what exited before the first SIGCHLD was read
		for {
			select {
			case <-chld:
				reapOrphans(cmd.Process.Pid)
			case <-stopReaping:
				return
			}
		}
	}()
	defer func() {
		close(stopReaping)
		<-reaperDone
	}()
	signalAll := tree.signal

	// Leadership lost: SIGTERM, and SIGKILL at killAt, both before the
	// server can expire the lease; or SIGKILL at once when the lease or
	// the key is already gone.
	var killAt time.Time
	var killTimer *time.Timer
	lostLead := false
	onLost := func() {
		lostLead = true
		reason := e.Err()
		if reason == nil { // the deadline passed; the lease's timer has not run yet
			reason = errDeadlinePassed
		}
		now := time.Now()
		killAt = now
		if errors.Is(reason, tenure.ErrLeaseExpired) && f.grace > 0 {
			// The server cannot expire the lease before the deadline
			// plus the margin, which holds --grace: SIGKILL --grace
			// after the deadline. That is --grace from now, unless
			// tenure was paused past the deadline (then it learns of it
			// late, and CMD's time is gone, or partly gone).
			killAt = now.Add(f.grace)
			var lee *election.LeaseExpiredError
			if errors.As(reason, &lee) && !lee.Deadline.IsZero() && lee.Deadline.Add(f.grace).Before(killAt) {
				killAt = lee.Deadline.Add(f.grace)
			}
		}
		if killAt.After(now) {
			// SIGTERM now, SIGKILL at killAt. The SIGKILL is armed before
			// anything is written.
			signalAll(syscall.SIGTERM)
			killTimer = time.AfterFunc(killAt.Sub(now), func() { signalAll(syscall.SIGKILL) })
		} else {
			// The lease or the key is already gone, or about to be:
			// another holder may be running. Stop at once.
			signalAll(syscall.SIGKILL)
			killAt = now
		}
		say.printf("tenure exec: lost leadership of %s: %s; stopping %s\n", term, oneLine(reason), argv[0])
	}
	lost := e.Done()
	// CMD is done; so must be what it left running, nothing of which may
	// outlive KEY: SIGTERM, and SIGKILL --grace later, or at killAt if
	// that comes first, including when leadership is lost meanwhile, or
	// at once on a signal. Then the guard may go, and only then is KEY
	// released.
	ended := func() {
		by := time.Now().Add(f.grace)
		stopGroup(tree, func() time.Time {
			if lost != nil {
				select {
				case <-lost:
					lost = nil
					onLost()
				default:
				}
			}
			select {
			case s := <-sigs:
				by = time.Now()
				signalled = true
				say.printf("tenure exec: %v: sending SIGKILL to what %s left running\n", s, argv[0])
			default:
			}
			if lostLead && killAt.Before(by) {
				return killAt
			}
			return by
		})
		if killTimer != nil {
			killTimer.Stop() // the processes are gone: their ids may be reused
		}
		stopBackstop()
		guardDone()
	}
	waited := make(chan error, 1)
	go func() { waited <- cmd.Wait() }()
	// byGuard reports whether CMD's exit, err, is a SIGKILL after its term
	// ended: tenure could not run at its deadline (stopped, starved), and
	// its guard stopped CMD (see guardBackstop). Leadership was lost, and
	// tenure says so, not that CMD failed.
	byGuard := func(err error) bool {
		return exitStatus(err) == 128+int(syscall.SIGKILL) && !e.IsLeader()
	}
	exited := func(err error) int {
		ended()
		if lostLead {
			say.printf("tenure exec: %s stopped after leadership of %s was lost\n", argv[0], term)
			return exitLostLead
		}
		release()
		return exitStatus(err)
	}

	for {
		if beforeSelect != nil {
			beforeSelect()
		}
		select {
		case err := <-waited:
			if lost != nil && byGuard(err) {
				lost = nil
				onLost()
			}
			return exited(err)
		case s := <-sigs:
			if signalled { // a second signal: the user will not wait
				signalAll(syscall.SIGKILL)
				say.printf("tenure exec: %v again: sent SIGKILL to %s\n", s, argv[0])
				continue
			}
			signalled = true
			signalAll(syscall.SIGTERM)
			say.printf("tenure exec: %v: sent SIGTERM to %s (another signal sends SIGKILL)\n", s, argv[0])
		case <-lost:
			select {
			case err := <-waited:
				if byGuard(err) {
					lost = nil
					onLost()
					return exited(err)
				}
				// CMD had exited by itself when the loss was read: its
				// status, as when its exit is read first (select would
				// pick either at random). What it left, if anything, is
				// stopped as for the loss (ended sees it).
				say.printf("tenure exec: leadership of %s ended as %s exited: %s\n", term, argv[0], oneLine(e.Err()))
				return exited(err)
			default:
			}
			lost = nil
			onLost()
		}
	}
}

// guardBackstop keeps g's kill instant at the lease deadline plus grace
// plus half the rest of the deadline margin (the safety, see config):
// after tenure's own SIGKILL, before the server can expire the lease. A
// tenure that runs kills first; one that cannot run (stopped, starved)
// leaves it to the guard. It reads e's deadline every quarter of that
// safety (at least 10 ms) and tells the guard when it moved: a renewal
// reaches the guard within half the safety, before the instant it
// replaces. The returned func stops it and waits for it; safe to call
// more than once.
func guardBackstop(e *election.Elector, g *guard, grace time.Duration) (stop func()) {
	slack := (e.Config().DeadlineMargin - grace) / 2
	var sent time.Time
	return alarmpipe.Every(max(slack/2, 10*time.Millisecond), func() bool {
		if d := e.Deadline(); !d.IsZero() && !d.Equal(sent) {
			if g.killBy(d.Add(grace+slack)) != nil {
				return false // the guard is gone
			}
			sent = d
		}
		return true
	})
}

// notes writes tenure's lines to stderr in order, from a goroutine of its
// own, so that printf never blocks: a line that does not fit in its
// buffer (the reader stalled for good) is dropped.
type notes struct {
	lines chan string
	done  chan struct{}
}

func newNotes(w io.Writer) *notes {
	n := &notes{lines: make(chan string, 64), done: make(chan struct{})}
	go func() {
		defer close(n.done)
		for l := range n.lines {
			_, _ = io.WriteString(w, l)
		}
	}()
	return n
}

func (n *notes) printf(format string, a ...any) {
	select {
	case n.lines <- fmt.Sprintf(format, a...):
	default:
	}
}

// close waits, at most d, for the lines to be written.
func (n *notes) close(d time.Duration) {
	close(n.lines)
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-n.done:
	case <-t.C:
	}
}

// beforeStart, when not nil, runs just before supervise checks the term
// one last time and starts CMD. Tests set it to hold an elected tenure in
// that window; nil in tenure itself.
var beforeStart func()

// beforeGuardWatch, when not nil, runs as soon as supervise has started
// CMD, before it tells the guard CMD's session: a test hook.
var beforeGuardWatch func()

// afterCmdStart, when not nil, runs as soon as supervise has started CMD
// and told the guard of it (tests: tenure killed right after CMD's start).
var afterCmdStart func()

// beforeSelect, when not nil, runs before each wait of supervise's loop
// for CMD's exit, a signal or the loss of the term. Tests set it to let
// more than one of them happen first; nil in tenure itself.
var beforeSelect func()

// prSetChildSubreaper is prctl's PR_SET_CHILD_SUBREAPER.
const prSetChildSubreaper = 36

// stopGroup ends what is left of CMD's processes once CMD (the leader of
// its process group) has exited and been reaped: the group, and CMD's
// other processes (see cmdTree). SIGTERM, and SIGKILL at killBy() if
// anything remains (SIGKILL at once when that has passed already). killBy
// is asked again every 10 ms while it waits: it may come nearer. Nothing
// left costs one kill(2) probe, a walk from tenure's children and one read
// of all of /proc; while something is left, the walk finds it first. The
// group's dead are reaped as they go (they are tenure's children, see the
// subreaper in supervise): a zombie would count as alive.
func stopGroup(t *cmdTree, killBy func() time.Time) {
	pgid := t.cmd.pid
	gone := func() bool {
		for {
			var ws syscall.WaitStatus
			if pid, err := syscall.Wait4(-pgid, &ws, syscall.WNOHANG, nil); pid <= 0 || err != nil {
				break
			}
		}
		return t.gone()
	}
	if gone() {
		return
	}
	// kill sends SIGKILL and waits, reaping, until all is gone: a process
	// dies of it at once, unless the kernel holds it in an uninterruptible
	// wait; that is bounded by killWait, past which nothing tenure can do
	// helps. It signals again each round: a process forked just before
	// the first SIGKILL missed it.
	kill := func() {
		for deadline := time.Now().Add(killWait); ; {
			t.signal(syscall.SIGKILL)
			if gone() || !time.Now().Before(deadline) {
				return
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	if !time.Now().Before(killBy()) {
		kill()
		return
	}
	t.signal(syscall.SIGTERM)
	for !gone() {
		if !time.Now().Before(killBy()) {
			kill()
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// killWait bounds stopGroup's wait for a SIGKILLed group to be gone.
const killWait = time.Second

// exitStatus maps CMD's end to tenure's exit status: its code, or 128+signal.
func exitStatus(err error) int {
	if err == nil {
		return exitOK
	}
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			return 128 + int(ws.Signal())
		}
		return ee.ExitCode()
	}
	return exitFailure
}

// checkListenAddr refuses an address net.Listen would refuse for its
// form (not HOST:PORT, a port that is not a number from 0 to 65535) before
// anything connects. "" (no endpoint) passes.
func checkListenAddr(addr string) error {
	if addr == "" {
		return nil
	}
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("want HOST:PORT (HOST may be empty): %w", err)
	}
	if _, err := strconv.ParseUint(port, 10, 16); err != nil {
		return fmt.Errorf("port %q is not a number from 0 to 65535", port)
	}
	return nil
}

// serveHTTP serves h on addr until stop is called.
func serveHTTP(addr string, h http.Handler) (stop func(), err error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(ln)
	}()
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
		<-done
	}, nil
}
