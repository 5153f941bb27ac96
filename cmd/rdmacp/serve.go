package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/rdmacp/rdmacp/chunker"
	"github.com/rdmacp/rdmacp/target"
	"github.com/rdmacp/rdmacp/verbs"
)

func serveCommand() *cli.Command {
	return &cli.Command{
		Name:      "serve",
		Usage:     "export files and directories to initiators (the target daemon)",
		ArgsUsage: " ",
		Description: "Exports are read-only unless named with --writable, which lets initiators push files into\n" +
			"them (the daemon READs the file from the initiator). Each session gets its own keys, which die\n" +
			"with it; the daemon answers control requests and otherwise stays out of the data path. Without\n" +
			"a secret it listens on loopback only.",
		Flags: append([]cli.Flag{
			&cli.GenericFlag{Name: "listen", Value: &listenValue{}, Usage: fmt.Sprintf("address to listen on (default 127.0.0.1:%d, or :%d with a secret); repeat it for a rail per address: initiators are told them all", target.DefaultPort, target.DefaultPort)},
			&cli.StringSliceFlag{Name: "export", Aliases: []string{"e"}, Usage: "NAME=PATH: a file or directory to export (repeatable)"},
			&cli.StringSliceFlag{Name: "writable", Aliases: []string{"w"}, Usage: "NAME: let initiators push files into directory export NAME (repeatable); exports are read-only otherwise"},
			&cli.StringFlag{Name: "config", Usage: "JSON config file (see docs/guide.md, rdmacp serve, and contrib/rdmacp.json); flags override it"},
			secretFlag(),
			keysFlag(),
			&cli.StringFlag{Name: "chunk-size", Value: flagSize(target.Defaults().ChunkSize), Usage: "default bytes per verified chunk"},
			&cli.StringFlag{Name: "digest", Value: "crc32c", Usage: "default chunk digest: crc32c, blake3 or none"},
			&cli.StringFlag{Name: "max-window", Value: flagSize(target.Defaults().MaxWindow), Usage: "largest file range one window maps and registers"},
			&cli.StringFlag{Name: "window-budget", Value: flagSize(target.Defaults().WindowBudget), Usage: "bytes all sessions together may have mapped and registered; each session's share is the budget over the sessions there are (at least --min-window-share)"},
			&cli.StringFlag{Name: "min-window-share", Usage: "least share of --window-budget every session is entitled to, at most the budget over --max-sessions (default: 2 × --max-window, capped at that)"},
			&cli.StringFlag{Name: "max-digest-memory", Value: flagSize(target.Defaults().MaxDigestMemory), Usage: "bytes of chunk digests one session's open files may hold; an open over it is refused, asking for a larger --chunk-size"},
			bwlimitFlag("cap each session's READs, all its queue pairs together (told to the initiator; iwarp-soft also paces its READ responses)"),
			&cli.DurationFlag{Name: "idle-timeout", Value: target.Defaults().IdleTimeout, Usage: "end a session (revoking its keys) after this long without a request"},
			&cli.IntFlag{Name: "max-sessions", Value: target.Defaults().MaxSessions, Usage: "authenticated sessions at once; more are refused \"too many sessions\""},
			&cli.IntFlag{Name: "max-sessions-per-addr", Value: target.Defaults().MaxSessionsPerAddr, Usage: "authenticated sessions from one IP address (at most --max-sessions)"},
			&cli.IntFlag{Name: "max-handshakes", Value: target.Defaults().MaxHandshakes, Usage: "control connections accepted and not yet authenticated; more are refused at once"},
			&cli.IntFlag{Name: "max-handshakes-per-addr", Value: target.Defaults().MaxHandshakesPerAddr, Usage: "handshakes in progress from one IP address (at most --max-handshakes)"},
			&cli.DurationFlag{Name: "keep-push", Value: target.Defaults().KeepPush, Usage: "keep a push whose session was lost (its temporary file and what it verified) this long, for its initiator to resume"},
			&cli.DurationFlag{Name: "hello-timeout", Value: target.Defaults().HelloTimeout, Usage: "a connection that has not authenticated this long after it was accepted is dropped"},
			&cli.StringFlag{Name: "log-format", Value: "text", Usage: "text or json"},
			&cli.StringFlag{Name: "log-level", Value: "info", Usage: "debug, info, warn or error"},
			&cli.BoolFlag{Name: "quiet", Aliases: []string{"q"}, Usage: "log warnings and errors only (--log-level warn)"},
			metricsFlag(),
			stateDirFlag(),
			maxStateSizeFlag(),
			&cli.BoolFlag{Name: "no-persist-digests", Usage: "keep chunk digests in memory only (64 MiB of them at most, the least recently used going first): hash every file again after a restart"},
			&cli.BoolFlag{Name: "prehash", Usage: "once listening, hash every exported file not already in the state directory, in the background at low priority"},
		}, transportFlags()...),
		Action: runServe,
	}
}

// limits are the admission limits of target.Config.
type limits struct {
	MaxSessions, MaxSessionsPerAddr, MaxHandshakes, MaxHandshakesPerAddr int
	HelloTimeout                                                         time.Duration
}

// limitsOf reads the admission limits: a flag given wins, then the
// config file's key, then the flag's default. A per-address limit left
// at its default is capped by its total, so that --max-sessions 4 alone
// is valid.
func limitsOf(c *cli.Context, file serveFile) (limits, error) {
	num := func(flag string, fromFile int) (int, error) {
		v := c.Int(flag)
		if !c.IsSet(flag) && fromFile != 0 {
			v = fromFile
		}
		if v < 1 {
			return 0, usagef("--%s %d: want at least 1", flag, v)
		}
		return v, nil
	}
	var l limits
	var err error
	if l.MaxSessions, err = num("max-sessions", file.MaxSessions); err != nil {
		return l, err
	}
	if l.MaxSessionsPerAddr, err = num("max-sessions-per-addr", file.MaxSessionsPerAddr); err != nil {
		return l, err
	}
	if l.MaxHandshakes, err = num("max-handshakes", file.MaxHandshakes); err != nil {
		return l, err
	}
	if l.MaxHandshakesPerAddr, err = num("max-handshakes-per-addr", file.MaxHandshakesPerAddr); err != nil {
		return l, err
	}
	if !c.IsSet("max-sessions-per-addr") && file.MaxSessionsPerAddr == 0 {
		l.MaxSessionsPerAddr = min(l.MaxSessionsPerAddr, l.MaxSessions)
	}
	if !c.IsSet("max-handshakes-per-addr") && file.MaxHandshakesPerAddr == 0 {
		l.MaxHandshakesPerAddr = min(l.MaxHandshakesPerAddr, l.MaxHandshakes)
	}
	if l.MaxSessionsPerAddr > l.MaxSessions {
		return l, usagef("--max-sessions-per-addr %d is more than --max-sessions %d", l.MaxSessionsPerAddr, l.MaxSessions)
	}
	if l.MaxHandshakesPerAddr > l.MaxHandshakes {
		return l, usagef("--max-handshakes-per-addr %d is more than --max-handshakes %d", l.MaxHandshakesPerAddr, l.MaxHandshakes)
	}
	l.HelloTimeout = c.Duration("hello-timeout")
	if !c.IsSet("hello-timeout") && file.HelloTimeout != "" {
		if l.HelloTimeout, err = time.ParseDuration(file.HelloTimeout); err != nil {
			return l, usagef("--config: hello_timeout %q: %v", file.HelloTimeout, err)
		}
	}
	if l.HelloTimeout <= 0 {
		return l, usagef("--hello-timeout %v: want more than 0", l.HelloTimeout)
	}
	return l, nil
}

// serveFile is the --config file: a key for every flag (configKeyOf),
// which applyConfigKeys sets where the command line did not; a key given
// means what its flag does (0 or "" included).
type serveFile struct {
	Listen       stringList `json:"listen"` // one address, or a list: --listen repeated
	SecretFile   string     `json:"secret_file"`
	KeysFile     string     `json:"keys_file"` // --keys
	ChunkSize    string     `json:"chunk_size"`
	Digest       string     `json:"digest"`
	MaxWindow    string     `json:"max_window"`
	WindowBudget string     `json:"window_budget"`
	// Absent: the flag's value (min_window_share: derived, as --min-window-share).
	MinWindowShare  string `json:"min_window_share"`
	MaxDigestMemory string `json:"max_digest_memory"`
	BwLimit         string `json:"bwlimit"`      // a rate as --bwlimit's: "50M"
	IdleTimeout     string `json:"idle_timeout"` // a Go duration: "5m"
	LogFormat       string `json:"log_format"`
	LogLevel        string `json:"log_level"`
	Quiet           bool   `json:"quiet"`
	MetricsListen   string `json:"metrics_listen"`
	// Persisted digests.
	StateDir         string `json:"state_dir"`
	MaxStateSize     string `json:"max_state_size"`
	NoPersistDigests bool   `json:"no_persist_digests"`
	Prehash          bool   `json:"prehash"`
	// The transport flags.
	Transport string `json:"transport"`
	Device    string `json:"device"`
	IBPort    int    `json:"ib_port"`
	GIDIndex  int    `json:"gid_index"`
	MPACRC    string `json:"mpa_crc"`
	RocePort  int    `json:"roce_port"`
	RoceICRC  string `json:"roce_icrc"`
	RoceSetup string `json:"roce_setup"`
	IBSetup   string `json:"ibverbs_setup"`
	// Admission limits (target.Config); absent: the flag's value.
	MaxSessions          int    `json:"max_sessions"`
	MaxSessionsPerAddr   int    `json:"max_sessions_per_addr"`
	MaxHandshakes        int    `json:"max_handshakes"`
	MaxHandshakesPerAddr int    `json:"max_handshakes_per_addr"`
	HelloTimeout         string `json:"hello_timeout"` // a Go duration: "5s"
	KeepPush             string `json:"keep_push"`     // a Go duration: "2m"
	Exports              []struct {
		Name     string `json:"name"`
		Path     string `json:"path"`
		Writable bool   `json:"writable"`
	} `json:"exports"`
}

// readServeFile reads --config, if given.
func readServeFile(c *cli.Context) (serveFile, error) {
	var file serveFile
	p := c.String("config")
	if p == "" {
		return file, nil
	}
	b, err := os.ReadFile(p)
	if err != nil {
		return file, usagef("--config: %v", err)
	}
	dec := json.NewDecoder(strings.NewReader(string(b)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&file); err != nil {
		return file, usagef("--config %s: %v", p, err)
	}
	return file, nil
}

// exportsOf lists the exports of the config file and the flags.
func exportsOf(c *cli.Context, file serveFile) ([]target.Export, error) {
	var exports []target.Export
	for _, e := range file.Exports {
		exports = append(exports, target.Export{Name: e.Name, Path: e.Path, Writable: e.Writable})
	}
	for _, s := range c.StringSlice("export") {
		name, path, ok := strings.Cut(s, "=")
		if !ok || name == "" || path == "" {
			return nil, usagef("--export %q: want NAME=PATH", s)
		}
		exports = append(exports, target.Export{Name: name, Path: path})
	}
	if len(exports) == 0 {
		return nil, usagef("nothing to export: give --export NAME=PATH")
	}
	for _, name := range c.StringSlice("writable") {
		found := false
		for i := range exports {
			if exports[i].Name == name {
				exports[i].Writable, found = true, true
			}
		}
		if !found {
			return nil, usagef("--writable %q: no such export", name)
		}
	}
	return exports, nil
}

func runServe(c *cli.Context) error {
	sc, err := serveConfig(c)
	if err != nil {
		return err
	}
	log := sc.cfg.Logger
	if len(sc.secret) == 0 {
		log.Warn("no secret configured: listening on loopback only, and any local user can read the exports")
	}
	sd, err := openServe(c, sc)
	if err != nil {
		return err
	}
	cfg := sc.cfg
	cfg.Device, cfg.DataAddrs, cfg.Digests = sd.devs[0], target.DataAddrs(sd.lns), sd.store
	srv, err := target.New(cfg)
	if err != nil {
		sd.close()
		return usageError{err}
	}
	metrics, err := listenMetrics(c.String("metrics-listen"))
	if err != nil {
		sd.close()
		return err
	}
	defer closeWithin(closeTimeout, log, sd.ln.Close, func() error { closeAll(sd.devs); return nil })
	if metrics != nil {
		go serveMetrics(c.Context, metrics, srv.Registry(), log)
	}
	log.Info("serving", "addr", strings.Join(addrsOf(sd.lns), ","), "transport", sd.why, "exports", exportsText(cfg.Exports), "auth", len(sc.secret) > 0)
	go reloadOnHUP(c, srv, log)
	// digestStore gives --prehash a DirStore or an error.
	if dir, ok := sd.store.(*chunker.DirStore); ok && c.Bool("prehash") {
		max, _ := parseSize(c.String("max-state-size")) // digestStore checked it
		go prehash(c.Context, log, dir, max, cfg.Algorithm, cfg.ChunkSize, cfg.Exports)
	}
	err = srv.Serve(c.Context, sd.ln)
	log.Info("stopped")
	return err
}

// serveSetup is what serve's flags and --config say, before anything is
// opened: the target's policy, exports, keys and logger, the secret and
// where to listen.
type serveSetup struct {
	cfg     target.Config
	secret  []byte // a keys file counts as one, for the listen checks
	listens []string
}

// serveConfig reads serve's flags and --config into a serveSetup.
func serveConfig(c *cli.Context) (*serveSetup, error) {
	if c.NArg() != 0 {
		return nil, usagef("serve takes no arguments, got %q: exports are --export NAME=PATH", c.Args().First())
	}
	file, err := readServeFile(c)
	if err != nil {
		return nil, err
	}
	if err := applyConfigKeys(c); err != nil {
		return nil, err
	}
	exports, err := exportsOf(c, file)
	if err != nil {
		return nil, err
	}
	if file.SecretFile != "" && !c.IsSet("secret-file") {
		c.Set("secret-file", file.SecretFile)
	}
	if file.KeysFile != "" && !c.IsSet("keys") {
		c.Set("keys", file.KeysFile)
	}
	secret, err := serveSecret(c)
	if err != nil {
		return nil, err
	}
	keys, err := serveKeys(c, secret)
	if err != nil {
		return nil, err
	}
	if keys != nil && len(secret) == 0 {
		secret = []byte("keys") // for the listen checks below: a keys file is a secret too; Config.Keys wins
	}
	cfg, err := servePolicy(c, file)
	if err != nil {
		return nil, err
	}
	level := c.String("log-level")
	if quiet(c) && !c.IsSet("log-level") {
		level = "warn"
	}
	if cfg.Logger, err = newLogger(c.String("log-format"), level); err != nil {
		return nil, err
	}
	listens, err := serveListens(c, secret)
	if err != nil {
		return nil, err
	}
	cfg.Exports, cfg.Keys = exports, keys
	return &serveSetup{cfg: cfg, secret: secret, listens: listens}, nil
}

// serveOpened is what serve opened: its devices (the transport's first),
// their listeners, and the digest store.
type serveOpened struct {
	devs  []verbs.Device
	lns   []verbs.Listener
	ln    verbs.Listener // all of lns
	store chunker.Store
	why   string // the transport line
}

// openServe opens the transport, its further devices, the digest store
// and the listeners.
func openServe(c *cli.Context, sc *serveSetup) (*serveOpened, error) {
	dev, why, err := openTransport(c.Context, c)
	if err != nil {
		return nil, err
	}
	more, err := openMore(c, dev)
	if err != nil {
		dev.Close()
		return nil, err
	}
	store, err := digestStore(c, sc.cfg.Logger)
	if err != nil {
		closeAll(append(more, dev))
		return nil, err
	}
	lns, devs, err := serveDevices(c.Context, c, append([]verbs.Device{dev}, more...), sc.listens)
	if err != nil {
		dev.Close()
		return nil, err
	}
	if len(devs) > 1 {
		why += "; devices " + strings.Join(deviceNamesOf(devs), ",")
	}
	return &serveOpened{devs: devs, lns: lns, ln: target.Listeners(lns...), store: store, why: why}, nil
}

// close closes the listeners and the devices.
func (sd *serveOpened) close() {
	sd.ln.Close()
	closeAll(sd.devs)
}

// servePolicy reads the numbers and choices of a target.Config from the
// flags, or from the config file where a flag was not given: the chunk
// size and digest, windows, memory, rate and session limits.
func servePolicy(c *cli.Context, file serveFile) (target.Config, error) {
	pick := func(flag, fromFile string) string {
		if c.IsSet(flag) || fromFile == "" {
			return c.String(flag)
		}
		return fromFile
	}
	cs, err := parseSize(pick("chunk-size", file.ChunkSize))
	if err != nil {
		return target.Config{}, usagef("--chunk-size: %v", err)
	}
	mw, err := parseSize(pick("max-window", file.MaxWindow))
	if err != nil {
		return target.Config{}, usagef("--max-window: %v", err)
	}
	budget, err := parseSize(pick("window-budget", file.WindowBudget))
	if err != nil {
		return target.Config{}, usagef("--window-budget: %v", err)
	}
	var share int64
	if v := pick("min-window-share", file.MinWindowShare); v != "" {
		if share, err = parseSize(v); err != nil {
			return target.Config{}, usagef("--min-window-share: %v", err)
		}
		if share < 1 {
			return target.Config{}, usagef("--min-window-share %q: want at least 1 byte", v)
		}
	}
	digestMem, err := parseSize(pick("max-digest-memory", file.MaxDigestMemory))
	if err != nil {
		return target.Config{}, usagef("--max-digest-memory: %v", err)
	}
	if digestMem < 1 {
		return target.Config{}, usagef("--max-digest-memory %d: want at least 1 byte", digestMem)
	}
	bwlimit, err := parseRate(pick("bwlimit", file.BwLimit))
	if err != nil {
		return target.Config{}, usagef("--bwlimit: %v", err)
	}
	alg, err := chunker.ParseAlgorithm(pick("digest", file.Digest))
	if err != nil {
		return target.Config{}, digestError(pick("digest", file.Digest))
	}
	lim, err := limitsOf(c, file)
	if err != nil {
		return target.Config{}, err
	}
	keepPush := c.Duration("keep-push") // or --config's keep_push: applyConfigKeys
	if keepPush <= 0 {
		return target.Config{}, usagef("--keep-push %v: want more than 0", keepPush)
	}
	return target.Config{ChunkSize: cs, Algorithm: alg, KeepPush: keepPush,
		MaxWindow: uint64(mw), WindowBudget: uint64(budget), IdleTimeout: c.Duration("idle-timeout"),
		MinWindowShare: uint64(share), MaxDigestMemory: uint64(digestMem), BwLimit: bwlimit,
		DrainTimeout: drainTimeout,
		MaxSessions:  lim.MaxSessions, MaxSessionsPerAddr: lim.MaxSessionsPerAddr,
		MaxHandshakes: lim.MaxHandshakes, MaxHandshakesPerAddr: lim.MaxHandshakesPerAddr, HelloTimeout: lim.HelloTimeout}, nil
}

// serveListens is where to listen: --listen, else the default port, on
// loopback only without a secret; each address checked against that rule.
func serveListens(c *cli.Context, secret []byte) ([]string, error) {
	listens := listenAddrs(c)
	if len(listens) == 0 {
		host := "127.0.0.1"
		if len(secret) > 0 {
			host = ""
		}
		listens = []string{net.JoinHostPort(host, strconv.Itoa(target.DefaultPort))}
	}
	for _, listen := range listens {
		if err := target.CheckListen(listen, secret); err != nil {
			return nil, usageError{err}
		}
	}
	return listens, nil
}

// exportsText is the exports for the log: NAME=PATH, writable ones said so.
func exportsText(exports []target.Export) string {
	names := make([]string, len(exports))
	for i, e := range exports {
		names[i] = e.Name + "=" + e.Path
		if e.Writable {
			names[i] += " (writable)"
		}
	}
	return strings.Join(names, ",")
}

// digestStore opens the state directory where digests persist, unless
// --no-persist-digests: then they are kept in memory, for the life of the
// daemon, so that an unchanged file served again is still not hashed
// again. A state directory given (--state-dir or its key) that cannot be
// used is an error; the default one only a warning, and memory too, so
// that a daemon set up before digests persisted (a unit file without
// StateDirectory=, where /var/lib is read-only) still starts.
func digestStore(c *cli.Context, log *slog.Logger) (chunker.Store, error) {
	if c.Bool("no-persist-digests") {
		if c.Bool("prehash") {
			return nil, usagef("--prehash needs persisted digests: drop --no-persist-digests")
		}
		return chunker.NewMemStore(chunker.DefaultMemStoreMax), nil
	}
	s, err := openStateDir(c)
	var ue usageError
	switch {
	case err == nil:
		log.Debug("digests persist", "state_dir", s.Dir())
		return s, nil
	case errors.As(err, &ue), c.IsSet("state-dir"), c.Bool("prehash"):
		return nil, err
	}
	log.Warn("digests will not persist across restarts, only in memory: the default state directory is not usable; give --state-dir, or --no-persist-digests to silence this", "err", err)
	return chunker.NewMemStore(chunker.DefaultMemStoreMax), nil
}

// On SIGTERM or SIGINT the daemon exits within about two seconds
// whatever its peers do: Serve closes every session's QPs at once (about
// a second for a peer that reads nothing), then waits drainTimeout at
// most for the sessions to free their memory, then the listener and the
// device get closeTimeout.
const (
	drainTimeout = 500 * time.Millisecond
	closeTimeout = 300 * time.Millisecond
)

// closeWithin calls each close in turn, waiting d for them all: the
// process is about to exit, and a listener's Close can wait on a peer
// (iwarp's waits for connections still in their MPA handshake). What is
// left is left to the exit.
func closeWithin(d time.Duration, log *slog.Logger, closes ...func() error) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		for _, c := range closes {
			c()
		}
	}()
	select {
	case <-done:
	case <-time.After(d):
		log.Warn("exiting without waiting for the transport to close", "waited", d)
	}
}

func newLogger(format, level string) (*slog.Logger, error) {
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(level)); err != nil {
		return nil, usagef("--log-level %q: want debug, info, warn or error", level)
	}
	opts := &slog.HandlerOptions{Level: lv}
	switch format {
	case "text":
		return slog.New(slog.NewTextHandler(os.Stderr, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(os.Stderr, opts)), nil
	}
	return nil, usagef("--log-format %q: want text or json", format)
}

// reloadOnHUP re-reads the exports (--config and --export) on SIGHUP.
// Files open from an export that is gone are closed and their keys die.
func reloadOnHUP(c *cli.Context, srv *target.Server, log *slog.Logger) {
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	for {
		select {
		case <-hup:
		case <-c.Context.Done():
			return
		}
		reloadKeys(c, srv, log)
		file, err := readServeFile(c)
		var exports []target.Export
		if err == nil {
			exports, err = exportsOf(c, file)
		}
		if err == nil {
			var added, removed []string
			added, removed, err = srv.SetExports(exports)
			if err == nil {
				log.Info("exports reloaded", "added", strings.Join(added, ","), "removed", strings.Join(removed, ","))
				continue
			}
		}
		log.Error("reload failed; keeping the exports as they were", "err", err)
	}
}
