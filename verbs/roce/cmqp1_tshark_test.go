package roce

// An external check of the CM codec: the MADs this provider sends, as
// RoCEv2 UD packets in a pcap, decoded by Wireshark's InfiniBand
// dissector (which knows the CM messages and rdma_cm's IP header): no
// malformed packet, every ICRC right, and every REQ field as meant.
//
//	go test ./verbs/roce -run TestTsharkCM -v

import (
	"encoding/binary"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/rdmacp/rdmacp/verbs/roce/rdmacm"
)

// writePcap writes IPv4/UDP frames (Ethernet link type) to a pcap file.
func writePcap(t *testing.T, path string, frames [][]byte) {
	t.Helper()
	b := binary.LittleEndian.AppendUint32(nil, 0xa1b2c3d4)
	b = binary.LittleEndian.AppendUint16(b, 2)
	b = binary.LittleEndian.AppendUint16(b, 4)
	b = append(b, make([]byte, 8)...) // thiszone, sigfigs
	b = binary.LittleEndian.AppendUint32(b, 65535)
	b = binary.LittleEndian.AppendUint32(b, 1) // Ethernet
	for i, f := range frames {
		b = binary.LittleEndian.AppendUint32(b, uint32(1700000000+i))
		b = binary.LittleEndian.AppendUint32(b, 0)
		b = binary.LittleEndian.AppendUint32(b, uint32(len(f)))
		b = binary.LittleEndian.AppendUint32(b, uint32(len(f)))
		b = append(b, f...)
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// udFrame wraps a MAD as this provider sends it: UD packet, UDP, IPv4
// with ID 0 and DF (what icrc assumes), Ethernet.
func udFrame(mad []byte, a addrs) []byte {
	ud := encodeUD(mad, 42, a)
	f := make([]byte, 14+20+8, 14+20+8+len(ud))
	copy(f[0:6], []byte{2, 0, 0, 0, 0, 1})
	copy(f[6:12], []byte{2, 0, 0, 0, 0, 2})
	binary.BigEndian.PutUint16(f[12:], 0x0800)
	ip := f[14:34]
	ip[0] = 0x45
	binary.BigEndian.PutUint16(ip[2:], uint16(20+8+len(ud)))
	binary.BigEndian.PutUint16(ip[6:], 0x4000)
	ip[8], ip[9] = 64, 17
	s, d := a.src.As4(), a.dst.As4()
	copy(ip[12:], s[:])
	copy(ip[16:], d[:])
	var sum uint32
	for i := 0; i < 20; i += 2 {
		sum += uint32(binary.BigEndian.Uint16(ip[i:]))
	}
	for sum > 0xffff {
		sum = sum>>16 + sum&0xffff
	}
	binary.BigEndian.PutUint16(ip[10:], ^uint16(sum))
	udp := f[34:42]
	binary.BigEndian.PutUint16(udp[0:], a.srcPort)
	binary.BigEndian.PutUint16(udp[2:], a.dstPort)
	binary.BigEndian.PutUint16(udp[4:], uint16(8+len(ud))) // checksum 0: none, allowed on IPv4
	return append(f, ud...)
}

func TestTsharkCM(t *testing.T) {
	tshark, err := exec.LookPath("tshark")
	if err != nil {
		t.Skip("tshark not installed: apt-get install tshark")
	}
	local, remote := netip.MustParseAddr("198.18.0.2"), netip.MustParseAddr("198.18.0.1")
	a := addrs{src: local, dst: remote, srcPort: 49152, dstPort: UDPPort}
	c := &cmConn{dev: &device{cfg: Config{MTU: 1024}}, local: local, remote: remote, localID: 0x11223344, srcPort: 50000, recvPSN: 0x123456,
		q: &qp{qpn: 0xabcdef, offer: reads{out: 15, in: 16}}}
	c.dev.gsi.guid = 0x0200000000000001
	req := c.request(7491, []byte("rdmacp"))
	msgs := []rdmacm.Message{req,
		&rdmacm.RTU{LocalCommID: 0x11223344, RemoteCommID: 0x55667788},
		&rdmacm.DREQ{LocalCommID: 0x11223344, RemoteCommID: 0x55667788, RemoteQPN: 0x42},
		&rdmacm.DREP{LocalCommID: 0x11223344, RemoteCommID: 0x55667788},
		&rdmacm.REJ{LocalCommID: 0x11223344, RemoteCommID: 0x55667788, Reason: rdmacm.ReasonTimeout},
		&rdmacm.REP{LocalCommID: 0x55667788, RemoteCommID: 0x11223344, LocalQPN: 0x42, StartingPSN: 0x654321, ResponderResources: 4, InitiatorDepth: 5, RNRRetryCount: 7, Private: frame([]byte("ok"))},
		&rdmacm.MRA{LocalCommID: 0x55667788, RemoteCommID: 0x11223344, ServiceTimeout: 24},
	}
	var frames [][]byte
	for i, m := range msgs {
		mad, err := rdmacm.Encode(uint64(0x1000+i), m)
		if err != nil {
			t.Fatal(err)
		}
		frames = append(frames, udFrame(mad, a))
	}
	pcap := filepath.Join(t.TempDir(), "cm.pcap")
	if d := os.Getenv("ROCE_PCAP_DIR"); d != "" {
		pcap = filepath.Join(d, "cm.pcap")
	}
	writePcap(t, pcap, frames)
	ops, _ := tsharkCheck(t, tshark, pcap, UDPPort, len(msgs))
	if ops["100"] != len(msgs) {
		t.Errorf("BTH opcodes %v, want %d UD SEND_ONLY (100)", ops, len(msgs))
	}
	want := [][2]string{
		{"infiniband.bth.destqp", "0x000001"}, {"infiniband.bth.p_key", "65535"},
		{"infiniband.deth.q_key", "0x0000000080010000"}, {"infiniband.deth.srcqp", "0x00000001"},
		{"infiniband.mad.baseversion", "0x01"}, {"infiniband.mad.mgmtclass", "0x07"},
		{"infiniband.mad.classversion", "0x02"}, {"infiniband.mad.method", "0x03"},
		{"infiniband.mad.transactionid", "0x0000000000001000"}, {"infiniband.mad.attributeid", "0x0010"},
		{"infiniband.cm.req.serviceid.prefix", "0000000001"}, {"infiniband.cm.req.serviceid.protocol", "0x06"},
		{"infiniband.cm.req.serviceid.dport", "0x1d43"},
		{"infiniband.cm.req.localcaguid", "0x0200000000000001"},
		{"infiniband.cm.req.localqpn", "0xabcdef"}, {"infiniband.cm.req.responderres", "0x10"},
		{"infiniband.cm.req.initdepth", "0x0f"}, {"infiniband.cm.req.remoteresptout", "0x12"},
		{"infiniband.cm.req.transpsvctype", "0x00"}, {"infiniband.cm.req.e2eflowctrl", "0x00"},
		{"infiniband.cm.req.startpsn", "0x123456"}, {"infiniband.cm.req.localresptout", "0x12"},
		{"infiniband.cm.req.retrcount", "0x07"}, {"infiniband.cm.req.pkey", "0xffff"},
		{"infiniband.cm.req.pppmtu", "0x03"}, {"infiniband.cm.req.rnrretrcount", "0x07"},
		{"infiniband.cm.req.maxcmretr", "0x0f"}, {"infiniband.cm.req.prim_locallid", "65535"},
		{"infiniband.cm.req.prim_remotelid", "65535"},
		{"infiniband.cm.req.prim_localgid_ipv4", "198.18.0.2"}, {"infiniband.cm.req.prim_remotegid_ipv4", "198.18.0.1"},
		{"infiniband.cm.req.prim_hoplim", "0x40"}, {"infiniband.cm.req.prim_subnetlocal", "0x00"},
		{"infiniband.cm.req.prim_localacktout", "0x11"},
		{"infiniband.cm.req.ip_cm.majv", "0x00"}, {"infiniband.cm.req.ip_cm.minv", "0x00"}, {"infiniband.cm.req.ip_cm.ipv", "0x04"}, {"infiniband.cm.req.ip_cm.sport", "0xc350"},
		{"infiniband.cm.req.ip_cm.sip4", "198.18.0.2"}, {"infiniband.cm.req.ip_cm.dip4", "198.18.0.1"},
		{"infiniband.cm.req.ip_cm.private", "0672646d616370" + strings.Repeat("00", 56-7)}, // "rdmacp", framed
	}
	args := []string{"-r", pcap, "-Y", "frame.number == 1", "-T", "fields", "-E", "separator=|"}
	for _, w := range want {
		args = append(args, "-e", w[0])
	}
	out, err := exec.Command(tshark, args...).Output()
	if err != nil {
		t.Fatalf("tshark: %v", err)
	}
	got := strings.Split(strings.TrimSpace(string(out)), "|")
	if len(got) != len(want) {
		t.Fatalf("tshark gave %d fields, want %d: %q", len(got), len(want), out)
	}
	for i, w := range want {
		if !strings.EqualFold(got[i], w[1]) {
			t.Errorf("%s = %q, want %q", w[0], got[i], w[1])
		}
	}
	// Each message is the CM message it says it is.
	out, err = exec.Command(tshark, "-r", pcap, "-T", "fields", "-e", "infiniband.mad.attributeid",
		"-e", "infiniband.cm.rtu.remotecommid", "-e", "infiniband.cm.dreq.remotecommid", "-e", "infiniband.cm.req.remoteqpneecn",
		"-e", "infiniband.cm.drsp.remotecommid", "-e", "infiniband.cm.rej.reason", "-e", "infiniband.cm.rep.localqpn",
		"-e", "infiniband.cm.rep.startpsn", "-e", "infiniband.cm.rep.rnrretrcount").Output()
	if err != nil {
		t.Fatalf("tshark: %v", err)
	}
	t.Logf("tshark:\n%s", out)
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	wantLines := []string{
		"0x0010\t\t\t\t\t\t\t\t",
		"0x0014\t0x55667788\t\t\t\t\t\t\t",
		"0x0015\t\t0x55667788\t0x000042\t\t\t\t\t",
		"0x0016\t\t\t\t0x55667788\t\t\t\t",
		"0x0012\t\t\t\t\t0x0004\t\t\t",
		"0x0013\t\t\t\t\t\t0x000042\t0x654321\t0x07",
		"0x0011",
	}
	for i := range wantLines {
		if i >= len(lines) || !strings.EqualFold(lines[i], wantLines[i]) {
			t.Errorf("frame %d: %q, want %q", i+1, lines[min(i, len(lines)-1)], wantLines[i])
		}
	}
}
