package roce

// An external check of the wire format: capture a real session on the
// loopback interface and have Wireshark's InfiniBand dissector (RoCEv2,
// "infiniband" over UDP) decode it, with no malformed packet; then check
// each packet's ICRC from the captured bytes, with the IP and UDP headers
// the kernel really wrote (Wireshark 4.0 shows the ICRC, not whether it
// is right).
//
//	go test ./verbs/roce -run TestTsharkDecodes -v
//
// It needs tshark and dumpcap and the right to capture on lo (root, or
// CAP_NET_RAW+CAP_NET_ADMIN on dumpcap); it skips otherwise.

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"hash/crc32"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/rdmacp/rdmacp/verbs"
	"github.com/rdmacp/rdmacp/verbs/verbstest"
)

func TestTsharkDecodes(t *testing.T) {
	tshark, err := exec.LookPath("tshark")
	if err != nil {
		t.Skip("tshark not installed: apt-get install tshark")
	}
	dumpcap, err := exec.LookPath("dumpcap")
	if err != nil {
		t.Skip("dumpcap not installed: apt-get install tshark")
	}
	e := verbstest.Open(t, verbstest.Config{Provider: New(Config{Port: -1})})
	port := e.Dev.(*device).port
	pcap := filepath.Join(t.TempDir(), "roce.pcapng")
	if d := os.Getenv("ROCE_PCAP_DIR"); d != "" {
		pcap = filepath.Join(d, "roce.pcapng")
	}

	cmd := exec.Command(dumpcap, "-i", "lo", "-B", "32", "-f", fmt.Sprintf("udp port %d", port), "-w", pcap)
	pr, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = pw
	if err := cmd.Start(); err != nil {
		t.Skipf("cannot start dumpcap: %v", err)
	}
	pw.Close()
	ready := make(chan bool, 1)
	var msgs bytes.Buffer
	go func() {
		sc := bufio.NewScanner(pr)
		for sc.Scan() {
			msgs.WriteString(sc.Text() + "\n")
			if strings.Contains(sc.Text(), "Capturing on") {
				ready <- true
			}
		}
		ready <- false
	}()
	select {
	case ok := <-ready:
		if !ok {
			cmd.Wait()
			t.Skipf("dumpcap cannot capture on lo: %s", msgs.String())
		}
	case <-time.After(20 * time.Second):
		cmd.Process.Kill()
		cmd.Wait()
		t.Fatal("dumpcap did not start capturing in 20 s")
	}

	time.Sleep(500 * time.Millisecond) // "Capturing on" comes a little before the filter is in place

	// A session: READs of one, several and a partial packet, SENDs both ways.
	p := e.NewPair(t)
	src := e.Region(t, p.Accept.PD, 16<<10, verbs.AccessRemoteRead|verbs.AccessLocalWrite)
	sink := e.Region(t, p.Dial.PD, 16<<10, verbs.AccessLocalWrite)
	verbstest.FillRandom(src.B, 1)
	verbstest.PostSend(t, p.DialQP, sink.Read(1, 0, src, 0, 100), sink.Read(2, 100, src, 100, 5000), sink.Read(3, 0, src, 0, 0))
	e.Wait(t, p.Dial.SendCQ, 3)
	verbstest.PostRecv(t, p.AcceptQP, verbs.RecvWR{ID: 1, Local: src.SGE(8192, 4096)})
	verbstest.PostRecv(t, p.DialQP, verbs.RecvWR{ID: 1, Local: sink.SGE(8192, 4096)})
	verbstest.PostSend(t, p.DialQP, verbs.SendWR{ID: 4, Op: verbs.OpSend, Local: sink.SGE(0, 3000)})
	verbstest.PostSend(t, p.AcceptQP, verbs.SendWR{ID: 5, Op: verbs.OpSend, Local: src.SGE(0, 7)})
	e.Wait(t, p.Accept.RecvCQ, 1)
	e.Wait(t, p.Dial.RecvCQ, 1)
	e.Wait(t, p.Dial.SendCQ, 1)
	e.Wait(t, p.Accept.SendCQ, 1)
	time.Sleep(300 * time.Millisecond) // let dumpcap write the last packets
	cmd.Process.Signal(syscall.SIGINT)
	cmd.Wait()

	ops, _ := tsharkCheck(t, tshark, pcap, port, 10)
	for _, op := range []string{"4", "12", "13", "14", "15", "16", "17"} { // send only, read req/resp first/middle/last/only, ack
		if ops[op] == 0 {
			t.Errorf("no packet of opcode %s in the capture", op)
		}
	}
}

// TestTsharkPcap runs the same checks on a capture made elsewhere:
// ROCE_PCAP names it (RoCEv2 on UDP 4791, or ROCE_PCAP_PORT). The rxe
// guest (test/rxe/roce-interop.sh) captures a session between the
// kernel's rxe and roce-soft and checks it with this; rxe's packets carry
// a non-zero IP ID, roce-soft's ID 0, and both must check;
// ROCE_PCAP_KERNEL_PEER=1 requires packets of both kinds.
func TestTsharkPcap(t *testing.T) {
	pcap := os.Getenv("ROCE_PCAP")
	if pcap == "" {
		t.Skip("ROCE_PCAP not set")
	}
	tshark, err := exec.LookPath("tshark")
	if err != nil {
		t.Skip("tshark not installed: apt-get install tshark")
	}
	port := uint16(UDPPort)
	if p := os.Getenv("ROCE_PCAP_PORT"); p != "" {
		fmt.Sscan(p, &port)
	}
	_, ids := tsharkCheck(t, tshark, pcap, port, 1)
	// With a kernel peer, both kinds must be there: else the capture
	// missed one direction and the check proves less than it says.
	if os.Getenv("ROCE_PCAP_KERNEL_PEER") == "1" && (ids[false] == 0 || ids[true] == 0) {
		t.Errorf("ROCE_PCAP_KERNEL_PEER: %d packets with IP ID 0 (roce-soft's), %d with another (the kernel's); want both", ids[false], ids[true])
	}
}

// tsharkCheck has tshark decode pcap (RoCEv2 on UDP port) and checks
// that no packet is malformed, every packet is dissected as InfiniBand,
// there are at least min of them, and each one's ICRC checks against its
// captured headers. It returns the count of packets by BTH opcode, and by
// whether their IP ID is non-zero.
func tsharkCheck(t *testing.T, tshark, pcap string, port uint16, min int) (map[string]int, map[bool]int) {
	t.Helper()
	// The payloads are random bytes; RPC-over-RDMA's heuristic would
	// take some for its own and call them malformed.
	args := []string{"-r", pcap, "-o", fmt.Sprintf("infiniband.rroce.port:%d", port), "--disable-protocol", "rpcordma"}
	bad, err := exec.Command(tshark, append(args, "-Y", "_ws.malformed || _ws.expert.severity >= 8388608", "-T", "fields", "-e", "frame.number")...).Output()
	if err != nil {
		t.Fatalf("tshark: %v", err)
	}
	if s := strings.TrimSpace(string(bad)); s != "" {
		t.Errorf("malformed packets or expert errors in frames: %s", strings.ReplaceAll(s, "\n", " "))
	}
	out, err := exec.Command(tshark, append(args, "-T", "json", "-x")...).Output()
	if err != nil {
		t.Fatalf("tshark: %v", err)
	}
	var frames []struct {
		Source struct {
			Layers map[string]json.RawMessage `json:"layers"`
		} `json:"_source"`
	}
	if err := json.Unmarshal(out, &frames); err != nil {
		t.Fatalf("tshark json: %v", err)
	}
	if len(frames) < min {
		t.Fatalf("captured %d packets, want at least %d", len(frames), min)
	}
	ops := map[string]int{}
	ids := map[bool]int{} // by IP ID non-zero
	for i, f := range frames {
		l := f.Source.Layers
		if _, ok := l["infiniband"]; !ok {
			t.Errorf("frame %d: not dissected as InfiniBand: layers %v", i+1, keys(l))
			continue
		}
		var ib struct {
			BTH map[string]any `json:"infiniband.bth_tree"`
		}
		json.Unmarshal(l["infiniband"], &ib)
		ops[fmt.Sprint(ib.BTH["infiniband.bth.opcode"])]++
		var raw []any
		json.Unmarshal(l["frame_raw"], &raw)
		if len(raw) == 0 {
			t.Fatalf("frame %d: no raw bytes", i+1)
		}
		b, _ := hex.DecodeString(fmt.Sprint(raw[0]))
		if len(b) >= 20 {
			ids[binary.BigEndian.Uint16(b[18:]) != 0]++
		}
		if err := checkCapturedICRC(b); err != nil {
			t.Errorf("frame %d: %v", i+1, err)
		}
	}
	t.Logf("%d packets (IP ID 0: %d, non-zero: %d), by BTH opcode: %v", len(frames), ids[false], ids[true], ops)
	return ops, ids
}

func keys(m map[string]json.RawMessage) []string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	return ks
}

// checkCapturedICRC recomputes the ICRC of an Ethernet frame as captured,
// from its real IPv4 and UDP headers, masked as IBTA annex A17 says (and
// rxe_icrc.c does), written apart from icrc() so that it checks it.
func checkCapturedICRC(f []byte) error {
	if len(f) < 14+20+8+12+4 || binary.BigEndian.Uint16(f[12:]) != 0x0800 {
		return fmt.Errorf("not an IPv4 frame")
	}
	ip := f[14:]
	ihl := int(ip[0]&0x0f) * 4
	total := int(binary.BigEndian.Uint16(ip[2:]))
	if ihl != 20 || total > len(ip) {
		return fmt.Errorf("IP header length %d, total %d of %d", ihl, total, len(ip))
	}
	pkt := ip[:total]
	masked := append([]byte(nil), pkt...)
	masked[1] = 0xff                        // TOS
	masked[8] = 0xff                        // TTL
	masked[10], masked[11] = 0xff, 0xff     // IP checksum
	masked[20+6], masked[20+7] = 0xff, 0xff // UDP checksum
	masked[28+4] = 0xff                     // BTH FECN, BECN, resv6
	body := append(bytes.Repeat([]byte{0xff}, 8), masked[:len(masked)-4]...)
	want := crc32.ChecksumIEEE(body)
	got := binary.LittleEndian.Uint32(pkt[len(pkt)-4:])
	if got != want {
		return fmt.Errorf("ICRC %#08x, computed from the captured headers %#08x (IP ID %#x, flags %#x)", got, want, binary.BigEndian.Uint16(ip[4:]), ip[6]>>5)
	}
	return nil
}
