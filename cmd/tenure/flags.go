package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"time"
	"unicode"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/tenure-go/tenure"
	"github.com/tenure-go/tenure/election"
	"github.com/tenure-go/tenure/etcdelect"
	"github.com/tenure-go/tenure/redislock"
	"github.com/tenure-go/tenure/zkelect"
)

// common holds the flags every backend-facing subcommand takes.
type common struct {
	backend     string
	endpoints   endpointsFlag
	key         string
	dialTimeout time.Duration
	logLevel    string
	logFormat   string
	sec         security // cmd/tenure/security.go
}

func (c *common) register(fs *flag.FlagSet) {
	fs.StringVar(&c.backend, "backend", "etcd", "backend: etcd, zk (ZooKeeper) or redis (efficiency only: several endpoints are Redlock masters; see docs/redis.md)")
	fs.Var(&c.endpoints, "endpoints", "comma-separated `HOST:PORT` list of the backend's servers (default: the backend's port on this host, 127.0.0.1:2379 for etcd, 127.0.0.1:2181 for zk, 127.0.0.1:6379 for redis)")
	fs.StringVar(&c.key, "key", "", "election key (required; an absolute znode path such as /locks/report on zk)")
	fs.DurationVar(&c.dialTimeout, "dial-timeout", 5*time.Second, "how long to try to reach the backend before giving up")
	fs.StringVar(&c.logLevel, "log-level", "warn", "exec: log level on stderr: debug, info, warn or error (leader logs nothing; it prints its errors)")
	fs.StringVar(&c.logFormat, "log-format", "console", "exec: log format on stderr: console or json (leader logs nothing)")
	c.sec.register(fs)
}

// exported are the variables tenure exec sets for its command that name
// its lock. Inside such a command (TENURE_TERM is set), tenure exec does
// not take them as --key and --identity: it would wait for the lock its
// own parent holds, for good. (tenure leader does: inside the command, it
// reports that lock. TENURE_BACKEND stays a flag: it names the backend of
// the TENURE_ENDPOINTS the command inherits.)
var exported = map[string]bool{"TENURE_KEY": true, "TENURE_IDENTITY": true}

// wanted describes the values a flag takes, for an error about one that
// does not parse: ", want a duration such as 5s", or "" when the error
// says it already.
func wanted(f *flag.Flag) string {
	g, ok := f.Value.(flag.Getter)
	if !ok {
		return ""
	}
	switch g.Get().(type) {
	case time.Duration:
		return ", want a duration such as 5s or 1m30s"
	case bool:
		return ", want true or false"
	case int, int64, uint, uint64:
		return ", want a whole number"
	}
	return ""
}

// parse parses args, taking defaults from TENURE_<FLAG> environment
// variables first (but, for exec inside a tenure exec command, not from
// the ones that name the enclosing lock). It returns the arguments after
// the flags. --help prints the usage to help (stdout: asked for, it is
// the answer).
func parse(fs *flag.FlagSet, args []string, help io.Writer) ([]string, error) {
	// A variable that does not parse is an error only for a flag the
	// command line does not set: the flag wins, and --help still helps.
	envErrs := map[string]error{}
	_, nested := os.LookupEnv("TENURE_TERM")
	nested = nested && fs.Name() == "exec"
	fs.VisitAll(func(f *flag.Flag) {
		name := envName(f)
		if nested && exported[name] {
			return
		}
		if v, ok := os.LookupEnv(name); ok {
			if err := f.Value.Set(v); err != nil {
				envErrs[f.Name] = fmt.Errorf("%s=%q: %w%s (it sets --%s)", name, v, err, wanted(f), f.Name)
				return
			}
			f.DefValue = v
		}
	})
	// Errors are reported by the caller on one line.
	usage := fs.Usage
	fs.Usage = func() {}
	fs.SetOutput(io.Discard)
	err := fs.Parse(args)
	fs.Visit(func(f *flag.Flag) { // the flags on the command line
		if e, ok := f.Value.(*endpointsFlag); ok {
			e.flagged = true
		}
		delete(envErrs, f.Name)
	})
	fs.SetOutput(help)
	fs.Usage = usage
	if errors.Is(err, flag.ErrHelp) {
		fs.Usage()
		return nil, err
	}
	if err != nil {
		return nil, fmt.Errorf("%w (see tenure %s --help)", err, fs.Name())
	}
	var first string
	fs.VisitAll(func(f *flag.Flag) { // in the flags' order: one error, always the same
		if _, bad := envErrs[f.Name]; bad && first == "" {
			first = f.Name
		}
	})
	if first != "" {
		return nil, envErrs[first]
	}
	return fs.Args(), nil
}

// endpointsFlag is --endpoints: a comma-separated list, or, when neither
// the flag nor TENURE_ENDPOINTS was given, the backend's default port on
// this host (validate fills it in).
type endpointsFlag struct {
	list    string
	set     bool
	flagged bool // set on the command line, not only from TENURE_ENDPOINTS
}

func (f *endpointsFlag) String() string { return f.list }

func (f *endpointsFlag) Set(v string) error {
	f.list, f.set = v, true
	return nil
}

// defaultEndpoints is each backend's client port on this host.
var defaultEndpoints = map[string]string{
	"etcd":      "127.0.0.1:2379",
	"zookeeper": "127.0.0.1:2181",
	"redis":     "127.0.0.1:6379",
}

// canonicalBackend is the backend name --backend's value stands for.
func canonicalBackend(name string) string {
	if name == "zk" {
		return "zookeeper"
	}
	return name
}

func (c *common) validate() error {
	c.backend = canonicalBackend(c.backend)
	switch c.backend {
	case "etcd", "zookeeper", "redis":
	default:
		return fmt.Errorf("unknown backend %q (supported: etcd, zk, redis)", c.backend)
	}
	// TENURE_ENDPOINTS names servers of TENURE_BACKEND's backend, when
	// that is set too (tenure exec sets both for its command): a call on
	// another backend does not dial them.
	if env, ok := os.LookupEnv("TENURE_BACKEND"); ok && c.endpoints.set && !c.endpoints.flagged && canonicalBackend(env) != c.backend {
		c.endpoints.set = false
	}
	if !c.endpoints.set {
		c.endpoints.list = defaultEndpoints[c.backend]
	}
	if c.key == "" {
		if _, nested := os.LookupEnv("TENURE_TERM"); nested && os.Getenv("TENURE_KEY") != "" {
			return errors.New("--key is required and must not be empty (inside a tenure exec command TENURE_KEY names the lock the command runs under: tenure exec does not take it, or it would wait for that lock for good)")
		}
		return errors.New("--key is required and must not be empty")
	}
	var err error
	switch c.backend {
	case "etcd":
		err = etcdelect.CheckKey(c.key)
	case "redis":
		err = redislock.CheckKey(c.key)
	default:
		err = zkelect.CheckKey(c.key)
	}
	if err != nil {
		return err
	}
	eps, err := c.endpointList()
	if err != nil {
		return err
	}
	for _, ep := range eps {
		switch {
		case c.backend != "etcd" && strings.Contains(ep, "://"):
			return fmt.Errorf("endpoint %q: %s endpoints are HOST:PORT, without a scheme", ep, c.backend)
		case strings.HasPrefix(ep, "http://") && (c.sec.caCert != "" || c.sec.cert != ""):
			// etcd's client takes http:// for plaintext and drops the
			// TLS settings (credentials would then go in clear text).
			return fmt.Errorf("endpoint %q is plaintext (http://) while --cacert or --cert ask for TLS: use https:// or HOST:PORT", ep)
		}
	}
	if c.dialTimeout <= 0 {
		return fmt.Errorf("--dial-timeout %v must be positive", c.dialTimeout)
	}
	if _, err := zapcore.ParseLevel(c.logLevel); err != nil || c.logLevel == "" {
		return fmt.Errorf("--log-level %q: want debug, info, warn or error", c.logLevel)
	}
	if c.logFormat != "console" && c.logFormat != "json" {
		return fmt.Errorf("--log-format %q: want console or json", c.logFormat)
	}
	if err := c.sec.validate(c.backend); err != nil {
		return err
	}
	return nil
}

// logger logs at --log-level in --log-format to w.
func (c *common) logger(w io.Writer) *zap.Logger {
	level, _ := zapcore.ParseLevel(c.logLevel)
	var enc zapcore.Encoder
	if c.logFormat == "json" {
		enc = zapcore.NewJSONEncoder(zap.NewProductionEncoderConfig())
	} else {
		enc = zapcore.NewConsoleEncoder(zap.NewDevelopmentEncoderConfig())
	}
	return zap.New(zapcore.NewCore(enc, zapcore.AddSync(w), level))
}

// checkTTL refuses a TTL the backend cannot honour.
func (c *common) checkTTL(ttl time.Duration) error {
	switch c.backend {
	case "etcd":
		return etcdelect.New(nil).CheckTTL(ttl)
	case "redis":
		return (&redislock.Backend{}).CheckTTL(ttl)
	}
	return zkelect.CheckSessionTimeout(ttl)
}

// open connects to the backend (a ZooKeeper session's timeout is ttl) and
// checks that it answers within the dial timeout, so that an unreachable
// backend is an error and not a hang. close releases the connection.
func (c *common) open(ctx context.Context, ttl time.Duration) (b election.Backend, close func(), err error) {
	if c.backend == "etcd" {
		cli, err := c.connect(ctx)
		if err != nil {
			return nil, nil, err
		}
		return etcdelect.New(cli), func() { cli.Close() }, nil
	}
	if c.backend == "redis" {
		return c.openRedis(ctx)
	}
	eps, err := c.endpointList()
	if err != nil {
		return nil, nil, err
	}
	dctx, cancel := context.WithTimeout(ctx, c.dialTimeout)
	defer cancel()
	zb, err := zkelect.Dial(dctx, eps, ttl, c.sec.zk()...)
	if err != nil {
		if errors.Is(err, tenure.ErrUnavailable) {
			return nil, nil, fmt.Errorf("cannot reach zookeeper at %s within %v: %w", c.endpoints.list, c.dialTimeout, err)
		}
		return nil, nil, err
	}
	return zb, zb.Close, nil
}

func (c *common) endpointList() ([]string, error) {
	var eps []string
	for _, ep := range strings.Split(c.endpoints.list, ",") {
		ep = strings.TrimSpace(ep)
		if ep == "" {
			continue
		}
		host, port, err := net.SplitHostPort(strings.TrimPrefix(strings.TrimPrefix(ep, "http://"), "https://"))
		if n, perr := strconv.ParseUint(port, 10, 16); err != nil || strings.ContainsFunc(host, unicode.IsSpace) || perr != nil || n == 0 {
			return nil, fmt.Errorf("endpoint %q is not HOST:PORT (a port from 1 to 65535)", ep)
		}
		eps = append(eps, ep)
	}
	if len(eps) == 0 {
		return nil, errors.New("--endpoints is empty")
	}
	return eps, nil
}

// connect opens an etcd client and checks that at least one endpoint
// answers within the dial timeout, so that an unreachable backend is an
// error and not a hang.
func (c *common) connect(ctx context.Context) (*clientv3.Client, error) {
	eps, err := c.endpointList()
	if err != nil {
		return nil, err
	}
	cfg := clientv3.Config{
		Endpoints: eps, DialTimeout: c.dialTimeout, Logger: zap.NewNop(),
		// A connection to a member that went silent (a dropped route, a
		// powered-off host: no reset) is otherwise never found dead: a
		// waiter whose watch runs on it never hears its predecessor go,
		// while the other endpoints answer (see docs/etcd.md).
		DialKeepAliveTime: etcdKeepAliveTime, DialKeepAliveTimeout: etcdKeepAliveTimeout,
	}
	if err := c.sec.etcd(&cfg); err != nil {
		return nil, err
	}
	// With --user, New logs in on the client's own context, bounded only by
	// the dial timeout: a signal must end that too. The client keeps the
	// context for its life, and exec still needs it after a signal (to
	// release): it is cancelled by ctx only while New runs.
	cctx, cancelClient := context.WithCancel(context.Background())
	stop := context.AfterFunc(ctx, cancelClient)
	cfg.Context = cctx
	cli, err := clientv3.New(cfg)
	if !stop() && err == nil {
		err = ctx.Err() // a signal came as New returned
		cli.Close()
	}
	if err != nil {
		cancelClient()
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		if errors.Is(err, context.DeadlineExceeded) {
			// The login (with --user) timed out: say why for each endpoint.
			errs := make(errList, len(eps))
			for i, ep := range eps {
				errs[i] = fmt.Errorf("%s: %w", ep, probeCause(ctx, ep, err))
			}
			err = errs
		}
		return nil, c.sec.etcdDialError(c.endpoints.list, c.dialTimeout, err)
	}
	// Every endpoint at once: one that accepts and never answers (a
	// member powered off, behind a dropped route) must not use up the
	// time the others need.
	pctx, cancel := context.WithTimeout(ctx, c.dialTimeout)
	defer cancel()
	type probe struct {
		i   int
		err error
	}
	probes := make(chan probe, len(eps)) // never blocks: the probes end after cancel
	for i, ep := range eps {
		go func() {
			_, err := cli.Status(pctx, ep)
			probes <- probe{i, err}
		}()
	}
	errs := make([]error, len(eps))
	for range eps {
		p := <-probes
		if p.err == nil {
			return cli, nil
		}
		errs[p.i] = fmt.Errorf("%s: %w", eps[p.i], probeCause(ctx, eps[p.i], p.err))
	}
	cli.Close()
	if ctx.Err() != nil {
		return nil, ctx.Err()
	}
	return nil, c.sec.etcdDialError(c.endpoints.list, c.dialTimeout, errList(errs))
}

// errList is one error per endpoint, printed on one line.
type errList []error

func (l errList) Error() string {
	s := make([]string, len(l))
	for i, err := range l {
		s[i] = err.Error()
	}
	return strings.Join(s, "; ")
}

func (l errList) Unwrap() []error { return l }

// probeCause explains a status probe of endpoint ep that timed out: the
// gRPC client only retries its connection until the deadline, so the probe
// says "context deadline exceeded" whether nothing listens there, the
// host is unreachable, or something answers but not etcd's way (a TLS
// server, another protocol). One TCP dial tells the first two apart,
// within a second.
func probeCause(ctx context.Context, ep string, err error) error {
	if !errors.Is(err, context.DeadlineExceeded) || ctx.Err() != nil {
		return err
	}
	dctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	conn, derr := (&net.Dialer{}).DialContext(dctx, "tcp", strings.TrimPrefix(strings.TrimPrefix(ep, "http://"), "https://"))
	if derr != nil {
		return derr
	}
	conn.Close()
	return fmt.Errorf("%w (a TCP connection opens: is it an etcd client port, and does it speak TLS?)", err)
}

// oneLine flattens an error for a one-line message, without the "tenure: "
// that starts tenure's sentinel errors (the line starts with "tenure exec:"
// or "tenure leader:" already).
func oneLine(err error) string {
	return strings.TrimPrefix(strings.Join(strings.Fields(err.Error()), " "), "tenure: ")
}

// envHint adds to an error about a flag whose value came from its
// TENURE_<FLAG> variable (not from the command line) the variable's name:
// a user who never typed --dial-timeout should learn where 0s came from.
func envHint(fs *flag.FlagSet, err error) error {
	onLine := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { onLine[f.Name] = true })
	var from []string
	fs.VisitAll(func(f *flag.Flag) {
		name := envName(f)
		if onLine[f.Name] || !strings.Contains(err.Error(), "--"+f.Name) || strings.Contains(err.Error(), name) {
			return
		}
		if _, ok := os.LookupEnv(name); ok {
			from = append(from, "--"+f.Name+" comes from "+name)
		}
	})
	if len(from) == 0 {
		return err
	}
	return fmt.Errorf("%w (%s)", err, strings.Join(from, ", "))
}

// envName is the variable that sets flag f: TENURE_<FLAG>.
func envName(f *flag.Flag) string {
	return "TENURE_" + strings.ToUpper(strings.ReplaceAll(f.Name, "-", "_"))
}

// etcdKeepAliveTime and etcdKeepAliveTimeout are the etcd client's gRPC
// keepalive: a ping after this long without a frame on a connection with
// streams (grpc-go's least), and the wait for its answer before the
// connection is closed and its streams move to another endpoint. etcd
// refuses pings more often than every 5 s (--grpc-keepalive-min-time).
const (
	etcdKeepAliveTime    = 10 * time.Second
	etcdKeepAliveTimeout = 3 * time.Second
)
