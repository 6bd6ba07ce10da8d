package test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// maxEtcdctlContenders bounds `etcdctl lock` runs: each contender is an
// etcdctl process of its own (~etcdctlRSSMB MB resident), so 1,000 of them
// do not fit beside the other runs on a small machine. The report says so.
const (
	maxEtcdctlContenders = 100
	etcdctlRSSMB         = 20
)

// toolDir holds the binaries the benchmarks build (etcdctl, tenure); run
// removes it after the benchmarks.
var (
	toolDirOnce sync.Once
	toolDir     string
	toolDirErr  error
)

func tools() (string, error) {
	toolDirOnce.Do(func() { toolDir, toolDirErr = os.MkdirTemp("", "tenure-bench-tools-") })
	return toolDir, toolDirErr
}

func removeTools() {
	if toolDir != "" {
		os.RemoveAll(toolDir)
	}
}

// buildOnce builds a binary into the tool directory once per process.
type buildOnce struct {
	once sync.Once
	path string
	err  error
}

func (o *buildOnce) build(name string, args ...string) (string, error) {
	o.once.Do(func() {
		dir, err := tools()
		if err != nil {
			o.err = err
			return
		}
		goBin, err := exec.LookPath("go")
		if err != nil {
			o.err = fmt.Errorf("building %s: no go on PATH: %w", name, err)
			return
		}
		out := filepath.Join(dir, name)
		// No version-control stamp: a checkout owned by another user (a
		// CI runner's workspace) makes git refuse, and the build with it.
		// (After args' flags: go build wants -C first.)
		cmd := exec.Command(goBin, append(append([]string{"build"}, args[:len(args)-1]...), "-buildvcs=false", "-o", out, args[len(args)-1])...)
		if b, err := cmd.CombinedOutput(); err != nil {
			o.err = fmt.Errorf("building %s: %v\n%s", name, err, b)
			return
		}
		o.path = out
	})
	return o.path, o.err
}

var etcdctlBuild, tenureBuild buildOnce

// etcdctlBinary builds etcdctl (the version of the etcd server module) from
// the tools module in testdata/etcdctl; the first build downloads its
// modules.
func etcdctlBinary() (string, error) {
	return etcdctlBuild.build("etcdctl", "-C", filepath.Join("testdata", "etcdctl"), "go.etcd.io/etcd/etcdctl/v3")
}

// tenureBinary builds cmd/tenure, the CLI whose `tenure exec` the failover
// benchmarks run.
func tenureBinary() (string, error) {
	return tenureBuild.build("tenure", "github.com/tenure-go/tenure/cmd/tenure")
}

// etcdctlContender is one `etcdctl lock KEY` process per acquisition: the
// process prints the lock's key once it holds it, and releases it (Unlock,
// a delete) and exits on SIGTERM. A campaign starts a new process, as a
// shell loop around etcdctl would.
type etcdctlContender struct {
	key string

	mu   sync.Mutex
	proc *os.Process   // the holding process, or nil
	done chan struct{} // closed when proc has exited
}

func newEtcdctl(_ *clientv3.Client, key string, _ int) (contender, error) {
	return &etcdctlContender{key: key}, nil
}

// lineSignal closes got at the first newline written to it.
type lineSignal struct {
	once sync.Once
	got  chan struct{}
}

func (w *lineSignal) Write(p []byte) (int, error) {
	if bytes.IndexByte(p, '\n') >= 0 {
		w.once.Do(func() { close(w.got) })
	}
	return len(p), nil
}

func (c *etcdctlContender) campaign(ctx context.Context) error {
	bin, err := etcdctlBinary()
	if err != nil {
		return err
	}
	cmd := exec.Command(bin, "--endpoints", endpoint, "lock", "--ttl", "10", c.key)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	out := &lineSignal{got: make(chan struct{})}
	var stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = out, &stderr
	if err := cmd.Start(); err != nil {
		return err
	}
	done := make(chan struct{})
	var waitErr error
	go func() { waitErr = cmd.Wait(); close(done) }()
	c.mu.Lock()
	c.proc, c.done = cmd.Process, done
	c.mu.Unlock()
	select {
	case <-out.got:
		return nil
	case <-done:
		return fmt.Errorf("etcdctl lock exited before it held %s: %v: %s", c.key, waitErr, stderr.Bytes())
	case <-ctx.Done():
		_ = cmd.Process.Signal(syscall.SIGTERM) // cancels its Lock: it deletes its key
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
		return ctx.Err()
	}
}

func (c *etcdctlContender) resign(ctx context.Context) error {
	c.mu.Lock()
	proc, done := c.proc, c.done
	c.proc = nil
	c.mu.Unlock()
	if proc == nil {
		return fmt.Errorf("etcdctl lock for %s is not running", c.key)
	}
	if err := proc.Signal(syscall.SIGTERM); err != nil {
		return err
	}
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (c *etcdctlContender) close(context.Context) error {
	c.mu.Lock()
	proc, done := c.proc, c.done
	c.proc = nil
	c.mu.Unlock()
	if proc == nil {
		return nil
	}
	_ = proc.Signal(syscall.SIGTERM)
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		_ = proc.Kill()
		<-done
	}
	return nil
}

// pid returns the running process's id, or 0.
func (c *etcdctlContender) pid() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.proc == nil {
		return 0
	}
	return c.proc.Pid
}

// procRSS measures the mean resident set of the contenders' processes.
func procRSS(cons []contender) []metric {
	var sum float64
	k := 0
	for _, c := range cons {
		if p, ok := c.(interface{ pid() int }); ok {
			if pid := p.pid(); pid != 0 {
				if r := rssKB(pid); r > 0 {
					sum += r
					k++
				}
			}
		}
	}
	if k == 0 {
		return nil
	}
	return []metric{{sum / float64(k), "rss-KB/candidate"}}
}
