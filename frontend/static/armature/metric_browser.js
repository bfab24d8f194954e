// "All metrics": every key the runs logged, one chart per key (a line per run), grouped
// into sections by the key's prefix (`losses/…`, `bc/…`, as W&B's workspace groups
// them) and filtered by a search box. The run page and the compare page build one.
//
// Sections start closed and a section's charts are built when it is first opened (a run
// may log a hundred keys); a search opens the sections holding a match. Keys under
// `episodes/` are stored per episode, not per iteration, and are charted apart.
// Every chart registers as window.armatureCharts["all:<key>"], which the tests read.
"use strict";

const ArmatureMetricBrowser = (() => {
  const { RunSeries, MetricChart, PALETTE, throttled } = ArmatureCharts;
  const APART = "episodes/";
  const NO_PREFIX = "(no prefix)";

  const prefixOf = (key) => (key.includes("/") ? key.slice(0, key.indexOf("/")) : NO_PREFIX);
  // The series API's patterns for these keys: a prefix's keys at once, a bare key alone.
  const patternsFor = (keys) => [...new Set(keys.map((k) => (k.includes("/") ? `${prefixOf(k)}/*` : k)))];

  async function loggedKeys(runId) {
    const reply = await fetch(`/api/v1/runs/${runId}/latest`, { credentials: "same-origin" });
    if (!reply.ok) throw new Error(`metrics of run ${runId}: HTTP ${reply.status}`);
    const body = await reply.json();
    return Object.keys(body.values || {}).filter((key) => !key.startsWith(APART));
  }

  class MetricBrowser {
    // runs: [{run, label}]; view: {xMode, smoothing}, shared with the page's other charts.
    constructor(root, runs, view) {
      this.root = root;
      this.runs = runs;
      this.view = view;
      this.keys = new Set();
      this.stores = [];
      this.groups = new Map(); // prefix -> {details, grid, keys: Set, charts: Map}
      this.search = root.querySelector("input[type=search]");
      this.count = root.querySelector("[data-count]");
      this.list = root.querySelector("[data-groups]");
      this.loading = null;
      this.render = throttled(() => this.draw(), 50);
      this.search.addEventListener("input", () => this.filter());
    }

    // Every run's keys and their series; again after a new prefix or a missed push.
    load() {
      if (this.loading) { this.again = true; return this.loading; }
      this.loading = (async () => {
        do {
          this.again = false;
          const found = (await Promise.all(this.runs.map((r) => loggedKeys(r.run)))).flat();
          found.forEach((key) => this.keys.add(key));
          const patterns = patternsFor([...this.keys]);
          this.stores = this.runs.map((r) => new RunSeries(r.run, patterns, this.view.xMode));
          // No key logged yet: nothing to ask for (the first push brings one and loads).
          if (patterns.length) await Promise.all(this.stores.map((store) => store.fetchMissing()));
        } while (this.again);
        this.layout();
      })().catch((error) => {
        this.count.textContent = `${error.message}; reload to try again`;
      }).finally(() => { this.loading = null; });
      return this.loading;
    }

    // A live point of the one run this browser shows (the run page).
    addPush(message) {
      const store = this.stores[0];
      if (!store || this.loading) return;
      const keys = Object.keys(message.values).filter((key) => !key.startsWith(APART));
      const unknown = keys.filter((key) => !this.keys.has(key));
      const covered = (key) => store.patterns.some((p) => (p.endsWith("*") ? key.startsWith(p.slice(0, -1)) : key === p));
      if (keys.some((key) => !covered(key)) || message.step > store.lastStep + 1) {
        this.load(); // a key of a new prefix, or points missed: fetch again
        return;
      }
      store.addPush(message);
      if (unknown.length) { unknown.forEach((key) => this.keys.add(key)); this.layout(); }
      this.render();
    }

    setX() { this.load(); }

    layout() {
      const byPrefix = new Map();
      for (const key of [...this.keys].sort()) {
        const prefix = prefixOf(key);
        if (!byPrefix.has(prefix)) byPrefix.set(prefix, []);
        byPrefix.get(prefix).push(key);
      }
      for (const [prefix, keys] of [...byPrefix].sort(([a], [b]) => a.localeCompare(b))) {
        const group = this.groups.get(prefix) || this.addGroup(prefix);
        keys.forEach((key) => group.keys.add(key));
        group.summary.textContent = `${prefix} (${group.keys.size})`;
        if (group.details.open) this.buildCharts(group);
      }
      this.filter();
    }

    addGroup(prefix) {
      const details = document.createElement("details");
      details.className = "metric-group";
      details.dataset.group = prefix;
      const summary = document.createElement("summary");
      const grid = document.createElement("div");
      grid.className = "chart-grid";
      details.append(summary, grid);
      const group = { details, summary, grid, keys: new Set(), charts: new Map() };
      details.addEventListener("toggle", () => {
        if (details.open) { this.buildCharts(group); this.render(); }
      });
      // Sections in prefix order, whenever they appear.
      const after = [...this.list.children].find((d) => d.dataset.group.localeCompare(prefix) > 0);
      this.list.insertBefore(details, after || null);
      this.groups.set(prefix, group);
      return group;
    }

    buildCharts(group) {
      for (const key of [...group.keys].sort()) {
        if (group.charts.has(key)) continue;
        const spec = { name: `all:${key}`, title: key, linesFor: () => this.linesOf(key) };
        const box = ArmatureCharts.chartFigure(spec);
        box.dataset.key = key;
        const after = [...group.grid.children].find((f) => f.dataset.key.localeCompare(key) > 0);
        group.grid.insertBefore(box, after || null);
        const chart = new MetricChart(box.querySelector(".plot"), spec, this.view);
        chart.box = box;
        group.charts.set(key, chart);
      }
      this.filter();
    }

    linesOf(key) {
      return this.stores.map((store, i) => ({ store, key, label: this.runs[i].label,
        color: PALETTE[i % PALETTE.length], dash: [] })).filter((l) => l.store.keys.has(key));
    }

    // Keys holding the search text (case-insensitive); a search opens their sections.
    filter() {
      const text = this.search.value.trim().toLowerCase();
      let shown = 0;
      for (const group of this.groups.values()) {
        const matching = [...group.keys].filter((key) => key.toLowerCase().includes(text));
        shown += matching.length;
        group.details.hidden = matching.length === 0;
        if (text && matching.length && !group.details.open) group.details.open = true; // builds
        for (const [key, chart] of group.charts) chart.box.hidden = !matching.includes(key);
      }
      this.count.textContent = text ? `${shown} of ${this.keys.size} keys match` : `${this.keys.size} keys`;
      this.render();
    }

    draw() {
      for (const group of this.groups.values()) {
        if (!group.details.open || group.details.hidden) continue;
        for (const chart of group.charts.values()) {
          if (chart.box.hidden) continue;
          const fresh = !chart.plot;
          chart.render();
          if (fresh) chart.resize();
        }
      }
    }

    resize() {
      for (const group of this.groups.values()) for (const chart of group.charts.values()) chart.resize();
    }
  }

  return { MetricBrowser };
})();
