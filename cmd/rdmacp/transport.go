package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/rdmacp/rdmacp/initiator"
	"github.com/rdmacp/rdmacp/verbs"
	"github.com/rdmacp/rdmacp/verbs/ibverbs"
	"github.com/rdmacp/rdmacp/verbs/iwarp"
	"github.com/rdmacp/rdmacp/verbs/roce"
)

var errTransport = errors.New("transport unavailable")

// registry lists the transports in order of preference for auto.
func registry() *verbs.Registry { return registryWith(ibverbs.Config{}, iwarp.Config{}, roce.Config{}) }

func registryWith(ib ibverbs.Config, soft iwarp.Config, rs roce.Config) *verbs.Registry {
	return verbs.NewRegistry(append(rdmaProviders(ib), iwarp.New(soft), roce.New(rs))...)
}

// explicitOnly are transports auto never picks: roce-soft takes UDP 4791,
// which a RoCE NIC's kernel driver may own, and talks only to peers that
// speak its connection setup, so it is used only when asked for by name.
var explicitOnly = map[string]bool{roce.Name: true}

// transportFlags are the flags every command that moves data takes.
func transportFlags() []cli.Flag {
	return []cli.Flag{
		&cli.StringFlag{Name: "transport", Value: "auto", Usage: "auto, " + strings.Join(registry().Names(), ", ")},
		&cli.StringFlag{Name: "device", Aliases: []string{"d"}, Usage: "RDMA device, as in perftest (e.g. mlx5_0); default: the first active one. cp: a comma-separated list spreads a session's data QPs over the devices, one rail each (serve: each --listen address goes to the listed device that owns it)"},
		&cli.IntFlag{Name: "ib-port", Aliases: []string{"i"}, Usage: "device port; 0 picks the first active one"},
		&cli.IntFlag{Name: "gid-index", Aliases: []string{"x"}, Value: -1, Usage: "GID index; -1 picks a RoCE v2 GID"},
		&cli.IntFlag{Name: "roce-port", Value: roce.UDPPort, Usage: "roce-soft: the UDP port this end receives RoCEv2 packets on (peers learn it at connection setup); 0 lets the kernel pick one"},
		&cli.StringFlag{Name: "roce-icrc", Value: "id0", Usage: "roce-soft: how received ICRCs are checked: id0 (over IP ID 0, what roce-soft peers send), raw (on a raw socket, any IP ID: a kernel rxe peer; needs root) or off (chunk digests still check the data end to end)"},
		&cli.StringFlag{Name: "roce-setup", Value: string(roce.SetupOOB), Usage: "roce-soft: how connections are set up: oob (roce-soft's out-of-band exchange over TCP: a roce-soft peer, or ibverbs with --ibverbs-setup oob) or cm (the IB Connection Manager over QP1, as rdma_cm speaks it, so that stock ibverbs on a RoCE device takes it as target or client; every end on UDP 4791)"},
		&cli.StringFlag{Name: "ibverbs-setup", Value: string(ibverbs.SetupRDMACM), Usage: "ibverbs: how connections are set up: rdma_cm, or oob (roce-soft's out-of-band exchange over TCP, so that a RoCE device takes roce-soft peers; both ends must say it)"},
		&cli.StringFlag{Name: "mpa-crc", Value: "auto", Usage: "iwarp-soft: ask for MPA CRC32c on every FPDU: auto (except over loopback), on, or off (it is used if either side asks). Chunk digests check the data end to end either way"},
	}
}

// openTransport opens the device the flags ask for and says why it was
// chosen. Asked for by name, a transport that can't run is an error: no
// silent fallback.
func openTransport(ctx context.Context, c *cli.Context) (verbs.Device, string, error) {
	var soft iwarp.Config
	switch c.String("mpa-crc") {
	case "auto", "":
	case "on":
		soft.CRC = iwarp.CRCOn
	case "off":
		soft.CRC = iwarp.CRCOff
	default:
		return nil, "", usagef("--mpa-crc %q: want auto, on or off", c.String("mpa-crc"))
	}
	// A software endpoint on a busy host can leave its receive goroutine
	// unscheduled for longer than IB's 65 ms x 8 retransmit budget: under
	// a CPU hog a READ failed "retry counter exceeded" with no packet
	// lost (UDP RcvbufErrors unchanged). 250 ms x 8 rides that out; a
	// packet really lost costs 250 ms.
	rs := roce.Config{Port: c.Int("roce-port"), RetransmitTimeout: 250 * time.Millisecond}
	if rs.Port == 0 {
		rs.Port = -1
	}
	rs.Setup = roce.Setup(c.String("roce-setup"))
	if rs.Setup != roce.SetupOOB && rs.Setup != roce.SetupCM {
		return nil, "", usagef("--roce-setup %q: want %s or %s", rs.Setup, roce.SetupOOB, roce.SetupCM)
	}
	switch c.String("roce-icrc") {
	case "id0", "":
	case "raw":
		rs.RawICRC = true
	case "off":
		rs.NoICRCCheck = true
	default:
		return nil, "", usagef("--roce-icrc %q: want id0, raw or off", c.String("roce-icrc"))
	}
	ib := ibverbs.Config{Setup: ibverbs.Setup(c.String("ibverbs-setup"))}
	if err := ib.Validate(); err != nil {
		return nil, "", usagef("--ibverbs-setup %q: want %s or %s", ib.Setup, ibverbs.SetupRDMACM, ibverbs.SetupOOB)
	}
	reg := registryWith(ib, soft, rs)
	dc := verbs.DeviceConfig{Name: deviceNames(c)[0], Port: c.Int("ib-port"), GIDIndex: c.Int("gid-index")}
	name := c.String("transport")
	if name != "auto" {
		p, err := reg.Lookup(name)
		if err != nil {
			return nil, "", usageError{err}
		}
		d, err := p.Open(ctx, dc)
		if err != nil {
			return nil, "", fmt.Errorf("%w: --transport %s: %w", errTransport, name, err)
		}
		if p.Name() == roce.Name {
			return d, fmt.Sprintf("%s (asked for with --transport), connection setup %s (--roce-setup)", p.Name(), rs.Setup), nil
		}
		return d, fmt.Sprintf("%s (asked for with --transport)", p.Name()), nil
	}
	var skipped []string
	for _, p := range reg.Providers() {
		if explicitOnly[p.Name()] {
			continue
		}
		devs, err := p.Devices(ctx)
		active := ""
		for _, d := range devs {
			if d.Active && (dc.Name == "" || d.Name == dc.Name) {
				active = d.Name
				break
			}
		}
		if err != nil || active == "" {
			why := "no active device"
			if err != nil {
				why = err.Error()
			}
			skipped = append(skipped, p.Name()+": "+why)
			continue
		}
		d, err := p.Open(ctx, verbs.DeviceConfig{Name: active, Port: dc.Port, GIDIndex: dc.GIDIndex})
		if err != nil {
			skipped = append(skipped, p.Name()+": "+err.Error())
			continue
		}
		why := "auto: " + p.Name() + " device " + active
		if len(skipped) > 0 {
			why = "auto; " + strings.Join(skipped, "; ")
		}
		return d, fmt.Sprintf("%s (%s)", p.Name(), why), nil
	}
	return nil, "", fmt.Errorf("%w: no transport can run here: %s", errTransport, strings.Join(skipped, "; "))
}

// readSecret takes the shared secret from --secret-file or RDMACP_SECRET.
func readSecret(c *cli.Context) ([]byte, error) {
	if f := c.String("secret-file"); f != "" {
		b, err := os.ReadFile(f)
		if err != nil {
			return nil, usageError{fmt.Errorf("--secret-file: %w", err)}
		}
		s := strings.TrimRight(string(b), "\r\n")
		if s == "" {
			return nil, usageError{fmt.Errorf("--secret-file %s is empty", f)}
		}
		return []byte(s), nil
	}
	if s := os.Getenv("RDMACP_SECRET"); s != "" {
		return []byte(s), nil
	}
	return nil, nil
}

func secretFlag() cli.Flag {
	return &cli.StringFlag{Name: "secret-file", Usage: "FILE holding the shared secret, the same on target and initiator (or put the secret itself, not a file name, in $RDMACP_SECRET)"}
}

// shortWhy is the transport line without why the others were passed
// over ("iwarp-soft (auto; ibverbs: no active device)" is "iwarp-soft
// (auto)"): printed before every command, the whole reason was a line and
// a half of noise. -v, doctor and --json's summary keep it whole.
func shortWhy(why string) string {
	if i := strings.Index(why, "; "); i >= 0 && strings.HasSuffix(why, ")") {
		return why[:i] + ")"
	}
	return why
}

// dialSession opens the transport the flags ask for, says which (and
// why) on stderr unless silent or -q, and opens a session to addr over
// it. close ends both.
func dialSession(c *cli.Context, addr string, cfg initiator.Config, silent bool) (s *initiator.Session, why string, close func(), err error) {
	dev, why, err := openTransport(c.Context, c)
	if err != nil {
		return nil, "", nil, err
	}
	if !silent && !quiet(c) {
		line := why
		if !c.Bool("verbose") {
			line = shortWhy(why)
		}
		fmt.Fprintln(c.App.ErrWriter, "transport:", line)
	}
	more, err := openMore(c, dev)
	if err != nil {
		dev.Close()
		return nil, "", nil, err
	}
	closeDevs := func() {
		for _, d := range more {
			d.Close()
		}
		dev.Close()
	}
	cfg.Device, cfg.MoreDevices = dev, more
	s, err = initiator.Dial(c.Context, addr, cfg)
	if err != nil {
		closeDevs()
		return nil, "", nil, err
	}
	warnSkippedRails(c.App.ErrWriter, s.SkippedRails()) // a warning: -q and --json keep it
	warnCapped(c.App.ErrWriter, s.Capped())
	if rc := rateCapOf(s); rc != nil && rc.By == "target" && !silent && !quiet(c) {
		fmt.Fprintln(c.App.ErrWriter, rateCapText(s)) // before a copy that will take longer than its user thought
	}
	return s, why, func() {
		if !closedWithin(c.Context, s.Close, interruptedCloseWait) {
			return // the process is exiting: the kernel closes what is left
		}
		closeDevs()
	}, nil
}

// interruptedCloseWait bounds a session's close after SIGINT or SIGTERM.
// A close says Bye (up to 300 ms) and lets each QP's socket linger up to
// 1 s for a peer to read what was sent: 1.4-1.6 s against a frozen target,
// which under load ran past the 1.8 s backstop (exitAfterInterrupt), so
// cp exited without its error line. An interrupted cp is about to exit,
// and the kernel closes its sockets then; it need not wait for the peer.
const interruptedCloseWait = 300 * time.Millisecond

// closedWithin runs shut, waiting for it for ever while ctx is live and at
// most wait once ctx is done (interrupted). It reports whether shut ended.
func closedWithin(ctx context.Context, shut func() error, wait time.Duration) bool {
	if ctx.Err() == nil {
		shut()
		return true
	}
	done := make(chan struct{})
	go func() { shut(); close(done) }()
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-done:
		return true
	case <-t.C:
		return false
	}
}
