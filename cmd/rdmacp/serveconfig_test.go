package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/urfave/cli/v2"

	"github.com/rdmacp/rdmacp/target"
)

// serveTestValues is, for every serve flag, a value other than its
// default: on the command line, and as its config key's JSON.
var serveTestValues = map[string]struct{ flag, json string }{
	"listen":                  {"127.0.0.1:7399", `"127.0.0.1:7399"`},
	"secret-file":             {"/etc/rdmacp/secret", `"/etc/rdmacp/secret"`},
	"keys":                    {"/etc/rdmacp/keys", `"/etc/rdmacp/keys"`},
	"chunk-size":              {"1MiB", `"1MiB"`},
	"digest":                  {"blake3", `"blake3"`},
	"max-window":              {"16MiB", `"16MiB"`},
	"bwlimit":                 {"50M", `"50M"`},
	"window-budget":           {"2GiB", `"2GiB"`},
	"min-window-share":        {"8MiB", `"8MiB"`},
	"max-digest-memory":       {"32MiB", `"32MiB"`},
	"idle-timeout":            {"7m0s", `"7m"`},
	"max-sessions":            {"9", `9`},
	"max-sessions-per-addr":   {"3", `3`},
	"max-handshakes":          {"11", `11`},
	"max-handshakes-per-addr": {"4", `4`},
	"hello-timeout":           {"3s", `"3s"`},
	"keep-push":               {"90s", `"90s"`},
	"log-format":              {"json", `"json"`},
	"log-level":               {"debug", `"debug"`},
	"quiet":                   {"true", `true`},
	"metrics-listen":          {"127.0.0.1:9399", `"127.0.0.1:9399"`},
	"state-dir":               {"/var/lib/rdmacp-test", `"/var/lib/rdmacp-test"`},
	"max-state-size":          {"1GiB", `"1GiB"`},
	"no-persist-digests":      {"true", `true`},
	"prehash":                 {"true", `true`},
	"transport":               {"iwarp-soft", `"iwarp-soft"`},
	"device":                  {"mlx5_1", `"mlx5_1"`},
	"ib-port":                 {"2", `2`},
	"gid-index":               {"3", `3`},
	"mpa-crc":                 {"on", `"on"`},
	"roce-port":               {"4792", `4792`},
	"roce-icrc":               {"off", `"off"`},
	"ibverbs-setup":           {"oob", `"oob"`},
	"roce-setup":              {"cm", `"cm"`},
}

// resolvedFlags runs serve's flag parsing and config (readServeFile,
// applyConfigKeys, exportsOf) on args and returns every flag's value.
func resolvedFlags(t *testing.T, args ...string) (map[string]string, []target.Export) {
	t.Helper()
	cmd := serveCommand()
	vals := map[string]string{}
	var exports []target.Export
	cmd.Action = func(c *cli.Context) error {
		file, err := readServeFile(c)
		if err != nil {
			return err
		}
		if err := applyConfigKeys(c); err != nil {
			return err
		}
		if exports, err = exportsOf(c, file); err != nil {
			return err
		}
		for _, f := range cmd.Flags {
			n := f.Names()[0]
			vals[n] = fmt.Sprint(c.Value(n))
		}
		return nil
	}
	app := &cli.App{Commands: []*cli.Command{cmd}, ExitErrHandler: func(*cli.Context, error) {}}
	if err := app.Run(append([]string{"rdmacp", "serve"}, args...)); err != nil {
		t.Fatalf("serve %v: %v", args, err)
	}
	return vals, exports
}

// jsonKeys are serveFile's keys.
func jsonKeys() map[string]bool {
	keys := map[string]bool{}
	ty := reflect.TypeFor[serveFile]()
	for i := range ty.NumField() {
		k, _, _ := strings.Cut(ty.Field(i).Tag.Get("json"), ",")
		keys[k] = true
	}
	return keys
}

// TestEveryServeFlagHasAConfigKey lists serve's flags: each must have a
// config key that means what the flag does. A flag added without one
// fails here.
func TestEveryServeFlagHasAConfigKey(t *testing.T) {
	dir := t.TempDir()
	keys := jsonKeys()
	defaults, _ := resolvedFlags(t, "--export", "d="+dir)
	for _, f := range serveCommand().Flags {
		name := f.Names()[0]
		key := configKeyOf(name)
		if _, special := notKeys[name]; special {
			if key != "" && !keys[key] {
				t.Errorf("--%s: config key %q is not in serveFile", name, key)
			}
			continue
		}
		if !keys[key] {
			t.Errorf("--%s has no config key: add %q to serveFile (and to the README's serve table)", name, key)
			continue
		}
		v, ok := serveTestValues[name]
		if !ok {
			t.Errorf("--%s: add a test value to serveTestValues", name)
			continue
		}
		byFlag, _ := resolvedFlags(t, "--export", "d="+dir, "--"+name, v.flag)
		cfg := filepath.Join(t.TempDir(), "c.json")
		if err := os.WriteFile(cfg, []byte(`{"`+key+`": `+v.json+`}`), 0o644); err != nil {
			t.Fatal(err)
		}
		byKey, _ := resolvedFlags(t, "--export", "d="+dir, "--config", cfg)
		if byFlag[name] == defaults[name] {
			t.Errorf("--%s %s: the test value is the default (%s): pick another", name, v.flag, defaults[name])
		}
		if byKey[name] != byFlag[name] {
			t.Errorf("config %q: %s gives %s, --%s %s gives %s", key, v.json, byKey[name], name, v.flag, byFlag[name])
		}
		// The command line wins over the file.
		over, _ := resolvedFlags(t, "--export", "d="+dir, "--config", cfg, "--"+name, defaults[name])
		if _, isBool := f.(*cli.BoolFlag); !isBool && over[name] != defaults[name] {
			t.Errorf("--%s %s with config %q: %s, want the flag's", name, defaults[name], key, over[name])
		}
	}
}

func TestConfigExportsRoundTrip(t *testing.T) {
	dir, file := t.TempDir(), filepath.Join(t.TempDir(), "f")
	os.WriteFile(file, nil, 0o644)
	_, byFlags := resolvedFlags(t, "--export", "w="+dir, "--export", "f="+file, "--writable", "w")
	b, _ := json.Marshal(map[string]any{"exports": []map[string]any{
		{"name": "w", "path": dir, "writable": true}, {"name": "f", "path": file}}})
	cfg := filepath.Join(t.TempDir(), "c.json")
	os.WriteFile(cfg, b, 0o644)
	_, byKey := resolvedFlags(t, "--config", cfg)
	if !reflect.DeepEqual(byFlags, byKey) || len(byKey) != 2 {
		t.Errorf("exports: by flags %v, by config %v", byFlags, byKey)
	}
}
