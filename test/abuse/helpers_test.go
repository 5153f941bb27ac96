package abuse

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rdmacp/rdmacp/protocol"
)

// The binary under test, built once for all the tests (or RDMACP_BIN).
var (
	buildOnce sync.Once
	buildDir  string
	builtBin  string
	buildErr  error
)

func TestMain(m *testing.M) {
	code := m.Run()
	if buildDir != "" {
		os.RemoveAll(buildDir)
	}
	os.Exit(code)
}

// gate skips the test unless RDMACP_ABUSE=1 and /proc can be read.
func gate(t *testing.T, what string) {
	t.Helper()
	if os.Getenv("RDMACP_ABUSE") != "1" {
		t.Skipf("SKIP: the abuse suite runs %s; run it with RDMACP_ABUSE=1 go test -v -count=1 ./test/abuse/ (or test/abuse/run.sh)", what)
	}
	if _, err := os.Stat("/proc/self/status"); err != nil {
		t.Skip("SKIP: no /proc: the daemon's RSS and descriptors can't be measured")
	}
}

// needSources skips the test unless 127.0.0.first .. 127.0.0.(first+n-1)
// can be bound as source addresses.
func needSources(t *testing.T, first, n int) {
	t.Helper()
	for i := first; i < first+n; i++ {
		c, err := net.Listen("tcp", fmt.Sprintf("127.0.0.%d:0", i))
		if err != nil {
			t.Skipf("SKIP: can't use 127.0.0.%d as a source address: %v", i, err)
		}
		c.Close()
	}
}

func rdmacpBin(t *testing.T) string {
	t.Helper()
	if bin := os.Getenv("RDMACP_BIN"); bin != "" {
		return bin
	}
	buildOnce.Do(func() {
		if buildDir, buildErr = os.MkdirTemp("", "rdmacp-abuse-"); buildErr != nil {
			return
		}
		builtBin = filepath.Join(buildDir, "rdmacp")
		if out, err := exec.Command("go", "build", "-o", builtBin, "github.com/rdmacp/rdmacp/cmd/rdmacp").CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("go build ./cmd/rdmacp: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return builtBin
}

// cpRun is what one `rdmacp cp --json` process did.
type cpRun struct {
	code   int // exit status; -1 if it was killed
	stdout string
	stderr string
	lines  []map[string]any // stdout's JSON lines
	took   time.Duration
}

// runCp runs `rdmacp cp ARGS`, killed after limit.
func runCp(t *testing.T, bin string, limit time.Duration, args ...string) cpRun {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, append([]string{"cp"}, args...)...)
	var so, se bytes.Buffer
	cmd.Stdout, cmd.Stderr = &so, &se
	t0 := time.Now()
	err := cmd.Run()
	r := cpRun{stdout: so.String(), stderr: se.String(), took: time.Since(t0)}
	var ee *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &ee):
		r.code = ee.ExitCode()
	default:
		t.Fatalf("rdmacp cp %s: %v", strings.Join(args, " "), err)
	}
	r.lines = jsonLines(r.stdout)
	return r
}

func jsonLines(s string) []map[string]any {
	var out []map[string]any
	sc := bufio.NewScanner(strings.NewReader(s))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		var m map[string]any
		if json.Unmarshal(sc.Bytes(), &m) == nil {
			out = append(out, m)
		}
	}
	return out
}

// errorText is the error a cp reported: its JSON error line, else stderr.
func (r cpRun) errorText() string {
	for _, l := range r.lines {
		if l["message_type"] == "error" {
			s, _ := l["error"].(string)
			return s
		}
	}
	return strings.TrimSpace(r.stderr)
}

// ofType is the JSON lines whose message_type is typ.
func (r cpRun) ofType(typ string) []map[string]any {
	var out []map[string]any
	for _, l := range r.lines {
		if l["message_type"] == typ {
			out = append(out, l)
		}
	}
	return out
}

// printTable prints a table of figures, columns as wide as their widest
// cell, under a title line.
func printTable(title string, header []string, rows [][]string) {
	w := make([]int, len(header))
	for i, h := range header {
		w[i] = len(h)
	}
	for _, r := range rows {
		for i, c := range r {
			w[i] = max(w[i], len(c))
		}
	}
	line := func(cells []string) {
		var b strings.Builder
		for i, c := range cells {
			if i == len(cells)-1 {
				b.WriteString(c)
			} else {
				fmt.Fprintf(&b, "%-*s ", w[i], c)
			}
		}
		fmt.Println(strings.TrimRight(b.String(), " "))
	}
	fmt.Printf("\nabuse: %s\n", title)
	line(header)
	for _, r := range rows {
		line(r)
	}
	fmt.Println()
}

// writeRandom writes size random bytes (from seed) to path and returns
// their SHA-256.
func writeRandom(t *testing.T, path string, size int64, seed byte) [32]byte {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	h := sha256.New()
	r := rand.NewChaCha8([32]byte{'a', 'b', 'u', 's', 'e', seed})
	buf := make([]byte, 4<<20)
	for left := size; left > 0; {
		b := buf[:min(int64(len(buf)), left)]
		r.Read(b)
		h.Write(b)
		if _, err := f.Write(b); err != nil {
			t.Fatal(err)
		}
		left -= int64(len(b))
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	return [32]byte(h.Sum(nil))
}

// fileSum is the SHA-256 of a file's bytes.
func fileSum(path string) ([32]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return [32]byte{}, err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return [32]byte{}, err
	}
	return [32]byte(h.Sum(nil)), nil
}

// exists reports whether path names anything (a dangling symlink too).
func exists(path string) bool {
	_, err := os.Lstat(path)
	return err == nil
}

// dirNames lists a directory's entries, "" if it is empty or missing.
func dirNames(dir string) string {
	des, _ := os.ReadDir(dir)
	var n []string
	for _, de := range des {
		n = append(n, de.Name())
	}
	return strings.Join(n, ",")
}

// mpaRequest is an MPA request frame (rev 1, no markers) carrying the
// control connection's private data.
func mpaRequest() []byte {
	priv, err := protocol.MarshalPrivate(protocol.ControlData())
	if err != nil {
		panic(err)
	}
	req := append([]byte("MPA ID Req Frame"), 0, 1, 0, 0)
	binary.BigEndian.PutUint16(req[18:], uint16(len(priv)))
	return append(req, priv...)
}

// mpaExchange sends req on c and reads the target's reply: accepted (a
// control QP the target now waits on for Hello), or refused and why.
func mpaExchange(c net.Conn, req []byte) (accepted bool, why string, err error) {
	var hdr [20]byte
	if _, err = c.Write(req); err != nil {
		return false, "", err
	}
	if _, err = io.ReadFull(c, hdr[:]); err != nil {
		return false, "", err
	}
	if string(hdr[:16]) != "MPA ID Rep Frame" {
		return false, "", fmt.Errorf("not an MPA reply: %q", hdr[:16])
	}
	pd := make([]byte, binary.BigEndian.Uint16(hdr[18:]))
	if _, err = io.ReadFull(c, pd); err != nil {
		return false, "", err
	}
	if hdr[16]&0x20 != 0 {
		return false, string(pd), nil
	}
	return true, "", nil
}

// msgs is the daemon's JSON log lines from the n-th on (0: all).
func (d *daemon) msgs(n int) []map[string]any {
	all := jsonLines(d.log.String())
	if n > len(all) {
		return nil
	}
	return all[n:]
}

// waitFDs polls the daemon's descriptors until they are at most base or
// limit has passed; it returns the last count and when it got there.
func (d *daemon) waitFDs(base int, limit time.Duration) (int, time.Duration) {
	t0 := time.Now()
	for {
		n := fds(d.cmd.Process.Pid)
		if n <= base || time.Since(t0) > limit {
			return n, time.Since(t0)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

func clip(s string, n int) string {
	s = strings.ReplaceAll(s, "\n", " ")
	if len(s) > n {
		return s[:n-3] + "..."
	}
	return s
}
