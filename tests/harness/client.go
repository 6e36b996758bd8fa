package harness

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"time"
)

// DialTCP connects to addr from a socket created inside ns. The connection
// can then be used from any goroutine; it stays in ns.
func DialTCP(ns *NetNS, addr netip.AddrPort, timeout time.Duration) (net.Conn, error) {
	var c net.Conn
	err := Do(ns, func() error {
		var err error
		c, err = (&net.Dialer{Timeout: timeout}).Dial("tcp", addr.String())
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("dial tcp %s from %s: %w", addr, ns.Name, err)
	}
	return c, nil
}

// DialUDP returns a connected UDP socket to addr, created inside ns. A
// connected socket only accepts datagrams whose source is addr.
func DialUDP(ns *NetNS, addr netip.AddrPort) (*net.UDPConn, error) {
	var c *net.UDPConn
	err := Do(ns, func() error {
		var err error
		c, err = net.DialUDP(udpNetwork(addr), nil, net.UDPAddrFromAddrPort(addr))
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("dial udp %s from %s: %w", addr, ns.Name, err)
	}
	return c, nil
}

// ListenUDP returns an unconnected UDP socket created inside ns, bound to
// an ephemeral port on the wildcard address of the family of like.
func ListenUDP(ns *NetNS, like netip.Addr) (*net.UDPConn, error) {
	var c *net.UDPConn
	network := udpNetwork(netip.AddrPortFrom(like, 0))
	err := Do(ns, func() error {
		var err error
		c, err = net.ListenUDP(network, nil)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("open %s socket in %s: %w", network, ns.Name, err)
	}
	return c, nil
}

// WhoTCP connects to addr from ns, reads the greeting line of a TCP echo
// server and returns the pod name in it.
func WhoTCP(ns *NetNS, addr netip.AddrPort, timeout time.Duration) (string, error) {
	deadline := time.Now().Add(timeout)
	c, err := DialTCP(ns, addr, timeout)
	if err != nil {
		return "", err
	}
	defer c.Close()
	if err := c.SetDeadline(deadline); err != nil {
		return "", err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return "", fmt.Errorf("read greeting from tcp %s: %w", addr, err)
	}
	return strings.TrimSuffix(line, "\n"), nil
}

// WhoUDP sends one datagram to addr from an unconnected socket in ns and
// returns the pod name in the echo server's reply and the reply's source
// address (which a service proxy must make equal to addr).
func WhoUDP(ns *NetNS, addr netip.AddrPort, timeout time.Duration) (string, netip.AddrPort, error) {
	c, err := ListenUDP(ns, addr.Addr())
	if err != nil {
		return "", netip.AddrPort{}, err
	}
	defer c.Close()
	if err := c.SetDeadline(time.Now().Add(timeout)); err != nil {
		return "", netip.AddrPort{}, err
	}
	payload := []byte("who-" + randomSuffix(12))
	if _, err := c.WriteToUDPAddrPort(payload, addr); err != nil {
		return "", netip.AddrPort{}, fmt.Errorf("send udp to %s from %s: %w", addr, ns.Name, err)
	}
	buf := make([]byte, 64<<10)
	n, from, err := c.ReadFromUDPAddrPort(buf)
	if err != nil {
		return "", netip.AddrPort{}, fmt.Errorf("read udp reply from %s in %s: %w", addr, ns.Name, err)
	}
	name, err := parseUDPEcho(buf[:n], payload)
	return name, from, err
}

// WhoUDPConnected is WhoUDP over a connected socket: the kernel drops
// replies whose source is not addr, so a wrong reply source shows up as a
// timeout.
func WhoUDPConnected(ns *NetNS, addr netip.AddrPort, timeout time.Duration) (string, error) {
	c, err := DialUDP(ns, addr)
	if err != nil {
		return "", err
	}
	defer c.Close()
	who, err := AskUDP(c, timeout)
	if err != nil {
		return "", fmt.Errorf("%s from %s: %w", addr, ns.Name, err)
	}
	return who, nil
}

// AskUDP sends one datagram on the connected socket c and returns the name
// of the echo server that answered. A socket that kpr destroyed fails with
// ECONNABORTED.
func AskUDP(c *net.UDPConn, timeout time.Duration) (string, error) {
	if err := c.SetDeadline(time.Now().Add(timeout)); err != nil {
		return "", err
	}
	payload := []byte("who-" + randomSuffix(12))
	if _, err := c.Write(payload); err != nil {
		return "", fmt.Errorf("send udp: %w", err)
	}
	buf := make([]byte, 64<<10)
	n, err := c.Read(buf)
	if err != nil {
		return "", fmt.Errorf("read udp reply: %w", err)
	}
	return parseUDPEcho(buf[:n], payload)
}

// HTTPGet fetches http://addr/path from a socket in ns (no keep-alive) and
// returns the body. A non-200 status is an error.
func HTTPGet(ns *NetNS, addr netip.AddrPort, path string, timeout time.Duration) (string, error) {
	client := &http.Client{
		Timeout: timeout,
		Transport: &http.Transport{
			DisableKeepAlives: true,
			DialContext: func(ctx context.Context, network, address string) (net.Conn, error) {
				var c net.Conn
				err := Do(ns, func() error {
					var err error
					c, err = (&net.Dialer{}).DialContext(ctx, network, address)
					return err
				})
				return c, err
			},
		},
	}
	defer client.CloseIdleConnections()
	url := "http://" + addr.String() + path
	resp, err := client.Get(url)
	if err != nil {
		return "", fmt.Errorf("GET %s from %s: %w", url, ns.Name, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return "", fmt.Errorf("read body of GET %s: %w", url, err)
	}
	if resp.StatusCode != http.StatusOK {
		return string(body), fmt.Errorf("GET %s: status %s", url, resp.Status)
	}
	return string(body), nil
}

// parseUDPEcho splits "<name>\n<payload>" and checks the payload is ours.
func parseUDPEcho(reply, payload []byte) (string, error) {
	name, rest, ok := bytes.Cut(reply, []byte("\n"))
	if !ok || !bytes.Equal(rest, payload) {
		return "", fmt.Errorf("unexpected udp reply %q (want \"<pod>\\n%s\")", reply, payload)
	}
	return string(name), nil
}

// udpNetwork picks "udp4" or "udp6" so an IPv4 peer gets a plain AF_INET
// socket and reply sources come back as IPv4, not IPv4-mapped IPv6.
func udpNetwork(addr netip.AddrPort) string {
	if addr.Addr().Unmap().Is4() {
		return "udp4"
	}
	return "udp6"
}
