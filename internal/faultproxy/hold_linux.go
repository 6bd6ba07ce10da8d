package faultproxy

import (
	"fmt"
	"net"
	"net/netip"
	"os"
	"syscall"
)

// held is a socket bound to a proxy's address that does not listen: the
// kernel refuses connections to it, and does not hand the port out as an
// ephemeral port (to an outgoing connection or a listener on port 0)
// while it is bound, as it could once a closed listener had released it.
type held struct{ fd int }

// hold binds a socket to addr (an IPv4 host:port) without listening.
func hold(addr string) (*held, error) {
	ap, err := netip.ParseAddrPort(addr)
	if err != nil || !ap.Addr().Is4() {
		return nil, fmt.Errorf("faultproxy: hold %q: not an IPv4 address and port", addr)
	}
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("faultproxy: hold %s: %w", addr, err)
	}
	// Connections the closed listener had accepted may linger in
	// TIME_WAIT on the port.
	if err := syscall.SetsockoptInt(fd, syscall.SOL_SOCKET, syscall.SO_REUSEADDR, 1); err != nil {
		syscall.Close(fd)
		return nil, fmt.Errorf("faultproxy: hold %s: %w", addr, err)
	}
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Port: int(ap.Port()), Addr: ap.Addr().As4()}); err != nil {
		syscall.Close(fd)
		return nil, fmt.Errorf("faultproxy: hold %s: %w", addr, err)
	}
	return &held{fd: fd}, nil
}

// listen makes the held socket listen and returns it as a listener; h is
// used up either way.
func (h *held) listen() (net.Listener, error) {
	if err := syscall.Listen(h.fd, syscall.SOMAXCONN); err != nil {
		h.close()
		return nil, err
	}
	f := os.NewFile(uintptr(h.fd), "faultproxy")
	defer f.Close() // FileListener works on a copy
	return net.FileListener(f)
}

func (h *held) close() { syscall.Close(h.fd) }
