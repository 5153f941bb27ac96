package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/urfave/cli/v2"
	"golang.org/x/sys/unix"

	"github.com/rdmacp/rdmacp/initiator"
	"github.com/rdmacp/rdmacp/target"
	"github.com/rdmacp/rdmacp/verbs"
	"github.com/rdmacp/rdmacp/verbs/ibverbs"
	"github.com/rdmacp/rdmacp/verbs/iwarp"
	"github.com/rdmacp/rdmacp/verbs/roce"
)

func doctorCommand() *cli.Command {
	return &cli.Command{
		Name:      "doctor",
		Usage:     "check that this host can run rdmacp, and optionally reach a target",
		ArgsUsage: "[HOST[:PORT]]",
		Description: "One line per check, each ok, warn, fail or skip with a detail and a hint: the transports\n" +
			"and their devices, which one auto picks and why, the locked-memory limit against what rdmacp\n" +
			"pins, the RDMA devices in sysfs (each port's link rate and the device's NUMA node), the network\n" +
			"interfaces that are up (addresses, speed, NUMA node: the candidates for cp --bind and serve --listen),\n" +
			"whether file mappings can be registered, memory windows, and,\n" +
			"given a HOST, TCP reachability of the target and a real session hello. Exits 1 if a check failed.",
		Flags: append([]cli.Flag{
			&cli.BoolFlag{Name: "json", Usage: "one JSON object per check, then a summary"},
			quietFlag(),
			&cli.IntFlag{Name: "qps", Value: 4, Usage: "data queue pairs cp will use (for the pinned-memory estimate)"},
			&cli.IntFlag{Name: "depth", Value: 4, Usage: "READs in flight per queue pair (for the estimate)"},
			&cli.StringFlag{Name: "read-size", Value: "1MiB", Usage: "bytes per READ (for the estimate)"},
			&cli.StringFlag{Name: "chunk-size", Value: "4MiB", Usage: "bytes per chunk (for the estimate)"},
			&cli.StringFlag{Name: "max-window", Value: "32MiB", Usage: "the target's --max-window (for the estimate)"},
			&cli.StringFlag{Name: "window-budget", Value: "1GiB", Usage: "the target's --window-budget (for the estimate)"},
			&cli.StringFlag{Name: "dir", Usage: "directory to probe file registration in, where exports live (default: the temp dir)"},
			&cli.StringFlag{Name: "timeout", Value: "5s", Usage: "I/O timeout: bound on the session check's hello and auth, after it connects"},
			&cli.StringFlag{Name: "contimeout", Value: "10s", Usage: "connection setup timeout: bound on the reachability check's TCP connect and the session check's connections"},
			secretFlag(),
			identityFlag(),
		}, transportFlags()...),
		Action: runDoctor,
	}
}

// Check statuses.
const (
	checkOK   = "ok"
	checkWarn = "warn"
	checkFail = "fail"
	checkSkip = "skip"
)

type doctor struct {
	out    io.Writer
	json   bool
	quiet  bool // -q: only the warnings and failures
	counts map[string]int
}

func (d *doctor) report(name, status, detail, hint string) {
	d.counts[status]++
	if d.json {
		json.NewEncoder(d.out).Encode(check{Type: "check", Name: name, Status: status, Detail: detail, Hint: hint})
		return
	}
	if d.quiet && status != checkWarn && status != checkFail {
		return
	}
	line := fmt.Sprintf("%-4s  %-24s %s", status, name, detail)
	if hint != "" {
		line += "; hint: " + hint
	}
	fmt.Fprintln(d.out, line)
}

// doctorAddr reads HOST, HOST:PORT or [V6]:PORT, and HOST[:PORT]:PATH too.
func doctorAddr(s string) (string, error) {
	if h, p, err := net.SplitHostPort(s); err == nil {
		if n, err := strconv.Atoi(p); err == nil && n > 0 && n < 65536 && h != "" {
			return s, nil
		}
	}
	r, ok, err := parseRemote(s)
	if errors.Is(err, errRemoteUser) {
		return "", err
	}
	if err == nil && ok {
		return r.addr, nil
	}
	h := strings.Trim(s, "[]")
	if err := noUser(s, h); err != nil {
		return "", err
	}
	if h == "" || strings.ContainsAny(h, "/ ") {
		return "", fmt.Errorf("%q: want HOST[:PORT]", s)
	}
	return net.JoinHostPort(h, strconv.Itoa(target.DefaultPort)), nil
}

func runDoctor(c *cli.Context) error {
	ctx := c.Context
	o, err := doctorFlags(c)
	if err != nil {
		return err
	}
	d := &doctor{out: c.App.Writer, json: c.Bool("json"), quiet: quiet(c), counts: map[string]int{}}

	// Transports and their devices.
	for _, p := range registry().Providers() {
		providerChecks(ctx, d, p)
	}
	// What auto (or --transport) picks.
	dev, more := transportChecks(c, d)
	for _, m := range append(more, dev) {
		if m != nil {
			defer m.Close()
		}
	}
	transport := ""
	if dev != nil {
		transport = dev.Provider()
	}
	memlockCheck(d, transport, 1+len(more), c.Int("qps"), c.Int("depth"), o.sizes["read-size"], o.sizes["chunk-size"], o.sizes["max-window"], o.sizes["window-budget"])
	if transport == iwarp.Name {
		tcpWindowCheck(d)
	}
	sysfsChecks(d, sysfsRoot)
	netdevChecks(d, netRoot)
	deviceChecks(d, dev, more, c.String("dir"))
	// The target, if one was named.
	switch {
	case o.addr == "":
		d.report("target", checkSkip, "no HOST given", "rdmacp doctor HOST[:PORT] checks a target too")
	default:
		reachCheck(ctx, d, o.addr, transport, o.contimeout)
		if dev == nil {
			d.report("session", checkSkip, "no transport to dial with", "")
		} else {
			sessionCheck(ctx, d, o.addr, dev, o.secret, o.identity, o.contimeout, o.timeout)
		}
	}
	return d.summary()
}

// tcpWindowCheck says what the host's TCP send buffers let iwarp-soft
// carry on a long path, where each data QP is a TCP connection held to
// one buffer per round trip: the setting, and what it costs.
func tcpWindowCheck(d *doctor) {
	w, qp50, s50 := initiator.TCPWindowCap(50 * time.Millisecond)
	_, qp200, s200 := initiator.TCPWindowCap(200 * time.Millisecond)
	d.report("tcp-window", checkOK, fmt.Sprintf("net.ipv4.tcp_wmem's maximum is %s: an iwarp-soft data QP carries at most %.0f MB/s at 50 ms RTT and %.0f at 200 ms, a session's 16 QPs %.0f and %.0f MB/s (raise tcp_wmem's and tcp_rmem's maxima on both hosts for a faster long link)",
		formatBytes(w), qp50/1e6, qp200/1e6, s50/1e6, s200/1e6), "")
}

// doctorOpts are doctor's argument and flags, checked.
type doctorOpts struct {
	addr                string // "": no target to check
	sizes               map[string]int64
	timeout, contimeout time.Duration
	secret              []byte
	identity            string
}

func doctorFlags(c *cli.Context) (*doctorOpts, error) {
	if c.NArg() > 1 {
		return nil, usagef("doctor wants at most one HOST[:PORT] argument")
	}
	o := &doctorOpts{sizes: map[string]int64{}}
	if c.NArg() == 1 {
		var err error
		if o.addr, err = doctorAddr(c.Args().First()); err != nil {
			return nil, usageError{err}
		}
	}
	for _, f := range []string{"read-size", "chunk-size", "max-window", "window-budget"} {
		n, err := parseSize(c.String(f))
		if err != nil || n <= 0 {
			return nil, usagef("--%s %q: want a size", f, c.String(f))
		}
		o.sizes[f] = n
	}
	var err error
	if o.timeout, err = parseDuration(c.String("timeout")); err != nil {
		return nil, usagef("--timeout %v", err)
	}
	if o.contimeout, err = parseDuration(c.String("contimeout")); err != nil {
		return nil, usagef("--contimeout %v", err)
	}
	if c.Int("qps") < 1 || c.Int("depth") < 1 {
		return nil, usagef("--qps and --depth must be at least 1")
	}
	if o.secret, err = readSecret(c); err != nil {
		return nil, err
	}
	if o.identity, err = identityOf(c); err != nil {
		return nil, err
	}
	return o, nil
}

// transportChecks reports what auto (or --transport) picks, and opens it
// and the rest of a -d list: nil where it could not.
func transportChecks(c *cli.Context, d *doctor) (verbs.Device, []verbs.Device) {
	dev, why, err := openTransport(c.Context, c)
	if err != nil {
		d.report("transport", checkFail, err.Error(), "pick one that runs here with --transport, or fix what the lines above say")
		return nil, nil
	}
	d.report("transport", checkOK, why, "")
	capsCheck(d, "caps", dev)
	if detail, ok := roce.Describe(dev); ok {
		d.report("roce-udp", checkOK, detail, "")
	}
	more, err := openMore(c, dev)
	if err != nil {
		d.report("devices", checkFail, err.Error(), "list devices that are up (ibv_devices), each once")
	}
	for i, m := range more {
		capsCheck(d, fmt.Sprintf("caps %d", i+2), m)
	}
	return dev, more
}

// deviceChecks reports what the chosen devices can do.
func deviceChecks(d *doctor, dev verbs.Device, more []verbs.Device, dir string) {
	if dev == nil {
		d.report("file-mr", checkSkip, "no transport to probe with", "")
		d.report("memory-windows", checkSkip, "no transport to ask", "")
		return
	}
	for _, m := range append([]verbs.Device{dev}, more...) {
		fileMRCheck(d, m, dir)
	}
	if dev.Caps().MemoryWindows {
		d.report("memory-windows", checkOK, "yes: the target binds a type-2 window per data QP, so keys work only on their own QP", "")
	} else {
		d.report("memory-windows", checkWarn, "no: a session's data QPs share one rkey per window (still per session)", "a device with type-2 memory windows scopes keys per QP")
	}
}

// summary prints the counts and fails the command if a check failed.
func (d *doctor) summary() error {
	if d.json {
		json.NewEncoder(d.out).Encode(doctorSummary{Type: "summary", OK: d.counts[checkOK], Warn: d.counts[checkWarn], Fail: d.counts[checkFail], Skip: d.counts[checkSkip]})
	} else if !d.quiet {
		fmt.Fprintf(d.out, "%d ok, %d warn, %d fail, %d skip\n", d.counts[checkOK], d.counts[checkWarn], d.counts[checkFail], d.counts[checkSkip])
	}
	if n := d.counts[checkFail]; n > 0 {
		// A plain error: exit status 1, whatever the failed check was.
		return fmt.Errorf("doctor: %d check(s) failed", n)
	}
	return nil
}

func providerChecks(ctx context.Context, d *doctor, p verbs.Provider) {
	name := "provider " + p.Name()
	devs, err := p.Devices(ctx)
	switch {
	case errors.Is(err, ibverbs.ErrNotBuilt):
		d.report(name, checkSkip, ibverbs.ErrNotBuilt.Error(), "build with -tags rdma (cgo, libibverbs-dev, librdmacm-dev) to use RDMA NICs")
		return
	case err != nil:
		d.report(name, checkWarn, err.Error(), "check that libibverbs can see the devices (ibv_devices)")
		return
	case len(devs) == 0:
		d.report(name, checkWarn, "no devices", "load the NIC's driver, or add a software device (rdma link add rxe0 type rxe netdev IFACE)")
		return
	}
	active := 0
	for _, dv := range devs {
		if dv.Active {
			active++
		}
	}
	if active == 0 {
		d.report(name, checkWarn, fmt.Sprintf("%d device(s), none active", len(devs)), "bring a port up: link, cable, subnet manager (InfiniBand)")
	} else {
		d.report(name, checkOK, fmt.Sprintf("%d device(s), %d active", len(devs), active), "")
	}
	for _, dv := range devs {
		st, hint, state := checkOK, "", "active"
		if !dv.Active {
			st, hint, state = checkWarn, "no usable port: check the link (ibv_devinfo)", "inactive"
		}
		d.report("device "+p.Name()+"/"+dv.Name, st, state+": "+dv.Detail, hint)
	}
}

// pinnedFigures is what rdmacp registers with the device, as the copy
// and the target compute it (initiator.PullStaging, initiator.PushPinned,
// target.SessionPinned).
type pinnedFigures struct {
	pull  int64 // a pull's staging, landing with O_DIRECT (its larger figure)
	slots int   // chunks of it
	push  int64 // a push's registered windows of its source
	tgt   target.SessionMemory
}

// pinned is what cp pulling or pushing, and a target session, register
// with doctor's flags: qps data QPs, depth READs of readSize each in
// chunks of chunk, and a target's --max-window and --window-budget (the
// rest of its configuration at serve's defaults).
func pinned(qps, depth int, readSize, chunk, maxWindow, budget int64) pinnedFigures {
	rs := int(min(readSize, chunk))
	return pinnedFigures{
		pull:  initiator.PullStaging(qps, depth, rs, chunk, math.MaxInt, true),
		slots: initiator.PullSlots(qps, depth, rs, chunk, math.MaxInt, true),
		push:  initiator.PushPinned(0, chunk),
		tgt:   target.SessionPinned(target.Config{ChunkSize: chunk, MaxWindow: uint64(maxWindow), WindowBudget: uint64(budget)}),
	}
}

// hasCapIPCLock reports whether this process may lock memory beyond
// RLIMIT_MEMLOCK (CAP_IPC_LOCK, as root usually has).
func hasCapIPCLock() bool {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return false
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "CapEff:"); ok {
			caps, err := strconv.ParseUint(strings.TrimSpace(v), 16, 64)
			return err == nil && caps&(1<<unix.CAP_IPC_LOCK) != 0
		}
	}
	return false
}

// memlockCheck judges RLIMIT_MEMLOCK against what a copy and a target
// session pin. With devs devices (a -d list), memory is registered on
// each: the same pages, but the kernel counts every registration against
// the limit, so what is pinned is counted devs times.
func memlockCheck(d *doctor, transport string, devs, qps, depth int, readSize, chunk, maxWindow, budget int64) {
	p := pinned(qps, depth, readSize, chunk, maxWindow, budget)
	pull, init, tgt := p.pull, max(p.pull, p.push), int64(min(p.tgt.Total, math.MaxInt64))
	var rl unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_MEMLOCK, &rl); err != nil {
		d.report("memlock", checkWarn, "getrlimit: "+err.Error(), "")
		return
	}
	need := fmt.Sprintf("cp pins %s pulling (%d chunks of %s: %d QPs x %d x %s READs in flight, the rest for chunks being written) and %s pushing (3 windows of its source), a target session %s (%d windows of %s, %s staging a push; the daemon at most its %s budget)",
		formatBytes(pull), p.slots, formatBytes(chunk), qps, depth, formatBytes(min(readSize, chunk)), formatBytes(p.push),
		formatBytes(tgt), p.tgt.Windows, formatBytes(int64(p.tgt.Window)), formatBytes(int64(p.tgt.Push)), formatBytes(budget))
	limit := "unlimited"
	if rl.Cur != unix.RLIM_INFINITY {
		limit = formatBytes(int64(min(rl.Cur, math.MaxInt64)))
	}
	if n := int64(devs); n > 1 {
		need += fmt.Sprintf("; each x %d devices: every device registers the same pages, and each registration counts against the limit", n)
		pull, init, tgt = pull*n, init*n, min(tgt, math.MaxInt64/n)*n
	}
	detail := "ulimit -l " + limit + "; " + need
	status, why, hint := memlockVerdict(rl.Cur, pull, init, tgt, hasCapIPCLock(), transport == iwarp.Name || transport == roce.Name)
	d.report("memlock", status, detail+why, hint)
}

// memlockVerdict judges a memlock limit of cur bytes against what a pull
// (pull), any copy (init) and a target session (tgt) pin.
func memlockVerdict(cur uint64, pull, init, tgt int64, capLock, soft bool) (status, why, hint string) {
	switch {
	case cur == unix.RLIM_INFINITY || cur >= uint64(tgt):
		return checkOK, "", ""
	case capLock:
		return checkOK, "; but this process has CAP_IPC_LOCK, so the limit does not apply", ""
	case soft:
		return checkOK, "; iwarp-soft pins nothing, so the limit does not matter to it", "raise it before using ibverbs (ulimit -l unlimited, or memlock in /etc/security/limits.conf)"
	case cur >= uint64(init):
		return checkWarn, ": enough to copy, not to serve", "raise it for serve (ulimit -l unlimited, LimitMEMLOCK=infinity in a systemd unit), or lower --max-window"
	case cur >= uint64(pull):
		return checkWarn, ": enough to pull, not to push or serve", "raise it (ulimit -l unlimited, memlock in /etc/security/limits.conf; LimitMEMLOCK=infinity in a systemd unit)"
	}
	return checkFail, ": registering memory will fail (ENOMEM)", "raise it (ulimit -l unlimited, memlock in /etc/security/limits.conf), or lower --qps, --depth, --read-size"
}

// sysfsRoot is where the kernel lists RDMA devices.
var sysfsRoot = "/sys/class/infiniband"

func readTrim(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

func sysfsChecks(d *doctor, root string) {
	ents, err := os.ReadDir(root)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			d.report("sysfs", checkSkip, root+" does not exist: the kernel has no RDMA devices", "load the NIC's RDMA driver (mlx5_ib, irdma, bnxt_re), or modprobe rdma_rxe and add a Soft-RoCE device")
		} else {
			d.report("sysfs", checkWarn, err.Error(), "")
		}
		return
	}
	if len(ents) == 0 {
		d.report("sysfs", checkWarn, root+" lists no devices", "load the NIC's RDMA driver, or add a Soft-RoCE device (rdma link add rxe0 type rxe netdev IFACE)")
		return
	}
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	sort.Strings(names)
	d.report("sysfs", checkOK, fmt.Sprintf("%s lists %s", root, strings.Join(names, ", ")), "")
	for _, dev := range names {
		ports, err := os.ReadDir(filepath.Join(root, dev, "ports"))
		if err != nil || len(ports) == 0 {
			d.report("sysfs "+dev, checkWarn, "no ports listed", "")
			continue
		}
		numa := numaOf(filepath.Join(root, dev, "device"))
		for _, p := range ports {
			portCheck(d, filepath.Join(root, dev, "ports", p.Name()), dev+"/"+p.Name(), numa)
		}
	}
}

// portCheck reports a port's state, link layer, active MTU and GIDs,
// with the RoCE v2 GID index rdmacp would pick (-x -1).
func portCheck(d *doctor, dir, name, numa string) {
	state := readTrim(filepath.Join(dir, "state")) // "4: ACTIVE"
	if _, s, ok := strings.Cut(state, ": "); ok {
		state = s
	}
	if state == "" {
		state = "unknown state"
	}
	parts := []string{state}
	ll := readTrim(filepath.Join(dir, "link_layer"))
	if ll != "" {
		parts = append(parts, ll)
	}
	if mtu := readTrim(filepath.Join(dir, "active_mtu")); mtu != "" {
		if m, _, ok := strings.Cut(mtu, " "); ok {
			mtu = m
		}
		parts = append(parts, "mtu "+mtu)
	}
	gids, _ := os.ReadDir(filepath.Join(dir, "gids"))
	n, v2, v2any := 0, -1, -1
	v2gid := ""
	idx := make([]int, 0, len(gids))
	for _, g := range gids {
		if i, err := strconv.Atoi(g.Name()); err == nil {
			idx = append(idx, i)
		}
	}
	sort.Ints(idx)
	for _, i := range idx {
		gid := readTrim(filepath.Join(dir, "gids", strconv.Itoa(i)))
		if gid == "" || strings.Trim(gid, "0:") == "" {
			continue
		}
		n++
		typ := readTrim(filepath.Join(dir, "gid_attrs", "types", strconv.Itoa(i)))
		if !strings.EqualFold(typ, "RoCE v2") {
			continue
		}
		if v2any < 0 {
			v2any = i
		}
		if v2 < 0 && strings.HasPrefix(gid, "0000:0000:0000:0000:0000:ffff:") {
			v2, v2gid = i, gid
		}
	}
	parts = append(parts, fmt.Sprintf("%d GIDs", n))
	// Link speed and NUMA node: what rails are chosen by (-d, --bind).
	if rate := readTrim(filepath.Join(dir, "rate")); rate != "" {
		parts = append(parts, "rate "+rate)
	}
	parts = append(parts, numa)
	hint := ""
	switch {
	case v2 >= 0:
		parts = append(parts, fmt.Sprintf("RoCE v2 GID index %d (%s)", v2, gidIPv4(v2gid)))
	case v2any >= 0:
		parts = append(parts, fmt.Sprintf("RoCE v2 GID index %d (no IPv4 address)", v2any))
		hint = "give the netdev an IPv4 address, or pass -x with the GID you want"
	case strings.EqualFold(ll, "Ethernet"):
		parts = append(parts, "no RoCE v2 GID")
		hint = "give the netdev an IP address (RoCE v2 GIDs follow the interface's addresses)"
	}
	st := checkOK
	if !strings.EqualFold(state, "ACTIVE") {
		st = checkWarn
		hint = "the port is not ACTIVE: check the link (ip link, ibstat) and, on InfiniBand, the subnet manager"
	}
	d.report("port "+name, st, strings.Join(parts, ", "), hint)
}

// gidIPv4 prints an IPv4-mapped GID's address.
func gidIPv4(gid string) string {
	h := strings.ReplaceAll(gid, ":", "")
	if len(h) != 32 {
		return gid
	}
	ip := make(net.IP, 16)
	for i := range 16 {
		b, err := strconv.ParseUint(h[2*i:2*i+2], 16, 8)
		if err != nil {
			return gid
		}
		ip[i] = byte(b)
	}
	return ip.String()
}

func fileMRCheck(d *doctor, dev verbs.Device, dir string) {
	pd, err := dev.AllocPD()
	if err != nil {
		d.report("file-mr", checkFail, "alloc pd: "+err.Error(), "")
		return
	}
	defer pd.Close()
	where := dir
	if where == "" {
		where = os.TempDir()
	}
	ok, err := ibverbs.ProbeFileMR(pd, dir)
	switch {
	case err != nil:
		d.report("file-mr", checkWarn, "could not probe in "+where+": "+err.Error(), "give --dir a writable directory on the exports' file system")
	case ok:
		d.report("file-mr", checkOK, "yes: read-only file mappings in "+where+" register with "+dev.Provider()+" (zero-copy windows)", "")
	default:
		d.report("file-mr", checkWarn, "no: this kernel refuses to pin read-only file mappings in "+where+" (EFAULT); the target will stage windows through bounce buffers (a pread per window, not zero-copy)",
			"a newer kernel (6.12 allows it) or another file system")
	}
	if !ok || err != nil || !dev.Caps().MemoryWindows {
		return
	}
	// The target asks for memory-window binding too, which kernels only
	// allow over writable pages; it falls back to remote-read alone.
	access := verbs.AccessRemoteRead | verbs.AccessMWBind
	if err := probeFileAccess(pd, where, access); err == nil {
		d.report("file-mr-mw", checkOK, "yes: file mappings register with "+access.String()+", as the target asks when it binds memory windows", "")
	} else if ibverbs.IsFileMRRefused(err) {
		d.report("file-mr-mw", checkOK, "no: "+access.String()+" on a file mapping is refused (EFAULT: MW_BIND pins pages for writing); the target registers such windows for remote-read alone and hands out the MR's key (still per session, zero-copy)",
			"")
	} else {
		d.report("file-mr-mw", checkWarn, "could not probe: "+err.Error(), "")
	}
}

// probeFileAccess registers a read-only shared mapping of a small file
// in dir with access, as the target does with a window.
func probeFileAccess(pd verbs.PD, dir string, access verbs.Access) error {
	f, err := os.CreateTemp(dir, ".rdmacp-doctor-*")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name())
	size := os.Getpagesize()
	_, err = f.Write(make([]byte, size))
	f.Close()
	if err != nil {
		return err
	}
	ro, err := os.Open(f.Name())
	if err != nil {
		return err
	}
	defer ro.Close()
	b, err := unix.Mmap(int(ro.Fd()), 0, size, unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		return err
	}
	defer unix.Munmap(b)
	mr, err := pd.RegMR(b, access)
	if err != nil {
		return err
	}
	return mr.Close()
}

// reachCheck connects to addr over TCP, within contimeout.
func reachCheck(ctx context.Context, d *doctor, addr, transport string, contimeout time.Duration) {
	dctx, cancel := context.WithTimeout(ctx, contimeout)
	defer cancel()
	t0 := time.Now()
	conn, err := (&net.Dialer{}).DialContext(dctx, "tcp", addr)
	if err == nil {
		conn.Close()
		d.report("tcp "+addr, checkOK, fmt.Sprintf("port open (connected in %v)", time.Since(t0).Round(time.Microsecond)), "")
		return
	}
	if transport != "" && transport != iwarp.Name {
		// rdma_cm over InfiniBand or RoCE does not listen on TCP.
		d.report("tcp "+addr, checkWarn, "no TCP listener: "+err.Error()+" (expected for "+transport+": rdma_cm ports are not TCP)", "see the session check")
		return
	}
	d.report("tcp "+addr, checkFail, err.Error(), "is rdmacp serve running there, listening on that address (--listen), with the port open in the firewall?")
}

// sessionCheck dials a session and says hello: contimeout for its
// connections and timeout for the hello and auth, which one Dial does
// together, so it is bounded by the two added.
func sessionCheck(ctx context.Context, d *doctor, addr string, dev verbs.Device, secret []byte, identity string, contimeout, timeout time.Duration) {
	dctx, cancel := context.WithTimeout(ctx, contimeout+timeout)
	defer cancel()
	t0 := time.Now()
	s, err := initiator.Dial(dctx, addr, initiator.Config{Device: dev, Secret: secret, Identity: identity, QPs: 1, Depth: 1})
	if err != nil {
		hint := "is rdmacp serve running there over the same transport?"
		switch {
		case errors.Is(err, initiator.ErrAuth):
			hint = "give both sides the same secret (--secret-file or RDMACP_SECRET), and with a keys file the --identity it belongs to"
		case dctx.Err() != nil:
			hint = "the target did not answer within --contimeout and --timeout: is it serving this transport?"
		}
		d.report("session "+addr, checkFail, err.Error(), hint)
		return
	}
	took := time.Since(t0)
	ti := s.Target()
	tr := s.Transport()
	s.Close()
	auth := "no secret asked"
	if ti.AuthRequired {
		auth = "authenticated"
	}
	d.report("session "+addr, checkOK, fmt.Sprintf("hello ok in %v: %s, protocol %d, %s; up to %d data QPs, %d READs each, windows of %s; over %s",
		took.Round(time.Microsecond), ti.Server, ti.Version, auth, ti.MaxDataQPs, ti.MaxReadsPerQP, formatBytes(int64(ti.MaxWindow)), tr), "")
}

// numaOf names the NUMA node of the PCI device at dir (sysfs's "device"
// link): a rail's NIC is best used from threads and memory on its node.
func numaOf(dir string) string {
	switch n := readTrim(filepath.Join(dir, "numa_node")); n {
	case "":
		return "numa node unknown"
	case "-1":
		return "no numa node"
	default:
		return "numa node " + n
	}
}

// netRoot is where netdevs are listed.
const netRoot = "/sys/class/net"

// netdevChecks lists each network interface that is up, with its
// addresses, link speed and NUMA node: the candidates for cp --bind
// (iwarp-soft's rails) and serve --listen.
func netdevChecks(d *doctor, root string) {
	ents, err := os.ReadDir(root)
	if err != nil {
		d.report("netdevs", checkSkip, err.Error(), "")
		return
	}
	for _, e := range ents {
		name := e.Name()
		dir := filepath.Join(root, name)
		if name == "lo" || readTrim(filepath.Join(dir, "operstate")) == "down" {
			continue
		}
		parts := []string{}
		if ifc, err := net.InterfaceByName(name); err == nil {
			addrs, _ := ifc.Addrs()
			for _, a := range addrs {
				if ipn, ok := a.(*net.IPNet); ok && !ipn.IP.IsLinkLocalUnicast() {
					parts = append(parts, ipn.IP.String())
				}
			}
		}
		if len(parts) == 0 {
			parts = append(parts, "no address")
		}
		speed := readTrim(filepath.Join(dir, "speed"))
		if v, err := strconv.Atoi(speed); err == nil && v > 0 {
			parts = append(parts, fmt.Sprintf("%d Mb/s", v))
		} else {
			parts = append(parts, "speed unknown")
		}
		parts = append(parts, numaOf(filepath.Join(dir, "device")))
		d.report("netdev "+name, checkOK, strings.Join(parts, ", "), "")
	}
}

// capsCheck reports what a device can do.
func capsCheck(d *doctor, name string, dev verbs.Device) {
	caps := dev.Caps()
	d.report(name, checkOK, fmt.Sprintf("%s %s: %d READs in flight per QP, messages up to %s, %d-entry queues",
		dev.Provider(), dev.Name(), caps.MaxReadsPerQP, formatBytes(int64(min(caps.MaxMsgSize, math.MaxInt64))), caps.MaxQPWR), "")
}
