package iwarp

import (
	"bytes"
	"context"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/rdmacp/rdmacp/verbs"
)

type fakeRegion struct{ n int }

func (*fakeRegion) isRegion() {}

func openDevice(t testing.TB) *device {
	t.Helper()
	d, err := New(Config{}).Open(context.Background(), verbs.DeviceConfig{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return d.(*device)
}

// permInverse undoes g.perm: it runs the rounds backwards.
func permInverse(g *stagGen, y uint32) uint32 {
	l, r := uint16(y>>16), uint16(y)
	for i := stagRounds - 1; i >= 0; i-- {
		l, r = r^g.round(i, l), l
	}
	return uint32(l)<<16 | uint32(r)
}

func keyedGen(seed byte) *stagGen {
	g := &stagGen{}
	g.setKey(bytes.Repeat([]byte{seed}, 16))
	return g
}

// 1,000,000 consecutive allocations are distinct and nonzero, and once
// they are freed the device holds no key at all.
func TestSTagsDistinctAndForgotten(t *testing.T) {
	d := openDevice(t)
	const n = 1_000_000
	r := &fakeRegion{}
	keys := make([]uint32, n)
	for i := range keys {
		keys[i] = d.newSTag(r)
		if keys[i] == 0 {
			t.Fatalf("allocation %d handed out key 0", i)
		}
	}
	if got := len(d.regions); got != n {
		t.Fatalf("%d live keys after %d allocations", got, n)
	}
	for _, k := range keys {
		d.dropSTag(k, r)
	}
	if got := len(d.regions); got != 0 {
		t.Fatalf("%d keys still held after freeing them all", got)
	}
	slices.Sort(keys)
	for i := 1; i < n; i++ {
		if keys[i] == keys[i-1] {
			t.Fatalf("key %#x handed out twice", keys[i])
		}
	}
	// The keys are spread over the whole space, not a counter's first
	// million values.
	if keys[0] >= 1<<24 || keys[n-1] < 0xff000000 {
		t.Errorf("keys lie in [%#x, %#x]", keys[0], keys[n-1])
	}
}

// perm is a bijection: the Feistel network inverts.
func TestSTagPermInverts(t *testing.T) {
	g := keyedGen(1)
	for i := range 100_000 {
		x := rand.Uint32()
		if i < 4 {
			x = []uint32{0, 1, 0xffffffff, 0x80000000}[i]
		}
		if y := g.perm(x); permInverse(g, y) != x {
			t.Fatalf("perm(%#x) = %#x, which inverts to %#x", x, y, permInverse(g, y))
		}
	}
}

// Two devices draw different permutation keys, so their sequences differ.
func TestSTagsKeyedPerDevice(t *testing.T) {
	a, b := openDevice(t), openDevice(t)
	r := &fakeRegion{}
	var ka, kb []uint32
	for range 16 {
		ka = append(ka, a.newSTag(r))
		kb = append(kb, b.newSTag(r))
	}
	if slices.Equal(ka, kb) {
		t.Fatalf("two devices handed out the same keys %x", ka)
	}
	same := 0
	for i := range ka {
		if ka[i] == kb[i] {
			same++
		}
	}
	if same > 1 {
		t.Errorf("%d of 16 keys equal across devices: %x, %x", same, ka, kb)
	}
	// Not the counter itself, nor a fixed sequence.
	if slices.Equal(ka, []uint32{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16}) {
		t.Errorf("keys are the counter")
	}
}

// The counter that maps to 0 is skipped.
func TestSTagZeroSkipped(t *testing.T) {
	d := openDevice(t)
	d.stags.setKey(bytes.Repeat([]byte{7}, 16))
	c := permInverse(&d.stags, 0)
	d.stags.ctr = uint64(c)
	s := d.newSTag(&fakeRegion{})
	if s == 0 {
		t.Fatal("key 0 handed out")
	}
	if want := d.stags.perm(c + 1); s != want {
		t.Fatalf("after the counter for 0 got %#x, want perm(%d) = %#x", s, c+1, want)
	}
}

// After 2^32 allocations the device re-keys and skips keys still live.
func TestSTagRekeyAtWrap(t *testing.T) {
	d := openDevice(t)
	k1, k2 := bytes.Repeat([]byte{1}, 16), bytes.Repeat([]byte{2}, 16)
	d.stags.setKey(k1)
	d.stags.keys = bytes.NewReader(k2)
	old, fresh := keyedGen(1), keyedGen(2)

	// Keys the next epoch will produce first are live from this one.
	r := &fakeRegion{}
	held := []uint32{fresh.perm(0), fresh.perm(2)}
	for _, k := range held {
		d.regions[k] = r
	}
	d.stags.ctr = stagSpace - 2
	var got []uint32
	for range 4 {
		got = append(got, d.newSTag(r))
	}
	want := []uint32{old.perm(stagSpace - 2), old.perm(stagSpace - 1), fresh.perm(1), fresh.perm(3)}
	if !slices.Equal(got, want) {
		t.Fatalf("across the wrap got %x, want %x (live keys %x skipped)", got, want, held)
	}
	if d.stags.ctr != 4 {
		t.Fatalf("counter %d after the re-key, want 4", d.stags.ctr)
	}
}

// A stale drop (an MR closed twice after its key went to someone else)
// does not take the key from its new owner.
func TestSTagStaleDrop(t *testing.T) {
	d := openDevice(t)
	a, b := &fakeRegion{1}, &fakeRegion{2}
	s := d.newSTag(a)
	d.dropSTag(s, a)
	d.regions[s] = b // as if re-issued after a re-key
	d.dropSTag(s, a)
	if d.lookup(s) != region(b) {
		t.Fatal("a stale drop removed another region's key")
	}
}

// A READ naming the key of a closed MR, or of a window that was
// invalidated, rebound or closed, is refused with a Terminate: the
// requester sees a remote error, both QPs go down, and the responder says
// why.
func TestFreedKeysRefused(t *testing.T) {
	type freed struct {
		name string
		key  func(t *testing.T, b side, src verbs.MR) uint32
	}
	bindMW := func(t *testing.T, b side, src verbs.MR) verbs.MW {
		w, err := b.pd.AllocMW()
		if err != nil {
			t.Fatal(err)
		}
		if _, err := b.qp.PostSend([]verbs.SendWR{{ID: 1, Op: verbs.OpBindMW, MW: w, BindMR: src, BindAddr: src.Addr(), BindLen: src.Len(), BindAccess: verbs.AccessRemoteRead}}); err != nil {
			t.Fatal(err)
		}
		if c := wait(t, b.scq, 1)[0]; c.Status != verbs.StatusSuccess {
			t.Fatalf("bind: %+v", c)
		}
		return w
	}
	cases := []freed{
		{"closed MR", func(t *testing.T, b side, src verbs.MR) uint32 {
			m, err := b.pd.RegMR(buffer(t, 4096), verbs.AccessRemoteRead)
			if err != nil {
				t.Fatal(err)
			}
			k := m.RKey()
			m.Close()
			return k
		}},
		{"closed MW", func(t *testing.T, b side, src verbs.MR) uint32 {
			w := bindMW(t, b, src)
			k := w.RKey()
			w.Close()
			return k
		}},
		{"invalidated MW", func(t *testing.T, b side, src verbs.MR) uint32 {
			w := bindMW(t, b, src)
			t.Cleanup(func() { w.Close() })
			k := w.RKey()
			if _, err := b.qp.PostSend([]verbs.SendWR{{ID: 2, Op: verbs.OpLocalInv, RKey: k}}); err != nil {
				t.Fatal(err)
			}
			if c := wait(t, b.scq, 1)[0]; c.Status != verbs.StatusSuccess {
				t.Fatalf("invalidate: %+v", c)
			}
			return k
		}},
		{"rebound MW", func(t *testing.T, b side, src verbs.MR) uint32 {
			w := bindMW(t, b, src)
			t.Cleanup(func() { w.Close() })
			k := w.RKey()
			if _, err := b.qp.PostSend([]verbs.SendWR{{ID: 3, Op: verbs.OpBindMW, MW: w, BindMR: src, BindAddr: src.Addr(), BindLen: src.Len(), BindAccess: verbs.AccessRemoteRead}}); err != nil {
				t.Fatal(err)
			}
			if c := wait(t, b.scq, 1)[0]; c.Status != verbs.StatusSuccess {
				t.Fatalf("rebind: %+v", c)
			}
			if w.RKey() == k {
				t.Fatalf("rebinding kept key %#x", k)
			}
			return k
		}},
	}
	for _, tc := range cases {
		t.Run(strings.ReplaceAll(tc.name, " ", "_"), func(t *testing.T) {
			a, b := pair(t, Config{}, 4)
			src, err := b.pd.RegMR(buffer(t, 4096), verbs.AccessRemoteRead|verbs.AccessMWBind)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { src.Close() })
			key := tc.key(t, b, src)
			dev := b.dev.(*device)
			if dev.lookup(key) != nil {
				t.Fatalf("freed key %#x is still live", key)
			}
			// Nor does the key come straight back.
			for range 1000 {
				m, _ := b.pd.RegMR(buffer(t, 64), verbs.AccessRemoteRead)
				if m.RKey() == key {
					t.Fatalf("freed key %#x handed out again", key)
				}
				m.Close()
			}
			dst := buffer(t, 4096)
			dmr, _ := a.pd.RegMR(dst, verbs.AccessLocalWrite)
			wr := verbs.SendWR{ID: 9, Op: verbs.OpRead, Local: verbs.SGE{Addr: dmr.Addr(), Length: 4096, LKey: dmr.LKey()}, RemoteAddr: src.Addr(), RKey: key}
			if _, err := a.qp.PostSend([]verbs.SendWR{wr}); err != nil {
				t.Fatal(err)
			}
			c := wait(t, a.scq, 1)[0]
			switch c.Status {
			case verbs.StatusRemoteAccess, verbs.StatusRemoteInvalid, verbs.StatusRemoteOp:
			default:
				t.Fatalf("READ with a freed key completed %v, want a remote error", c.Status)
			}
			for _, s := range []side{a, b} {
				select {
				case <-s.qp.Done():
				case <-time.After(5 * time.Second):
					t.Fatal("a QP lives on after the READ with a freed key")
				}
			}
			if err := b.qp.Err(); err == nil || !strings.Contains(err.Error(), "terminated") {
				t.Errorf("responder Err %v: want it to say it terminated the connection", err)
			}
			if err := a.qp.Err(); err == nil || !strings.Contains(err.Error(), "terminated") {
				t.Errorf("requester Err %v: want the peer's Terminate", err)
			}
			t.Logf("requester: %v; responder: %v", a.qp.Err(), b.qp.Err())
		})
	}
}

// BenchmarkNewSTag is one allocation and free, the live map kept small.
func BenchmarkNewSTag(b *testing.B) {
	d := openDevice(b)
	r := &fakeRegion{}
	b.ReportAllocs()
	for b.Loop() {
		d.dropSTag(d.newSTag(r), r)
	}
}

// BenchmarkNewSTagLive allocates without freeing: the map grows.
func BenchmarkNewSTagLive(b *testing.B) {
	d := openDevice(b)
	r := &fakeRegion{}
	b.ReportAllocs()
	for b.Loop() {
		d.newSTag(r)
	}
}

// BenchmarkSTagPerm is the permutation alone.
func BenchmarkSTagPerm(b *testing.B) {
	g := keyedGen(3)
	var x uint32
	for b.Loop() {
		x = g.perm(x + 1)
	}
}
