// Command tenure runs a command only while it holds a lock, reports who
// leads a key, and demonstrates failover on an embedded etcd.
//
//	tenure exec   --key KEY [flags] -- CMD [ARG...]
//	tenure leader --key KEY [--watch] [--json]
//	tenure demo
//
// Every flag can also be set from the environment: --endpoints from
// TENURE_ENDPOINTS, --dial-timeout from TENURE_DIAL_TIMEOUT, and so on (but
// tenure exec inside a tenure exec command ignores TENURE_KEY and
// TENURE_IDENTITY, which name the enclosing lock). A flag on the command
// line wins. Logs go to stderr; stdout belongs to the command
// (exec) or to the answer (leader).
//
// Exit status: exec exits with the command's status, 0 when --no-wait
// skipped the command, 1 when the campaign failed, 2 on bad input or an
// unreachable backend, 4 when leadership was lost while the command ran
// (it was stopped) or before it started (it was not run),
// 127 when the command could not be found (before campaigning) or
// started, 128+N on signal N; leader
// exits 3 when the key is vacant (README.md has the table).
package main

import (
	"fmt"
	"io"
	"os"
)

// Exit statuses shared by the subcommands.
const (
	exitOK       = 0
	exitFailure  = 1
	exitUsage    = 2
	exitVacant   = 3
	exitLostLead = 4
	// exitCannotRun: exec's command could not be found (checked before
	// the campaign) or started, as a shell's 127.
	exitCannotRun = 127
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

const usage = `tenure: leader election and fair locks for Go services.

Usage:
  tenure exec   --key KEY [--backend etcd|zk|redis] [--endpoints HOST:PORT,...] [--ttl 10s] [--no-wait] -- CMD [ARG...]
      Wait for KEY (first come, first served), run CMD while holding it,
      release it when CMD exits. CMD sees TENURE_TERM (the fencing token),
      TENURE_KEY, TENURE_IDENTITY, TENURE_BACKEND and TENURE_ENDPOINTS.
  tenure leader --key KEY [--backend etcd|zk|redis] [--endpoints HOST:PORT,...] [--watch] [--json]
      Print the holder of KEY and its term; exit 3 when KEY is vacant.
  tenure demo
      Start an embedded etcd, run three candidates, then resign, kill and
      cut off the leader in turn, printing the failovers.

Run "tenure COMMAND --help" for a command's flags. Every flag also reads
the environment variable TENURE_<FLAG> (e.g. TENURE_ENDPOINTS), except
that tenure exec inside a tenure exec command ignores TENURE_KEY and
TENURE_IDENTITY, which name the enclosing lock.
`

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return exitUsage
	}
	switch args[0] {
	case "exec":
		return cmdExec(args[1:], stdout, stderr)
	case "leader":
		return cmdLeader(args[1:], stdout, stderr)
	case "demo":
		return cmdDemo(args[1:], stdout, stderr)
	case guardCommand: // started by tenure exec, not documented for users
		return cmdGuard(args[1:], stderr)
	case "-h", "--help", "help":
		fmt.Fprint(stdout, usage)
		return exitOK
	default:
		fmt.Fprintf(stderr, "tenure: unknown command %q\n\n%s", args[0], usage)
		return exitUsage
	}
}
