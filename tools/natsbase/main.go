// natsbase: the peer baseline for `fairfeed bridge bench --baseline`.
// NATS's own Go client publishes the same load the bridge published —
// publications per second, subjects, payload size — through the same
// nats-server to the same number of subscriber connections, and reports
// latency (publish → receipt, one clock) and losses as JSON, in the field
// names `fairfeed bridge bench --json` uses.
package main

import (
	"encoding/binary"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
)

type report struct {
	P50Ms        float64 `json:"p50_ms"`
	P90Ms        float64 `json:"p90_ms"`
	P99Ms        float64 `json:"p99_ms"`
	MaxMs        float64 `json:"max_ms"`
	MeanMs       float64 `json:"mean_ms"`
	Lost         uint64  `json:"lost"`
	Duplicates   uint64  `json:"duplicates"`
	Publications uint64  `json:"publications"`
	Subscribers  int     `json:"subscribers"`
	Subjects     int     `json:"subjects"`
	PayloadBytes int     `json:"payload_bytes"`
	Client       string  `json:"client"`
}

func fail(format string, a ...any) {
	fmt.Fprintf(os.Stderr, "natsbase: "+format+"\n", a...)
	os.Exit(1)
}

func main() {
	url := flag.String("url", nats.DefaultURL, "NATS server URL")
	subs := flag.Int("subscribers", 1, "subscriber connections (1..64)")
	rate := flag.Float64("rate", 1000, "publications per second (> 0)")
	seconds := flag.Float64("seconds", 5, "seconds of publishing (> 0)")
	subjects := flag.Int("subjects", 100, "subjects published round robin (1..1000000)")
	size := flag.Int("payload", 64, "payload bytes (16..65536)")
	flag.Parse()
	if *subs < 1 || *subs > 64 || *rate <= 0 || *seconds <= 0 || *subjects < 1 || *subjects > 1000000 || *size < 16 || *size > 65536 {
		fail("a value is out of range (see -h)")
	}
	total := uint64(*rate * *seconds)
	if total == 0 || total > 50000000 {
		fail("rate × seconds must be 1..50,000,000 publications")
	}
	names := make([]string, *subjects)
	for i := range names {
		names[i] = fmt.Sprintf("base.%d.x", i)
	}
	type sub struct {
		mu   sync.Mutex
		lat  []int64
		seen []bool
	}
	var dups atomic.Uint64
	var got atomic.Uint64
	var last atomic.Int64
	all := make([]*sub, *subs)
	conns := make([]*nats.Conn, 0, *subs)
	for k := range all {
		s := &sub{lat: make([]int64, 0, total), seen: make([]bool, total+1)}
		all[k] = s
		nc, err := nats.Connect(*url)
		if err != nil {
			fail("connecting to %s: %v", *url, err)
		}
		conns = append(conns, nc)
		sb, err := nc.Subscribe("base.>", func(m *nats.Msg) {
			now := time.Now().UnixNano()
			if len(m.Data) < 16 {
				return
			}
			seq := binary.BigEndian.Uint64(m.Data[0:8])
			sent := int64(binary.BigEndian.Uint64(m.Data[8:16]))
			s.mu.Lock()
			defer s.mu.Unlock()
			if seq == 0 || seq > total {
				return
			}
			if s.seen[seq] {
				dups.Add(1)
				return
			}
			s.seen[seq] = true
			s.lat = append(s.lat, now-sent)
			got.Add(1)
			last.Store(now)
		})
		if err != nil {
			fail("subscribing: %v", err)
		}
		// No client-side drops: a slow subscriber shows as latency (and the
		// server's slow-consumer cut as loss), as with the bridge's subscribers.
		_ = sb.SetPendingLimits(-1, -1)
		if err := nc.Flush(); err != nil {
			fail("flush: %v", err)
		}
	}
	pub, err := nats.Connect(*url)
	if err != nil {
		fail("connecting to %s: %v", *url, err)
	}
	payload := make([]byte, *size)
	gap := time.Duration(float64(time.Second) / *rate)
	start := time.Now()
	for i := uint64(1); i <= total; i++ {
		due := start.Add(time.Duration(i-1) * gap)
		for time.Now().Before(due) {
			if d := time.Until(due); d > 200*time.Microsecond {
				time.Sleep(d - 100*time.Microsecond)
			}
		}
		binary.BigEndian.PutUint64(payload[0:8], i)
		binary.BigEndian.PutUint64(payload[8:16], uint64(time.Now().UnixNano()))
		if err := pub.Publish(names[int(i-1)%len(names)], payload); err != nil {
			fail("publishing: %v", err)
		}
	}
	_ = pub.Flush()
	// Until every subscriber has everything, or nothing arrived for 2 s.
	want := total * uint64(*subs)
	last.CompareAndSwap(0, time.Now().UnixNano())
	for got.Load() < want && time.Since(time.Unix(0, last.Load())) < 2*time.Second {
		time.Sleep(20 * time.Millisecond)
	}
	for _, nc := range conns {
		nc.Close()
	}
	pub.Close()
	lats := []int64{}
	for _, s := range all {
		s.mu.Lock()
		lats = append(lats, s.lat...)
		s.mu.Unlock()
	}
	sort.Slice(lats, func(a, b int) bool { return lats[a] < lats[b] })
	q := func(p float64) float64 {
		if len(lats) == 0 {
			return 0
		}
		i := int(p * float64(len(lats)))
		if i >= len(lats) {
			i = len(lats) - 1
		}
		return float64(lats[i]) / 1e6
	}
	var sum int64
	for _, v := range lats {
		sum += v
	}
	mean := 0.0
	if len(lats) > 0 {
		mean = float64(sum) / float64(len(lats)) / 1e6
	}
	r := report{
		P50Ms: q(0.5), P90Ms: q(0.9), P99Ms: q(0.99), MaxMs: q(1.0), MeanMs: mean,
		Lost: want - uint64(len(lats)), Duplicates: dups.Load(), Publications: total,
		Subscribers: *subs, Subjects: *subjects, PayloadBytes: *size, Client: "nats.go " + nats.Version,
	}
	_ = json.NewEncoder(os.Stdout).Encode(r)
}
