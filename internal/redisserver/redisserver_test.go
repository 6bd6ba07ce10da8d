package redisserver

import (
	"errors"
	"net"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestRestart_APortTakenByAnotherProcessIsAnError: a port that another
// listener took between its choice and the start makes redis-server exit
// ("Address already in use"). The start waited for a connection, which the
// other listener accepted: it returned as if its server ran. It reports
// errPortTaken now, on which Start chooses another port.
func TestRestart_APortTakenByAnotherProcessIsAnError(t *testing.T) {
	if err := Installed(); err != nil {
		t.Skip(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() { // accept, as a server would
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	s := &Server{dir: t.TempDir(), port: ln.Addr().(*net.TCPAddr).Port}
	err = s.Restart()
	if err == nil {
		s.Close()
		t.Fatal("Restart on a port another listener holds succeeded")
	}
	if !errors.Is(err, errPortTaken) {
		t.Fatalf("Restart on a taken port: %v, want errPortTaken", err)
	}

	started, err := Start(t.TempDir(), Options{})
	if err != nil {
		t.Fatal(err)
	}
	started.Close()
}
