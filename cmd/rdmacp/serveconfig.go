package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"
	"syscall"

	"github.com/urfave/cli/v2"
)

// Config parity: every serve flag has a --config key, the flag's long
// name with '_' for '-' (configKeyOf), applied to the flag when the
// command line did not give it (applyConfigKeys), so that each key means
// exactly what its flag does. A test lists the flags of serveCommand and
// fails for one without a key.

// flagOfKey maps the keys whose name is not their flag's.
var flagOfKey = map[string]string{"keys_file": "keys"}

// notKeys are the serve flags without a key of their own: --config
// names the file, and the exports are its "exports" list.
var notKeys = map[string]string{"config": "", "export": "exports", "writable": "exports"}

// configKeyOf is flag's key ("" for --config).
func configKeyOf(flag string) string {
	if k, ok := notKeys[flag]; ok {
		return k
	}
	for k, f := range flagOfKey {
		if f == flag {
			return k
		}
	}
	return strings.ReplaceAll(flag, "-", "_")
}

// applyConfigKeys sets, from --config, every flag the command line did
// not give. readServeFile has checked the keys.
func applyConfigKeys(c *cli.Context) error {
	p := c.String("config")
	if p == "" {
		return nil
	}
	b, err := os.ReadFile(p)
	if err != nil {
		return usagef("--config: %v", err)
	}
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(b, &raw); err != nil {
		return usagef("--config %s: %v", p, err)
	}
	keys := make([]string, 0, len(raw))
	for k := range raw {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		if k == "exports" {
			continue
		}
		flag := flagOfKey[k]
		if flag == "" {
			flag = strings.ReplaceAll(k, "_", "-")
		}
		if c.IsSet(flag) {
			continue // the command line wins
		}
		v, err := scalar(raw[k])
		if err != nil {
			return usagef("--config %s: %s: %v", p, k, err)
		}
		if err := c.Set(flag, v); err != nil {
			return usagef("--config %s: %s %s: %v", p, k, v, err)
		}
	}
	return nil
}

// scalar is a JSON string, number or boolean as a flag's value.
func scalar(m json.RawMessage) (string, error) {
	var v any
	if err := json.Unmarshal(m, &v); err != nil {
		return "", err
	}
	switch v := v.(type) {
	case string:
		return v, nil
	case float64:
		return strconv.FormatFloat(v, 'f', -1, 64), nil
	case bool:
		return strconv.FormatBool(v), nil
	case []any: // a list key (listen): its flag is repeatable, and takes commas
		parts := make([]string, len(v))
		for i, e := range v {
			str, ok := e.(string)
			if !ok {
				return "", fmt.Errorf("want a list of strings, got %s", m)
			}
			parts[i] = str
		}
		return strings.Join(parts, ","), nil
	}
	return "", fmt.Errorf("want a string, a number or true/false, got %s", m)
}

// errBind is a listen that failed for want of the address: in use, or
// not this host's. It has its own exit code (exitBind): a port taken by
// another daemon is an operator's problem, not the transport's.
var errBind = errors.New("cannot listen")

// bindError is errBind for addr, saying what to do.
type bindError struct {
	addr string
	err  error
}

func (e *bindError) Error() string {
	hint := ""
	switch {
	case errors.Is(e.err, syscall.EADDRINUSE):
		hint = ": address already in use (another rdmacp serve?)"
	case errors.Is(e.err, syscall.EADDRNOTAVAIL):
		hint = ": address not available (not an address of this host)"
	case errors.Is(e.err, syscall.EACCES):
		hint = ": permission denied (a port below 1024 needs CAP_NET_BIND_SERVICE)"
	default:
		hint = ": " + e.err.Error()
	}
	return "cannot listen on " + e.addr + hint
}

func (e *bindError) Unwrap() []error { return []error{errBind, e.err} }

// listenError classifies a listener's error: the address's (bindError),
// or the transport's.
func listenError(addr string, err error) error {
	for _, errno := range []error{syscall.EADDRINUSE, syscall.EADDRNOTAVAIL, syscall.EACCES} {
		if errors.Is(err, errno) {
			return &bindError{addr: addr, err: err}
		}
	}
	return fmt.Errorf("%w: %w", errTransport, err)
}
