package vllmsim

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// RankHeader is the request header vLLM's API server reads to pin a
// request to one data-parallel rank (its global rank).
const RankHeader = "X-Data-Parallel-Rank"

// ServedRankHeader is the response header a DPServer adds to every
// request it hands to a rank, naming that rank (its global rank): the
// simulator's own, not vLLM's, so that a client can check the rank that
// served it against the one a gateway says it picked.
const ServedRankHeader = "X-Vllmsim-Data-Parallel-Rank"

// DPServer is a simulated `vllm serve --data-parallel-size N`: N
// independent engine ranks (each its own scheduler, KV cache and KV-event
// publisher on the configured ports + rank, its batches naming its rank)
// behind one HTTP port. A request with RankHeader goes to that rank;
// others are spread round robin, standing in for vLLM's internal load
// balancer; one naming a rank the server lacks is refused (400). Every
// request handed to a rank is answered with ServedRankHeader. /metrics
// shows every rank's series, told apart by their `engine` label, as
// vLLM's does; POST /sleep, /wake_up and /reset_prefix_cache apply to
// every rank.
type DPServer struct {
	ranks []*Engine
	ln    net.Listener
	srv   *http.Server
	next  atomic.Uint64
	// pinned counts, by rank, the rank requests (see countsRank) that
	// named it in RankHeader; unpinned those spread by the server, refused
	// those naming no rank of it.
	pinned   []atomic.Uint64
	unpinned atomic.Uint64
	refused  atomic.Uint64

	closeOnce sync.Once
	closeErr  error
	done      chan struct{}
}

// StartDataParallel starts cfg.DataParallelSize ranks (DPRank + 0..N-1)
// behind cfg.Addr. Each rank's KV-event and replay endpoints are cfg's
// offset by its rank, as vLLM offsets them; each rank also listens on an
// HTTP port of its own (Ranks()[r].URL()), which the simulation does not
// need but tests may use. ctx only bounds startup; stop it with Close.
func StartDataParallel(ctx context.Context, cfg Config) (*DPServer, error) {
	n := max(cfg.DataParallelSize, 1)
	if _, err := cfg.withDefaults(); err != nil {
		return nil, err
	}
	addr := cfg.Addr
	if addr == "" {
		addr = "127.0.0.1:0"
	}
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, fmt.Errorf("vllmsim: addr %q: %w", addr, err)
	}
	base := cfg
	base.DataParallelSize = 0
	base.Addr = net.JoinHostPort(host, "0")
	ranks, err := StartFleet(ctx, n, base)
	if err != nil {
		return nil, err
	}
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", addr)
	if err != nil {
		for _, e := range ranks {
			_ = e.Close()
		}
		return nil, fmt.Errorf("vllmsim: listen %s: %w", addr, err)
	}
	d := &DPServer{ranks: ranks, ln: ln, pinned: make([]atomic.Uint64, n), done: make(chan struct{})}
	d.srv = &http.Server{Handler: d, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 2 * time.Minute, MaxHeaderBytes: 64 << 10}
	go func() {
		defer close(d.done)
		_ = d.srv.Serve(ln) // http.ErrServerClosed on Close
	}()
	return d, nil
}

// Addr is the shared HTTP address; URL the same as a base URL.
func (d *DPServer) Addr() string { return d.ln.Addr().String() }

// URL returns "http://" + Addr().
func (d *DPServer) URL() string { return "http://" + d.Addr() }

// Ranks returns the ranks, rank DPRank+0 first. The slice must not be
// modified.
func (d *DPServer) Ranks() []*Engine { return d.ranks }

// Pinned returns, by rank, how many rank requests (those that run on a
// rank's scheduler: POSTs other than /tokenize and /detokenize) named it
// in RankHeader.
func (d *DPServer) Pinned() []uint64 {
	out := make([]uint64, len(d.pinned))
	for i := range d.pinned {
		out[i] = d.pinned[i].Load()
	}
	return out
}

// Unpinned returns how many rank requests came without RankHeader
// (spread round robin, as vLLM's own load balancer would place them).
// Scrapes, model lists, tokenization and control calls are not counted:
// vLLM's API server answers those itself.
func (d *DPServer) Unpinned() uint64 { return d.unpinned.Load() }

// Refused returns how many rank requests named in RankHeader no rank of
// this server (each answered 400).
func (d *DPServer) Refused() uint64 { return d.refused.Load() }

// countsRank reports whether r is a rank request, one that runs on a
// rank's scheduler and so is counted by Pinned, Unpinned and Refused:
// any POST but tokenization (answered by vLLM's API server itself;
// /metrics and the control endpoints never reach rankOf).
func countsRank(r *http.Request) bool {
	return r.Method == http.MethodPost && r.URL.Path != "/tokenize" && r.URL.Path != "/detokenize"
}

// ServeHTTP serves /metrics from every rank and hands any other request
// to its rank's handler.
func (d *DPServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path == "/metrics" && r.Method == http.MethodGet {
		pages := make([][]byte, len(d.ranks))
		for i, e := range d.ranks {
			pages[i] = e.metricsText()
		}
		body := mergeExposition(pages)
		w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
		w.Header().Set("Content-Length", strconv.Itoa(len(body)))
		_, _ = w.Write(body)
		return
	}
	if r.Method == http.MethodPost && broadcastPaths[r.URL.Path] {
		d.broadcast(w, r)
		return
	}
	i, err := d.rankOf(r)
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	w.Header().Set(ServedRankHeader, strconv.Itoa(d.ranks[i].cfg.DPRank))
	d.ranks[i].srv.Handler.ServeHTTP(w, r)
}

// broadcastPaths are the control endpoints vLLM's API server applies to
// every rank of a data-parallel server (its engine client calls each
// engine core): sleep mode and the prefix-cache reset.
var broadcastPaths = map[string]bool{"/sleep": true, "/wake_up": true, "/reset_prefix_cache": true}

// broadcast runs r on every rank and answers the first failure, else the
// last rank's answer. Their bodies are small: no limit is needed.
func (d *DPServer) broadcast(w http.ResponseWriter, r *http.Request) {
	var last *answer
	for _, e := range d.ranks {
		a := &answer{header: http.Header{}, status: http.StatusOK}
		e.srv.Handler.ServeHTTP(a, r.Clone(r.Context()))
		last = a
		if a.status >= 300 {
			break
		}
	}
	for k, v := range last.header {
		w.Header()[k] = v
	}
	w.WriteHeader(last.status)
	_, _ = w.Write(last.body.Bytes())
}

// answer is a buffered http.ResponseWriter, for broadcast.
type answer struct {
	header http.Header
	status int
	body   bytes.Buffer
	wrote  bool
}

func (a *answer) Header() http.Header { return a.header }

func (a *answer) WriteHeader(status int) {
	if !a.wrote {
		a.status, a.wrote = status, true
	}
}

func (a *answer) Write(b []byte) (int, error) {
	a.wrote = true
	return a.body.Write(b)
}

// rankOf is the index in d.ranks of the rank r goes to: the one its
// RankHeader names (a global rank), else the next in turn. It counts rank
// requests (countsRank) by how they named their rank.
func (d *DPServer) rankOf(r *http.Request) (int, error) {
	counted := countsRank(r)
	v := r.Header.Get(RankHeader)
	if v == "" {
		if counted {
			d.unpinned.Add(1)
		}
		return int((d.next.Add(1) - 1) % uint64(len(d.ranks))), nil
	}
	g, err := strconv.Atoi(strings.TrimSpace(v))
	first := d.ranks[0].cfg.DPRank
	if err != nil || g < first || g >= first+len(d.ranks) {
		if counted {
			d.refused.Add(1)
		}
		return 0, fmt.Errorf("%s %q is not a data parallel rank of this server (%d..%d)", RankHeader, v, first, first+len(d.ranks)-1)
	}
	if counted {
		d.pinned[g-first].Add(1)
	}
	return g - first, nil
}

// Close stops the HTTP server, then every rank.
func (d *DPServer) Close() error {
	d.closeOnce.Do(func() {
		d.closeErr = d.srv.Close()
		<-d.done
		for _, e := range d.ranks {
			if err := e.Close(); err != nil && d.closeErr == nil {
				d.closeErr = err
			}
		}
	})
	return d.closeErr
}

// mergeExposition joins Prometheus text pages that share metric families
// into one page: each family's HELP and TYPE lines once, then its samples
// from every page in page order (a text page may not repeat a family).
func mergeExposition(pages [][]byte) []byte {
	var order []string
	head := map[string][]string{}
	samples := map[string][]string{}
	for _, p := range pages {
		cur := ""
		sc := bufio.NewScanner(bytes.NewReader(p))
		sc.Buffer(nil, 1<<20)
		for sc.Scan() {
			line := sc.Text()
			if rest, ok := strings.CutPrefix(line, "# "); ok {
				f := strings.Fields(rest)
				if len(f) >= 2 && (f[0] == "HELP" || f[0] == "TYPE") {
					if cur = f[1]; head[cur] == nil && samples[cur] == nil {
						order = append(order, cur)
					}
					if len(head[cur]) < 2 && !slices.Contains(head[cur], line) {
						head[cur] = append(head[cur], line)
					}
				}
				continue
			}
			if cur == "" && samples[""] == nil {
				order = append(order, "") // samples before any family
			}
			samples[cur] = append(samples[cur], line)
		}
	}
	var b bytes.Buffer
	for _, name := range order {
		for _, l := range head[name] {
			b.WriteString(l + "\n")
		}
		for _, l := range samples[name] {
			b.WriteString(l + "\n")
		}
	}
	return b.Bytes()
}
