//go:build !linux

package faultproxy

import (
	"errors"
	"net"
)

// held is not available here: Refuse releases the port, and Listen binds
// it again if it is still free.
type held struct{}

func hold(string) (*held, error) { return nil, errors.New("faultproxy: holding a port needs Linux") }

func (*held) listen() (net.Listener, error) {
	return nil, errors.New("faultproxy: holding a port needs Linux")
}

func (*held) close() {}
