package main

import (
	"time"

	"github.com/spf13/pflag"
	"go.uber.org/zap"

	"github.com/kpr-io/kpr/iptables-compat/netfilter"
	"github.com/kpr-io/kpr/loader"
)

// conntrackFlags are kube-proxy's conntrack settings, its --conntrack-*
// flags and its file's conntrack section, with kube-proxy's defaults. They
// mean one thing whichever way they are given: every mode writes them into
// the node's conntrack sysctls at start-up, as kube-proxy does in every
// mode, since the node's netfilter tracks more than Services (the CNI's
// masquerade, hostPorts) whichever mode translates them; the eBPF mode
// also gives those with a counterpart in the tc programs' own conntrack
// (the established TCP and the UDP lifetimes) to the tc programs.
type conntrackFlags struct {
	maxPerCore, min              int32
	tcpEstablished, tcpCloseWait time.Duration
	tcpBeLiberal                 bool
	udp, udpStream               time.Duration
	tcpSyn, tcpFin, tcpRst       time.Duration // kpr's own: tc programs only
}

func addConntrackFlags(fl *pflag.FlagSet, c *conntrackFlags) {
	const nf = "sets the node's sysctl "
	fl.Int32Var(&c.maxPerCore, "conntrack-max-per-core", 32768, nf+"nf_conntrack_max to this times the CPUs (at least --conntrack-min, at most 1Mi), "+
		"as kube-proxy; 0 leaves it. The eBPF mode's tc programs have a table of their own, --map-size-conntrack")
	fl.Int32Var(&c.min, "conntrack-min", 131072, "the least nf_conntrack_max that --conntrack-max-per-core sets")
	fl.DurationVar(&c.tcpEstablished, "conntrack-tcp-timeout-established", 24*time.Hour, nf+"nf_conntrack_tcp_timeout_established, as kube-proxy; "+
		"in the eBPF mode also the lifetime of an established TCP flow (handshake completed both ways) in the tc programs' conntrack. 0 leaves the sysctl, and keeps 24h in the tc programs")
	fl.DurationVar(&c.tcpCloseWait, "conntrack-tcp-timeout-close-wait", time.Hour, nf+"nf_conntrack_tcp_timeout_close_wait, as kube-proxy; 0 leaves it. "+
		"The eBPF mode's tc programs end a flow --conntrack-tcp-timeout-fin after a FIN")
	fl.BoolVar(&c.tcpBeLiberal, "conntrack-tcp-be-liberal", false, nf+"nf_conntrack_tcp_be_liberal to 1, as kube-proxy (and the netfilter modes then leave out the drop of conntrack-INVALID packets)")
	fl.DurationVar(&c.udp, "conntrack-udp-timeout", 0, nf+"nf_conntrack_udp_timeout, as kube-proxy; in the eBPF mode also the lifetime of a UDP flow without an answer. 0 leaves the sysctl, and keeps 30s in the tc programs")
	fl.DurationVar(&c.udpStream, "conntrack-udp-timeout-stream", 0, nf+"nf_conntrack_udp_timeout_stream, as kube-proxy; in the eBPF mode also the lifetime of an answered UDP flow. 0 leaves the sysctl, and keeps 2m in the tc programs")
	fl.DurationVar(&c.tcpSyn, "conntrack-tcp-timeout-syn", 0, "eBPF mode: lifetime of a TCP flow whose handshake has not completed both ways (a SYN, answered or not); 0 keeps 1m (netfilter's SYN_RECV)")
	fl.DurationVar(&c.tcpFin, "conntrack-tcp-timeout-fin", 0, "eBPF mode: lifetime of a TCP flow after a FIN; 0 keeps 2m (netfilter's TIME_WAIT)")
	fl.DurationVar(&c.tcpRst, "conntrack-tcp-timeout-rst", 0, "eBPF mode: lifetime of a TCP flow after a RST; 0 keeps 10s (netfilter's CLOSE)")
}

// tcTimeouts are the lifetimes of the tc programs' conntrack; a zero keeps
// the loader's default.
func (c conntrackFlags) tcTimeouts() loader.ConntrackTimeouts {
	return loader.ConntrackTimeouts{TCPSyn: c.tcpSyn, TCPEstablished: c.tcpEstablished, TCPFin: c.tcpFin, TCPRst: c.tcpRst,
		UDP: c.udp, UDPStream: c.udpStream}
}

// sysctls are the node's conntrack settings every mode writes.
func (c conntrackFlags) sysctls() netfilter.ConntrackSysctls {
	return netfilter.ConntrackSysctls{MaxPerCore: c.maxPerCore, Min: c.min, TCPEstablished: c.tcpEstablished, TCPCloseWait: c.tcpCloseWait,
		TCPBeLiberal: c.tcpBeLiberal, UDP: c.udp, UDPStream: c.udpStream}
}

// applyConntrackSysctls writes the conntrack settings into the node's
// network namespace. A failure is logged, not fatal: the mode serves
// Services without them, with the kernel's own values.
func applyConntrackSysctls(f *runFlags, log *zap.Logger) {
	if err := f.inHostNetNS(func() error { return f.conntrack.sysctls().Apply(log) }); err != nil {
		log.Warn("Could not write kube-proxy's conntrack settings into the node's sysctls; the kernel's values stay", zap.Error(err))
	}
}
