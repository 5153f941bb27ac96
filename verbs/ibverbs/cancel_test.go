//go:build rdma && linux && cgo

package ibverbs

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rdmacp/rdmacp/verbs"
	"github.com/rdmacp/rdmacp/verbs/verbstest"
)

// TestCancelConnect cancels connection set-up at random points, many
// times, from both ends at once: dialers give PrepareDial and Connect one
// context whose deadline falls anywhere from "already past" to about
// four times a whole connect alone (so inside rdma_resolve_addr,
// rdma_resolve_route, rdma_connect or after; one in eight gets 2 s, which
// is enough), while acceptors wait in Accept and in the
// accepting Connect with short random deadlines of their own, and reject
// some requests. Cancelling used to crash the process (SIGSEGV in
// librdmacm's rdma_get_cm_event: the QP was destroyed while the event
// thread moved it to RTR/RTS for a CONNECT_RESPONSE).
//
// Every call must return within its deadline and a bound, every failure
// must be an *verbs.OpError, and afterwards the provider must hold no
// rdma_cm id, QP or connection request more than before, the kernel no
// more cm_ids or QPs of this process (rdma resource show, where it can be
// read), and no goroutine may be left behind. A connect with time enough
// must still work at the end.
//
// CANCEL_ROUNDS sets the number of dial attempts (default 3000, about
// 10 s in the Soft-RoCE guest: before the fix, 1000 crashed 2 runs of 3).
func TestCancelConnect(t *testing.T) {
	cfg := testConfig(t)
	cfg.Timeout = 20 * time.Second
	e := verbstest.Open(t, cfg)
	d := e.Dev.(*device)
	dial, acc := e.NewSide(t), e.NewSide(t)
	ln := e.Listen(t)
	dcfg := e.QPConfig(verbs.QPConfig{MaxSendWR: 16, MaxRecvWR: 16}, dial)
	acfg := e.QPConfig(verbs.QPConfig{MaxSendWR: 16, MaxRecvWR: 16}, acc)
	rounds := 3000
	if s := os.Getenv("CANCEL_ROUNDS"); s != "" {
		fmt.Sscan(s, &rounds)
	}

	// How long a whole connect takes here: the random deadlines span
	// four times that (six goroutines share the CPU in the run), so
	// that they land in every step of it.
	var took []time.Duration
	for range 5 {
		start := time.Now()
		p := e.ConnectVia(t, ln, dial, acc, verbstest.Options{DialQP: dcfg, AcceptQP: acfg})
		took = append(took, time.Since(start))
		p.DialQP.Close()
		p.AcceptQP.Close()
	}
	slices.Sort(took)
	span := max(4*took[len(took)/2], time.Millisecond)
	t.Logf("a whole connect takes %v (median of %v); deadlines from 0 to %v", took[len(took)/2], took, span)

	runtime.GC()
	goroutines := runtime.NumGoroutine()
	ids, qps, reqs := d.liveCounts()
	kernel0, kerr := kernelCounts()
	if kerr != nil {
		t.Logf("kernel resource counts not checked: %v", kerr)
	} else {
		t.Logf("before: provider ids %d qps %d reqs %d; kernel cm_ids %d qps %d", ids, qps, reqs, kernel0.cmIDs, kernel0.qps)
	}

	// bound is how far past its deadline a cancelled call may return.
	const bound = 2 * time.Second
	var (
		stats  sync.Map // outcome -> *atomic.Int64
		errsMu sync.Mutex
		errs   []string
	)
	count := func(what string) {
		v, _ := stats.LoadOrStore(what, new(atomic.Int64))
		v.(*atomic.Int64).Add(1)
	}
	problem := func(format string, a ...any) {
		errsMu.Lock()
		if len(errs) < 20 {
			errs = append(errs, fmt.Sprintf(format, a...))
		}
		errsMu.Unlock()
	}
	// timed runs f under a context with a random deadline in [0, max]
	// (one in ten already past, one in eight 2 s) and checks that it
	// returned in time.
	timed := func(rng *rand.Rand, maxD time.Duration, what string, f func(ctx context.Context) error) error {
		dl := time.Duration(rng.Int64N(int64(maxD) + 1))
		switch rng.IntN(40) {
		case 0, 1, 2, 3:
			dl = -time.Millisecond
		case 4, 5, 6, 7, 8:
			dl = 2 * time.Second
		}
		ctx, cancel := context.WithTimeout(context.Background(), dl)
		defer cancel()
		start := time.Now()
		err := f(ctx)
		if over := time.Since(start) - max(dl, 0); over > bound {
			problem("%s with a %v deadline returned %v late: %v", what, dl, over, err)
		}
		var oe *verbs.OpError
		if err != nil && !errors.As(err, &oe) {
			problem("%s: not an *verbs.OpError: %T %v", what, err, err)
		}
		return err
	}

	stop := make(chan struct{})
	var awg sync.WaitGroup
	for a := range 2 {
		awg.Add(1)
		go func() {
			defer awg.Done()
			rng := rand.New(rand.NewPCG(uint64(a), 77))
			for {
				select {
				case <-stop:
					return
				default:
				}
				var req verbs.ConnRequest
				err := timed(rng, span, "accept", func(ctx context.Context) (err error) {
					req, err = ln.Accept(ctx)
					return err
				})
				if err != nil {
					count("accept: cancelled")
					continue
				}
				if rng.IntN(8) == 0 {
					req.Reject([]byte("no"))
					count("accept: rejected")
					continue
				}
				pq, err := req.Prepare(acc.PD, acfg)
				if err != nil {
					// The dialer gave up since (rdma_rxe: EINVAL from
					// rdma_create_qp, the kernel's cm_id being idle).
					var oe *verbs.OpError
					if !errors.As(err, &oe) {
						problem("prepare: not an *verbs.OpError: %T %v", err, err)
					}
					count("accept: prepare failed")
					req.Reject(nil)
					continue
				}
				var qp verbs.QP
				err = timed(rng, 2*span, "accepting connect", func(ctx context.Context) (err error) {
					qp, err = pq.Connect(ctx, verbs.ConnParam{})
					return err
				})
				if err != nil {
					pq.Close()
					count("accept: connect failed")
					continue
				}
				count("accept: connected")
				qp.Close()
			}
		}()
	}

	var dwg sync.WaitGroup
	var next atomic.Int64
	for w := range 4 {
		dwg.Add(1)
		go func() {
			defer dwg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 1234))
			for next.Add(1) <= int64(rounds) {
				var qp verbs.QP
				err := timed(rng, span, "dial", func(ctx context.Context) error {
					pq, err := d.PrepareDial(ctx, dial.PD, ln.Addr(), dcfg)
					if err != nil {
						count("dial: failed in PrepareDial")
						return err
					}
					qp, err = pq.Connect(ctx, verbs.ConnParam{})
					if err != nil {
						pq.Close()
						count("dial: failed in Connect")
					}
					return err
				})
				if err == nil {
					count("dial: connected")
					if rng.IntN(2) == 0 {
						time.Sleep(time.Duration(rng.Int64N(int64(span))))
					}
					qp.Close()
				}
			}
		}()
	}
	waitGroup(t, &dwg, 120*time.Second, "dialers")
	close(stop)
	waitGroup(t, &awg, 30*time.Second, "acceptors")

	// Requests that came in after the acceptors stopped: reject them.
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		req, err := ln.Accept(ctx)
		cancel()
		if err != nil {
			break
		}
		req.Reject(nil)
		count("accept: rejected after the run")
	}
	stats.Range(func(k, v any) bool {
		t.Logf("%-32s %d", k, v.(*atomic.Int64).Load())
		return true
	})
	for _, want := range []string{"dial: connected", "dial: failed in PrepareDial", "dial: failed in Connect"} {
		if v, ok := stats.Load(want); !ok || v.(*atomic.Int64).Load() == 0 {
			t.Errorf("no %q in %d rounds: the deadlines missed a step of the connect", want, rounds)
		}
	}
	for _, p := range errs {
		t.Error(p)
	}

	// Nothing left behind.
	eventually(t, 5*time.Second, func() string {
		if i, q, r := d.liveCounts(); i != ids || q != qps || r != reqs {
			return fmt.Sprintf("provider holds ids %d qps %d reqs %d, %d %d %d before", i, q, r, ids, qps, reqs)
		}
		return ""
	})
	if kerr == nil {
		eventually(t, 5*time.Second, func() string {
			k, err := kernelCounts()
			if err != nil {
				return err.Error()
			}
			if k != kernel0 {
				return fmt.Sprintf("kernel holds %d cm_ids and %d qps of this process, %d and %d before", k.cmIDs, k.qps, kernel0.cmIDs, kernel0.qps)
			}
			return ""
		})
	}
	eventually(t, 5*time.Second, func() string {
		if n := runtime.NumGoroutine(); n > goroutines {
			buf := make([]byte, 1<<16)
			return fmt.Sprintf("%d goroutines, %d before:\n%s", n, goroutines, buf[:runtime.Stack(buf, true)])
		}
		return ""
	})

	// The device still connects.
	p := e.ConnectVia(t, ln, dial, acc, verbstest.Options{DialQP: dcfg, AcceptQP: acfg})
	p.DialQP.Close()
	p.AcceptQP.Close()
}

// liveCounts is what the provider holds: rdma_cm ids, QPs and
// connection requests not yet taken.
func (d *device) liveCounts() (ids, qps, reqs int) {
	d.idMu.Lock()
	ids = len(d.ids)
	d.idMu.Unlock()
	d.lifeMu.Lock()
	qps, reqs = len(d.qps), len(d.reqs)
	d.lifeMu.Unlock()
	return ids, qps, reqs
}

type kernelCount struct{ cmIDs, qps int }

// kernelCounts counts the rdma_cm ids and QPs the kernel holds for this
// process (iproute2's rdma resource show).
func kernelCounts() (kernelCount, error) {
	var k kernelCount
	for _, r := range []struct {
		what string
		n    *int
	}{{"cm_id", &k.cmIDs}, {"qp", &k.qps}} {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		out, err := exec.CommandContext(ctx, "rdma", "-j", "resource", "show", r.what).Output()
		cancel()
		if err != nil {
			return k, fmt.Errorf("rdma resource show %s: %w", r.what, err)
		}
		n, err := countPID(out, threadIDs())
		if err != nil {
			return k, fmt.Errorf("rdma resource show %s: %w", r.what, err)
		}
		*r.n = n
	}
	return k, nil
}

// threadIDs are this process's threads: the kernel names the thread that
// created an object as its "pid".
func threadIDs() map[int]bool {
	ids := map[int]bool{os.Getpid(): true}
	ents, _ := os.ReadDir("/proc/self/task")
	for _, e := range ents {
		var id int
		if _, err := fmt.Sscan(e.Name(), &id); err == nil {
			ids[id] = true
		}
	}
	return ids
}

// countPID counts the objects whose "pid" is one of pids in rdma's JSON
// output: one or more arrays of objects.
func countPID(out []byte, pids map[int]bool) (int, error) {
	dec := json.NewDecoder(bytes.NewReader(out))
	n := 0
	for dec.More() {
		var v []map[string]any
		if err := dec.Decode(&v); err != nil {
			return 0, err
		}
		for _, o := range v {
			if p, ok := o["pid"].(float64); ok && pids[int(p)] {
				n++
			}
		}
	}
	return n, nil
}

func waitGroup(t *testing.T, wg *sync.WaitGroup, d time.Duration, what string) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		wg.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(d):
		buf := make([]byte, 1<<20)
		t.Fatalf("%s still running after %v:\n%s", what, d, buf[:runtime.Stack(buf, true)])
	}
}

// eventually fails t with f's last complaint if f has not returned ""
// within d.
func eventually(t *testing.T, d time.Duration, f func() string) {
	t.Helper()
	end := time.Now().Add(d)
	for {
		msg := f()
		if msg == "" {
			return
		}
		if time.Now().After(end) {
			t.Error(msg)
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestCloseDuringConnect closes the device while dials and accepts are
// in flight, at a random point of them, 30 times: Close must return
// promptly, and so must every call in flight, with an *verbs.OpError,
// without crashing: Close used to destroy the event channel under a
// PrepareDial (whose id then outlived it) and leave a Connect waiting for
// events that no longer came, until its deadline.
func TestCloseDuringConnect(t *testing.T) {
	cfg := testConfig(t)
	const rounds, slack = 30, 2 * time.Second
	for round := range rounds {
		dev, err := cfg.Provider.Open(context.Background(), cfg.Device)
		if err != nil {
			t.Fatal(err)
		}
		e := &verbstest.Env{Cfg: cfg, Dev: dev, Caps: dev.Caps()}
		e.Cfg.Timeout = 10 * time.Second
		dial, acc := e.NewSide(t), e.NewSide(t)
		ln := e.Listen(t)
		dcfg := e.QPConfig(verbs.QPConfig{MaxSendWR: 16, MaxRecvWR: 16}, dial)
		acfg := e.QPConfig(verbs.QPConfig{MaxSendWR: 16, MaxRecvWR: 16}, acc)
		// Calls in flight get 30 s: only Close can end them in time.
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		var wg sync.WaitGroup
		var mu sync.Mutex
		var errs []error
		note := func(err error) {
			mu.Lock()
			errs = append(errs, err)
			mu.Unlock()
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				req, err := ln.Accept(ctx)
				if err != nil {
					note(err)
					return
				}
				pq, err := req.Prepare(acc.PD, acfg)
				if err != nil {
					req.Reject(nil)
					continue
				}
				qp, err := pq.Connect(ctx, verbs.ConnParam{})
				if err != nil {
					pq.Close()
					note(err)
					continue
				}
				qp.Close()
			}
		}()
		for range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for ctx.Err() == nil {
					pq, err := dev.PrepareDial(ctx, dial.PD, ln.Addr(), dcfg)
					if err != nil {
						note(err)
						return
					}
					qp, err := pq.Connect(ctx, verbs.ConnParam{})
					if err != nil {
						pq.Close()
						note(err)
						return
					}
					qp.Close()
				}
			}()
		}
		time.Sleep(time.Duration(rand.Int64N(int64(20 * time.Millisecond))))
		start := time.Now()
		dev.Close()
		closed := time.Since(start)
		done := make(chan struct{})
		go func() {
			wg.Wait()
			close(done)
		}()
		select {
		case <-done:
		case <-time.After(closed + slack):
			buf := make([]byte, 1<<20)
			t.Fatalf("round %d: calls still in flight %v after Close returned:\n%s", round, slack, buf[:runtime.Stack(buf, true)])
		}
		ended := time.Since(start)
		cancel()
		if closed > slack {
			t.Errorf("round %d: Close took %v", round, closed)
		}
		nclosed := 0
		for _, err := range errs {
			var oe *verbs.OpError
			if !errors.As(err, &oe) {
				t.Errorf("round %d: not an *verbs.OpError: %T %v", round, err, err)
			}
			if errors.Is(err, verbs.ErrClosed) {
				nclosed++
			}
		}
		if round%10 == 0 || t.Failed() {
			t.Logf("round %d: Close took %v, the calls in flight ended %v after it began; %d errors, %d ErrClosed", round, closed, ended, len(errs), nclosed)
		}
	}
}
