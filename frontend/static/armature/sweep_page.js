// A sweep's charts, drawn with uPlot: the objective against each parameter (a scatter,
// a log axis for a loguniform range, choices by position), and the best objective so
// far after each trial. The data comes with the page (json_script) and again in every
// JSON frame of the sweep's socket (controlplane/sweeps/consumers.py), which the page
// takes before htmx sees it. Every chart is registered in window.armatureCharts[name]
// (the uPlot instance, whose `.data` is what is drawn), which the browser tests read.
"use strict";

window.armatureCharts = window.armatureCharts || {};

(() => {
  const box = document.getElementById("sweep-charts");
  const empty = document.getElementById("sweep-charts-empty");
  const socketElement = document.getElementById("sweep-live");
  let data = JSON.parse(document.getElementById("sweep-charts-data").textContent);
  const plots = new Map(); // chart name -> uPlot

  function figure(name, title) {
    const shown = document.createElement("figure");
    shown.className = "chart";
    shown.dataset.chart = name;
    const caption = document.createElement("figcaption");
    caption.textContent = title; // a key path: text, never markup
    const plot = document.createElement("div");
    plot.className = "plot";
    shown.append(caption, plot);
    box.appendChild(shown);
    return plot;
  }

  // [xs ascending, ys] of the trials with an objective; a choice is its position.
  function scatter(key) {
    const choices = data.choices[key];
    const points = data.trials
      .map((trial) => [choices ? choices.findIndex((c) => c === trial.params[key]) : trial.params[key],
        trial.value])
      .filter(([x, y]) => x != null && x !== -1 && y != null)
      .sort((a, b) => a[0] - b[0]);
    return [points.map((p) => p[0]), points.map((p) => p[1])];
  }

  function bestSoFar() {
    return [data.best_so_far.map((p) => p[0]), data.best_so_far.map((p) => p[1])];
  }

  function make(name, title, rows, options) {
    const width = Math.max(240, box.clientWidth / 2 - 16 || 400);
    const plot = new uPlot({
      width, height: 200,
      scales: { x: { time: false, distr: options.log ? 3 : 1 } },
      // Trial numbers and choices' positions are whole: no tick between two of them.
      axes: [{ label: options.x, values: options.values, incrs: options.whole ? [1, 2, 5, 10, 20, 50, 100] : undefined },
        { label: data.metric }],
      series: [{ label: options.x }, {
        label: options.y, stroke: "#3454d1", width: options.line ? 2 : 0,
        paths: options.line ? undefined : () => null,
        points: { show: true, size: 7, fill: "#3454d1" },
      }],
    }, rows, figure(name, title));
    plot.armature = { name };
    plots.set(name, plot);
    window.armatureCharts[name] = plot;
  }

  function draw() {
    const any = data.trials.length > 0;
    empty.hidden = any;
    if (!any) return;
    for (const key of data.keys) {
      const name = `param:${key}`;
      if (plots.has(name)) { plots.get(name).setData(scatter(key)); continue; }
      const choices = data.choices[key];
      const log = data.log.includes(key);
      let values; // a choice's own value at its position; a log axis's small numbers in full
      if (choices) values = (u, ticks) => ticks.map((t) => (Number.isInteger(t) ? String(choices[t] ?? "") : ""));
      else if (log) values = (u, ticks) => ticks.map((t) => (t == null ? "" : String(Number(t.toPrecision(2)))));
      make(name, key, scatter(key), { x: key, y: "objective", log, whole: Boolean(choices), values });
    }
    if (plots.has("best-so-far")) plots.get("best-so-far").setData(bestSoFar());
    else make("best-so-far", `best ${data.metric} so far (${data.direction})`, bestSoFar(),
      { x: "trial", y: "best so far", line: true, whole: true });
  }

  socketElement.addEventListener("htmx:wsBeforeMessage", (event) => {
    const text = event.detail.message;
    if (typeof text !== "string" || text[0] !== "{") return;
    event.preventDefault();
    const frame = JSON.parse(text);
    if (frame.type !== "sweep") return;
    data = frame;
    draw();
  });
  draw();
})();
