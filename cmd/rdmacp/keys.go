package main

import (
	"fmt"
	"log/slog"
	"os"

	"github.com/urfave/cli/v2"

	"github.com/rdmacp/rdmacp/protocol"
	"github.com/rdmacp/rdmacp/target"
)

// identityFlag is the initiator's --identity: the name its --secret-file
// key belongs to, on a target with a keys file.
func identityFlag() cli.Flag {
	return &cli.StringFlag{Name: "identity", EnvVars: []string{"RDMACP_IDENTITY"},
		Usage: "client name to authenticate as, with --secret-file as its key, to a target with --keys (or set RDMACP_IDENTITY; default: \"default\")"}
}

// identityOf is --identity, checked.
func identityOf(c *cli.Context) (string, error) {
	id := c.String("identity")
	if id != "" && !protocol.ValidIdentity(id) {
		return "", usagef("--identity %q: use 1 to %d letters, digits, '.', '_', '-' or '@'", id, protocol.MaxIdentity)
	}
	return id, nil
}

// keysFlag is serve's --keys.
func keysFlag() cli.Flag {
	return &cli.StringFlag{Name: "keys", Usage: "keys file: each client's name, key and rights per export, and exports' allowed hosts (see docs/guide.md, Clients, keys and rights); instead of --secret-file. SIGHUP reloads it"}
}

// serveKeys reads the keys the target authenticates against: --keys (or
// the config's keys_file), or the one --secret-file identity; nil: no
// secret at all. A keys file and a secret are not given together: which
// one would "default" be?
func serveKeys(c *cli.Context, secret []byte) (*target.Keys, error) {
	p := c.String("keys")
	if p == "" {
		if len(secret) == 0 {
			return nil, nil
		}
		return target.SingleKey(secret), nil
	}
	if len(secret) > 0 {
		return nil, usagef("give --keys or --secret-file (RDMACP_SECRET), not both: a keys file names each client's key (a client named default serves initiators without --identity)")
	}
	if err := privateFile("keys file", p); err != nil {
		return nil, usageError{err}
	}
	k, err := target.LoadKeys(p)
	if err != nil {
		return nil, usageError{err}
	}
	return k, nil
}

// privateFile refuses a file of secrets (what names it: "keys file",
// "--secret-file") that users other than its owner may read or write,
// as rsync's strict modes refuse such a secrets file: its keys would be
// anyone's, or anyone's to change. The one check for both.
func privateFile(what, p string) error {
	fi, err := os.Stat(p)
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	if m := fi.Mode().Perm(); m&0o066 != 0 {
		return fmt.Errorf("%s %s is open to other users (mode %04o) and holds a secret key: chmod 600 %s", what, p, m, p)
	}
	return nil
}

// serveSecret is readSecret for serve, checked as a keys file's keys
// are: a --secret-file only its owner may read and write, a secret (its
// file's or $RDMACP_SECRET's) at least target.MinKeyLen bytes.
func serveSecret(c *cli.Context) ([]byte, error) {
	f := c.String("secret-file")
	if f != "" {
		if err := privateFile("--secret-file", f); err != nil {
			return nil, usageError{err}
		}
	}
	secret, err := readSecret(c)
	if err != nil || secret == nil || len(secret) >= target.MinKeyLen {
		return secret, err
	}
	if f != "" {
		return nil, usagef("--secret-file %s holds a secret of %d bytes, shorter than %d: make one with: openssl rand -base64 32 > %s && chmod 600 %s", f, len(secret), target.MinKeyLen, f, f)
	}
	return nil, usagef("RDMACP_SECRET holds a secret of %d bytes, shorter than %d: make one with: openssl rand -base64 32", len(secret), target.MinKeyLen)
}

// reloadKeys re-reads the keys file, or the secret, on SIGHUP; the
// sessions of a client revoked, rekeyed or given fewer rights end.
// A file with a mistake leaves the keys as they were.
func reloadKeys(c *cli.Context, srv *target.Server, log *slog.Logger) {
	if c.String("keys") == "" && c.String("secret-file") == "" {
		return // no keys file, and a secret from the environment (or none) can't change
	}
	secret, err := serveSecret(c)
	var keys *target.Keys
	if err == nil {
		keys, err = serveKeys(c, secret)
	}
	if err == nil && keys == nil {
		err = fmt.Errorf("no secret any more: keeping the old one (a daemon listening beyond loopback needs one)")
	}
	if err != nil {
		log.Error("keys reload failed; keeping the keys as they were", "err", err)
		return
	}
	ended := srv.SetKeys(keys)
	log.Info("keys reloaded", "clients", len(keys.Names()), "sessions_ended", ended)
}
