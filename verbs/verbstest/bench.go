package verbstest

import (
	"context"
	"fmt"
	"testing"

	"github.com/rdmacp/rdmacp/verbs"
)

// RunBench measures RDMA READ throughput over loopback: every message
// size, number of QPs and READs in flight per QP. Each op is one READ.
func RunBench(b *testing.B, cfg Config) {
	e := Open(b, cfg)
	for _, size := range []int{64 << 10, 1 << 20, 4 << 20} {
		for _, qps := range []int{1, 4} {
			for _, depth := range []int{1, 16} {
				name := fmt.Sprintf("Read/%dKiB/qps=%d/depth=%d", size>>10, qps, depth)
				b.Run(name, func(b *testing.B) { e.benchRead(b, size, qps, depth) })
			}
		}
	}
}

// The sinks of one benchmark share at most this much memory; READs in
// flight may land on the same bytes, which does not matter here.
const benchSinkMax = 64 << 20

func (e *Env) benchRead(b *testing.B, size, qps, depth int) {
	if uint64(size) > e.Caps.MaxMsgSize {
		b.Skipf("MaxMsgSize %d", e.Caps.MaxMsgSize)
	}
	if depth > e.Caps.MaxQPWR {
		b.Skipf("MaxQPWR %d", e.Caps.MaxQPWR)
	}
	d, a := e.NewSide(b), e.NewSide(b)
	src := e.Region(b, a.PD, size, rr)
	FillRandom(src.B, 13)
	slots := max(1, min(qps*depth, benchSinkMax/size))
	sink := e.Region(b, d.PD, slots*size, rw)
	FillPattern(sink.B) // fault the pages in before timing
	var qs []verbs.QP
	for range qps {
		p := e.Connect(b, d, a, Options{DialQP: verbs.QPConfig{MaxSendWR: depth}})
		qs = append(qs, p.DialQP)
	}

	posted := 0
	post := func(q int) {
		wr := sink.Read(uint64(q), (posted%slots)*size, src, 0, size)
		if n, err := qs[q].PostSend([]verbs.SendWR{wr}); n != 1 || err != nil {
			b.Fatalf("post READ on qp %d: %d, %v", q, n, err)
		}
		posted++
	}
	b.SetBytes(int64(size))
	b.ResetTimer()
	for range depth {
		for q := range qps {
			if posted < b.N {
				post(q)
			}
		}
	}
	out := make([]verbs.Completion, 64)
	for done := 0; done < b.N; {
		n, err := d.SendCQ.Poll(out)
		if err != nil {
			b.Fatalf("poll: %v", err)
		}
		for _, c := range out[:n] {
			if c.Status != verbs.StatusSuccess {
				b.Fatalf("READ failed: %s", fmtCompletion(c))
			}
			done++
			if posted < b.N {
				post(int(c.WRID))
			}
		}
		if n == 0 {
			ctx, cancel := context.WithTimeout(context.Background(), e.Cfg.Timeout)
			err := d.SendCQ.Wait(ctx)
			cancel()
			if err != nil {
				b.Fatalf("%d of %d READs done: wait: %v", done, b.N, err)
			}
		}
	}
	b.StopTimer()
}
