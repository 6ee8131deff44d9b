package main

import (
	goruntime "runtime"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/inhuman/mcp-exec/rootfs"
	"github.com/inhuman/mcp-exec/runtime"
)

// The engine's metrics: the state of the runtime, the pool and the rootfs,
// read through their accessors when /metrics is scraped. The server
// registers its own (server/metrics.go) on the same private registry.

// newRegistry is the server's registry, with the Go runtime's and the
// process's collectors: a private one, so that nothing registered
// elsewhere in the process is served, and tests are independent.
func newRegistry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return reg
}

// engineCollector reads the engine's state when scraped.
type engineCollector struct {
	e        *engine
	cacheDir string
	info     *prometheus.Desc
	ready    *prometheus.Desc
	prepared *prometheus.Desc
	tpl      *prometheus.Desc
	forks    *prometheus.Desc
	builds   *prometheus.Desc
	changed  *prometheus.Desc
	cache    *cacheSize
	cacheB   *prometheus.Desc
	cacheN   *prometheus.Desc
}

func newEngineCollector(e *engine, cacheDir string) *engineCollector {
	d := func(name, help string, labels ...string) *prometheus.Desc {
		return prometheus.NewDesc(name, help, labels, nil)
	}
	return &engineCollector{e: e, cacheDir: cacheDir, cache: &cacheSize{dir: cacheDir},
		info:     d("mcp_exec_build_info", "1, labelled with the server's version, runtime, Python and Go.", "version", "runtime", "python", "goversion"),
		ready:    d("mcp_exec_sandboxes_ready", "Sandboxes prepared ahead, waiting for a call (MCP_EXEC_POOL_SIZE)."),
		prepared: d("mcp_exec_sandboxes_total", "Sandboxes calls ran in, by how they were had: warm (prepared ahead), cold (prepared for the call), failed (could not be prepared).", "how"),
		tpl:      d("mcp_exec_templates", "Fork templates (MCP_EXEC_FORK), by state: idle or busy forking a call's sandbox.", "state"),
		forks:    d("mcp_exec_template_forks_total", "Sandboxes forked from a template."),
		builds:   d("mcp_exec_rootfs_builds_total", "Rootfs this server built or flattened into the cache (0 when it found one there)."),
		changed:  d("mcp_exec_rootfs_changed", "1 once a file of the served rootfs changed: calls are refused until a restart."),
		cacheB:   d("mcp_exec_rootfs_cache_bytes", "Disk used by the rootfs cache (MCP_EXEC_CACHE_MAX_MB bounds it), measured at most every few minutes."),
		cacheN:   d("mcp_exec_rootfs_cache_entries", "Rootfs in the cache, in use or not."),
	}
}

func (c *engineCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.info, c.ready, c.prepared, c.tpl, c.forks, c.builds, c.changed, c.cacheB, c.cacheN} {
		ch <- d
	}
}

func (c *engineCollector) Collect(ch chan<- prometheus.Metric) {
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	counter := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, v, labels...)
	}
	e := c.e
	gauge(c.info, 1, version, string(e.rt.Kind()), e.pythonVersion, goruntime.Version())
	stats, ready := e.pool.Stats()
	gauge(c.ready, float64(ready))
	counter(c.prepared, float64(stats.Warm), "warm")
	counter(c.prepared, float64(stats.Cold), "cold")
	counter(c.prepared, float64(stats.Failed), "failed")
	if lc, ok := e.rt.(runtime.Forker); ok {
		st := lc.Forking()
		gauge(c.tpl, float64(st.Idle), "idle")
		gauge(c.tpl, float64(st.Busy), "busy")
		counter(c.forks, float64(st.Forks))
	}
	counter(c.builds, float64(rootfs.Builds()))
	changed := 0.0
	if e.rootfsChanged() != nil {
		changed = 1
	}
	gauge(c.changed, changed)
	if bytes, n, ok := c.cache.get(); ok {
		gauge(c.cacheB, float64(bytes))
		gauge(c.cacheN, float64(n))
	}
}

// cacheSizeTTL is how long a measure of the cache is served: walking it
// costs a stat per file of every rootfs.
const cacheSizeTTL = 5 * time.Minute

// cacheSize measures the rootfs cache at most once per cacheSizeTTL.
type cacheSize struct {
	dir string

	mu      sync.Mutex
	at      time.Time
	bytes   int64
	entries int
	ok      bool
}

func (c *cacheSize) get() (bytes int64, entries int, ok bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if time.Since(c.at) > cacheSizeTTL {
		c.at = time.Now()
		list, err := rootfs.List(c.dir)
		c.ok = err == nil
		c.bytes, c.entries = 0, len(list)
		for _, e := range list {
			c.bytes += e.Bytes
		}
	}
	return c.bytes, c.entries, c.ok
}

// invalidate makes the next scrape measure again: the cache just changed.
func (c *cacheSize) invalidate() {
	c.mu.Lock()
	c.at = time.Time{}
	c.mu.Unlock()
}
