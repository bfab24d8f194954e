// Metric charts of runs, drawn with uPlot (vendor/uplot): the run page and the compare
// page build on this file.
//
// A RunSeries holds one run's points per key as the series API gives them (downsampled
// buckets with min/max/mean) plus the points pushed live since, and remembers the last
// step it holds per key, so a point already shown is never added twice. A MetricChart
// draws lines from one or more RunSeries: the (optionally EMA-smoothed) mean as the line
// and the bucket's min..max as a faint band, so a spike inside a bucket stays visible.
// Every chart is registered in window.armatureCharts[name] (the uPlot instance, whose
// `.data` is what is drawn), which the browser tests read.
"use strict";

window.armatureCharts = window.armatureCharts || {};

const ArmatureCharts = (() => {
  const PALETTE = ["#3454d1", "#d1495b", "#2a9d8f", "#e9a03b", "#8e5ad1", "#4a7c59",
    "#c2549d", "#5a6b7d", "#1f78b4", "#b15928"];
  const DASHES = [[], [6, 4], [2, 3], [10, 3, 2, 3]];
  const X_LABELS = { step: "iteration", env_steps: "env steps", wall_time: "wall time",
    episode: "episode" };
  const BUCKETS = 600;

  function matches(key, patterns) {
    return patterns.some((p) => (p.endsWith("*") ? key.startsWith(p.slice(0, -1)) : key === p));
  }

  class KeySeries {
    constructor() {
      this.x = []; this.min = []; this.max = []; this.mean = [];
      this.last = null; // the newest value (a bucket's mean is not the latest value)
      this.lastStep = 0;
    }
    push(x, min, max, mean, last) {
      this.last = last;
      if (x == null) return;
      if (this.x.length && x <= this.x[this.x.length - 1]) return; // x must grow
      this.x.push(x); this.min.push(min); this.max.push(max); this.mean.push(mean);
    }
  }

  class RunSeries {
    constructor(runId, patterns, xMode) {
      this.runId = runId;
      this.patterns = patterns;
      this.xMode = xMode;
      this.keys = new Map();
      this.lastStep = 0; // the highest step this holds, fetched or pushed
      this.loaded = false;
    }

    series(key) {
      if (!this.keys.has(key)) this.keys.set(key, new KeySeries());
      return this.keys.get(key);
    }

    // Everything stored after `lastStep`, from the series API (one request, all keys).
    async fetchMissing() {
      const params = new URLSearchParams({
        keys: this.patterns.join(","), x: this.xMode, buckets: String(BUCKETS),
      });
      if (this.loaded) params.set("start", String(this.lastStep + 1));
      const reply = await fetch(`/api/v1/runs/${this.runId}/series?${params}`,
        { headers: { Accept: "application/json" }, credentials: "same-origin" });
      if (!reply.ok) {
        const body = await reply.json().catch(() => ({}));
        throw new Error(`charts of run ${this.runId}: HTTP ${reply.status} ${body.detail || ""}`.trim());
      }
      this.addFetched(await reply.json());
    }

    addFetched(body) {
      const covered = body.last_step == null ? this.lastStep : body.last_step;
      for (const [key, s] of Object.entries(body.series || {})) {
        const ks = this.series(key);
        for (let i = 0; i < s.x.length; i++) ks.push(s.x[i], s.min[i], s.max[i], s.mean[i], s.last[i]);
      }
      // The reply holds every point up to `last_step`: a push at or below it is old.
      for (const ks of this.keys.values()) ks.lastStep = Math.max(ks.lastStep, covered);
      this.lastStep = Math.max(this.lastStep, covered);
      this.loaded = true;
    }

    // One pushed metrics message ({step, time, values}); true when it added a point.
    addPush(message) {
      const x = this.xOf(message);
      let added = false;
      for (const [key, value] of Object.entries(message.values)) {
        if (!matches(key, this.patterns)) continue;
        const ks = this.series(key);
        if (message.step <= ks.lastStep) continue; // fetched or pushed already
        ks.push(x, value, value, value, value);
        ks.lastStep = message.step;
        added = true;
      }
      this.lastStep = Math.max(this.lastStep, message.step);
      return added;
    }

    xOf(message) {
      if (this.xMode === "wall_time") return message.time;
      if (this.xMode === "env_steps") return message.values["charts/env_steps"] ?? null;
      return message.step;
    }

    latest(key) {
      const ks = this.keys.get(key);
      return ks ? ks.last : null;
    }

    origin() { // the first x, so wall time reads as time since the run's first point
      let first = Infinity;
      for (const ks of this.keys.values()) if (ks.x.length) first = Math.min(first, ks.x[0]);
      return Number.isFinite(first) ? first : 0;
    }
  }

  // TensorBoard's debiased exponential moving average; weight 0 leaves values as they are.
  function smooth(values, weight) {
    if (!weight) return values;
    const out = new Array(values.length);
    let last = 0, n = 0;
    for (let i = 0; i < values.length; i++) {
      const v = values[i];
      if (v == null || !Number.isFinite(v)) { out[i] = v; continue; }
      last = last * weight + (1 - weight) * v;
      n += 1;
      out[i] = last / (1 - Math.pow(weight, n));
    }
    return out;
  }

  function formatNumber(v) {
    if (v == null || !Number.isFinite(v)) return "—";
    const a = Math.abs(v);
    if (a !== 0 && (a >= 1e5 || a < 1e-3)) return v.toExponential(2);
    return Number(v.toPrecision(4)).toString();
  }

  function formatDuration(seconds) {
    if (seconds == null || !Number.isFinite(seconds)) return "—";
    const s = Math.max(0, Math.round(seconds));
    const h = Math.floor(s / 3600), m = Math.floor((s % 3600) / 60), r = s % 60;
    const two = (n) => String(n).padStart(2, "0");
    return h ? `${h}:${two(m)}:${two(r)}` : `${m}:${two(r)}`;
  }

  function withAlpha(hex, alpha) {
    const n = parseInt(hex.slice(1), 16);
    return `rgba(${n >> 16}, ${(n >> 8) & 255}, ${n & 255}, ${alpha})`;
  }

  // Tick steps of a counted axis: whole numbers only.
  const WHOLE_STEPS = [];
  for (let power = 1; power <= 1e12; power *= 10) WHOLE_STEPS.push(power, 2 * power, 5 * power);

  // A y axis as wide as its longest tick label (and its title), so none is cut off.
  function fitLabels(u, values, axisIndex) {
    const longest = Math.max(0, ...(values || []).map((v) => String(v).length));
    const titled = u.axes[axisIndex].label ? 18 : 0;
    return Math.max(40, 14 + 7 * longest + titled);
  }

  // One chart. `linesFor()` answers the lines to draw now: [{store, key, label, color,
  // dash, scale}]; when that list changes (a new horizon, a run's data arrives) the
  // uPlot instance is rebuilt, otherwise only its data is replaced.
  class MetricChart {
    constructor(element, spec, view) {
      this.element = element;
      this.spec = spec; // {name, title, yRange?, scales?}
      this.view = view; // {xMode, smoothing}
      this.plot = null;
      this.signature = "";
      this.lines = [];
    }

    render() {
      const lines = this.spec.linesFor();
      const signature = this.view.xMode + "|" + lines.map((l) => `${l.label}:${l.scale || "y"}`).join(",");
      if (signature !== this.signature) this.build(lines, signature);
      this.plot.setData(this.data());
    }

    data() {
      const tables = this.lines.map((line) => {
        const ks = line.store.keys.get(line.key) || new KeySeries();
        const origin = this.view.xMode === "wall_time" ? line.store.origin() : 0;
        const x = origin ? ks.x.map((v) => v - origin) : ks.x.slice();
        return [x, smooth(ks.mean, this.view.smoothing), ks.min.slice(), ks.max.slice()];
      });
      if (!tables.length) return [[]];
      return tables.length === 1 ? tables[0] : uPlot.join(tables);
    }

    build(lines, signature) {
      this.lines = lines;
      this.signature = signature;
      if (this.plot) this.plot.destroy();
      const series = [{ label: X_LABELS[this.view.xMode],
        value: (u, v) => (this.view.xMode === "wall_time" ? formatDuration(v) : formatNumber(v)) }];
      const bands = [];
      const scales = { x: { time: false }, y: this.spec.yRange ? { range: this.spec.yRange } : {} };
      const axes = [
        { label: X_LABELS[this.view.xMode],
          // Iterations and env steps count: a chart of a few points has ticks 1, 2, 3.
          ...(this.view.xMode === "wall_time" ? {} : { incrs: WHOLE_STEPS }),
          values: (u, ticks) => ticks.map((v) => (this.view.xMode === "wall_time" ? formatDuration(v) : formatNumber(v))) },
        { scale: "y", values: (u, ticks) => ticks.map(formatNumber), size: fitLabels },
      ];
      lines.forEach((line) => {
        const scale = line.scale || "y";
        if (scale !== "y" && !scales[scale]) {
          scales[scale] = {};
          axes.push({ scale, side: 1, values: (u, ticks) => ticks.map(formatNumber), size: fitLabels,
            grid: { show: false }, label: line.label });
        }
        const base = series.length;
        // Points where they are few (uPlot's own rule): a one-point series is seen.
        series.push({ label: line.label, stroke: line.color, dash: line.dash, width: 1.6,
          scale, spanGaps: true, points: { size: 5 }, value: (u, v) => formatNumber(v) });
        const edge = { label: `${line.label} min`, stroke: "transparent", width: 0, scale,
          spanGaps: true, points: { show: false }, value: (u, v) => formatNumber(v) };
        series.push({ ...edge }, { ...edge, label: `${line.label} max` });
        bands.push({ series: [base + 2, base + 1], fill: withAlpha(line.color, 0.15) });
        line.meanIndex = base; line.minIndex = base + 1; line.maxIndex = base + 2;
      });
      const width = Math.max(240, this.element.clientWidth || 400);
      this.plot = new uPlot({
        width, height: 200, series, bands, scales, axes,
        cursor: { sync: { key: "armature" } },
        legend: { live: true },
      }, [[]], this.element);
      this.plot.armature = { name: this.spec.name, lines: lines.map((l) => ({
        label: l.label, key: l.key, run: l.store.runId,
        mean: l.meanIndex, min: l.minIndex, max: l.maxIndex })) };
      // The band edges' rows would crowd the legend: the band itself shows them.
      const rows = this.plot.root.querySelectorAll(".u-legend .u-series");
      lines.forEach((line) => {
        for (const i of [line.minIndex, line.maxIndex]) if (rows[i]) rows[i].style.display = "none";
      });
      window.armatureCharts[this.spec.name] = this.plot;
    }

    resize() {
      if (this.plot) this.plot.setSize({ width: Math.max(240, this.element.clientWidth), height: 200 });
    }
  }

  // A chart's box: <figure data-chart=name><figcaption>title</figcaption><div class=plot>.
  function chartFigure(spec) {
    const box = document.createElement("figure");
    box.className = "chart";
    box.dataset.chart = spec.name;
    const caption = document.createElement("figcaption");
    caption.textContent = spec.title;
    const plot = document.createElement("div");
    plot.className = "plot";
    box.append(caption, plot);
    return box;
  }

  // Redraws at most every `ms`, however many pushes arrive in between.
  function throttled(fn, ms) {
    let timer = null;
    return () => {
      if (timer) return;
      timer = setTimeout(() => { timer = null; fn(); }, ms);
    };
  }

  // The smoothing slider and the x-axis choice shared by every chart of a page.
  function bindControls(form, view, onChange) {
    const smoothing = form.querySelector("[name=smoothing]");
    const shown = form.querySelector("[data-smoothing-value]");
    const xMode = form.querySelector("[name=x]");
    form.addEventListener("submit", (event) => event.preventDefault()); // nothing to send
    smoothing.addEventListener("input", () => {
      view.smoothing = Number(smoothing.value);
      if (shown) shown.textContent = view.smoothing.toFixed(2);
      onChange("smoothing");
    });
    xMode.addEventListener("change", () => { view.xMode = xMode.value; onChange("x"); });
    view.smoothing = Number(smoothing.value);
    view.xMode = xMode.value;
  }

  return { RunSeries, MetricChart, PALETTE, DASHES, formatNumber, formatDuration,
    throttled, bindControls, matches, chartFigure };
})();
