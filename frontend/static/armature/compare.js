// The compare page: the chosen runs' charts overlaid, one colour per run (and one dash
// per planning horizon), from their stored series.
"use strict";

(() => {
  const contextElement = document.getElementById("compare-context");
  if (!contextElement) return;
  const runs = JSON.parse(contextElement.textContent);
  const { RunSeries, MetricChart, PALETTE, DASHES, throttled } = ArmatureCharts;
  const HORIZON_KEY = /^rollout\/plan_success_rate_h(\d+)$/;
  const PATTERNS = [
    "rollout/success_rate", "rollout/plan_success_rate_h*", "rollout/episode_return",
    "losses/policy_loss", "losses/value_loss", "losses/entropy", "losses/approx_kl",
    "charts/env_steps",
  ];
  const view = { xMode: "step", smoothing: 0 };
  let stores = [];

  function horizonsOf(run, store) {
    const found = new Set(run.horizons);
    for (const key of store.keys.keys()) {
      const m = HORIZON_KEY.exec(key);
      if (m) found.add(Number(m[1]));
    }
    return [...found].sort((a, b) => a - b);
  }

  // One line per run (and per horizon where the chart has them), named "run 12": the
  // page's one legend above the charts names each run in full ("run 12 · exp r3").
  const short = (run) => `run ${run.run}`;
  function perRun(key) {
    return () => stores.map((store, i) => ({
      store, key, label: short(runs[i]), color: PALETTE[i % PALETTE.length], dash: [],
    }));
  }
  const SPECS = [
    { name: "compare_success", title: "Success rate", yRange: [0, 1], linesFor: perRun("rollout/success_rate") },
    { name: "compare_success_horizon", title: "Success rate per planning horizon", yRange: [0, 1],
      linesFor: () => stores.flatMap((store, i) => horizonsOf(runs[i], store).map((h, j) => ({
        store, key: `rollout/plan_success_rate_h${h}`, label: `${short(runs[i])} h${h}`,
        color: PALETTE[i % PALETTE.length], dash: DASHES[j % DASHES.length] }))) },
    { name: "compare_return", title: "Episode return", linesFor: perRun("rollout/episode_return") },
    { name: "compare_policy_loss", title: "Policy loss", linesFor: perRun("losses/policy_loss") },
    { name: "compare_value_loss", title: "Value loss", linesFor: perRun("losses/value_loss") },
    { name: "compare_entropy", title: "Entropy", linesFor: perRun("losses/entropy") },
    { name: "compare_kl", title: "Approximate KL", linesFor: perRun("losses/approx_kl") },
  ];
  const charts = SPECS.map((spec) => {
    const box = ArmatureCharts.chartFigure(spec);
    document.getElementById("compare-charts").appendChild(box);
    return new MetricChart(box.querySelector(".plot"), spec, view);
  });
  const redraw = throttled(() => charts.forEach((chart) => chart.render()), 25);

  // Which metrics are shown: a checkbox per chart.
  const picks = document.getElementById("compare-metrics");
  for (const spec of SPECS) {
    const label = document.createElement("label");
    const box = document.createElement("input");
    box.type = "checkbox";
    box.checked = true;
    box.value = spec.name;
    label.append(box, ` ${spec.title}`);
    picks.appendChild(label);
  }
  picks.addEventListener("change", (event) => {
    const figure = document.querySelector(`figure[data-chart="${event.target.value}"]`);
    figure.hidden = !event.target.checked;
    charts.forEach((chart) => chart.resize());
  });
  window.addEventListener("resize", throttled(() => charts.forEach((c) => c.resize()), 200));

  // Run labels hold experiment names (people's text): DOM calls, never markup.
  const legend = document.getElementById("compare-legend");
  legend.replaceChildren(...runs.map((run, i) => {
    const item = document.createElement("li");
    item.dataset.run = String(run.run);
    const swatch = document.createElement("span");
    swatch.className = "swatch";
    swatch.style.background = PALETTE[i % PALETTE.length];
    const link = document.createElement("a");
    link.href = `/runs/${encodeURIComponent(run.run)}/`;
    link.textContent = run.label;
    const state = document.createElement("span");
    state.className = "muted";
    state.textContent = run.state;
    item.append(swatch, link, " ", state);
    return item;
  }));

  async function load() {
    stores = runs.map((run) => new RunSeries(run.run, PATTERNS, view.xMode));
    await Promise.all(stores.map((store) => store.fetchMissing().catch((error) => console.warn(error))));
    redraw();
  }

  // Every key any of the runs logged, a line per run.
  const allMetrics = new ArmatureMetricBrowser.MetricBrowser(
    document.getElementById("all-metrics"), runs.map((run) => ({ run: run.run, label: short(run) })), view);
  window.addEventListener("resize", throttled(() => allMetrics.resize(), 200));

  ArmatureCharts.bindControls(document.getElementById("chart-controls"), view, (what) => {
    if (what === "x") { load(); allMetrics.setX(); } else { redraw(); allMetrics.render(); }
  });
  window.armatureCompare = { stores: () => stores, view }; // for the browser tests
  load();
  allMetrics.load();
})();
