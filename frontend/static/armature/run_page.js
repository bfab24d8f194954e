// One run's page: live charts, the per-task heatmap and table, the summary strip.
//
// The page's socket (/ws/runs/<id>/, opened by htmx's ws extension for the header and
// events) also carries JSON frames: {"type": "metrics", step, time, values} and
// {"type": "progress", step, total}. This script takes them before htmx does.
//
// No gap, no duplicate: at load and after every (re)connect the page fetches what is
// stored after the last step it holds, and pushes that arrive meanwhile wait in a buffer;
// once the fetch is in, buffered pushes at or below the fetched last step are dropped and
// the rest applied. A push that skips a step (the channel layer dropped some) triggers
// the same catch-up.
"use strict";

(() => {
  const contextElement = document.getElementById("run-chart-context");
  if (!contextElement) return;
  const context = JSON.parse(contextElement.textContent);
  const { RunSeries, MetricChart, PALETTE, DASHES, formatNumber, formatDuration, throttled } = ArmatureCharts;

  const SUCCESS = "rollout/success_rate";
  const TASK_KEY = /^rollout\/success_rate_task_/;
  const OFF_POLICY = context.algorithm === "rlpd";
  const PATTERNS = OFF_POLICY ? [
    SUCCESS, "rollout/unassisted_success_rate", "rollout/episode_return", "rlpd/*",
    "interventions/rate", "interventions/held_steps", "buffers/*", "charts/SPS",
    "charts/update_rate", "charts/env_steps",
    "device/*",
  ] : [
    SUCCESS, "rollout/plan_success_rate_h*", "rollout/episode_return", "bc/*",
    "losses/policy_loss", "losses/value_loss", "losses/entropy", "losses/approx_kl*",
    "losses/clip_fraction*", "losses/kl_reference", "losses/abs_log_ratio_token",
    "policy/entropy_dim*", "rollout/informative_group_share", "charts/SPS",
    "charts/iteration_seconds",
    "charts/learning_rate", "charts/env_steps",
    ...(context.interventions !== "none"
      ? ["interventions/rate", "interventions/held_steps", "rollout/unassisted_success_rate"] : []),
    "device/*",
  ];
  const view = { xMode: "step", smoothing: 0 };
  let store = new RunSeries(context.run, PATTERNS, view.xMode);

  // ----- charts ----------------------------------------------------------------------
  const horizons = () =>
    [...new Set([...context.horizons, ...indices("rollout/plan_success_rate_h")])].sort((a, b) => a - b);
  const line = (key, label, i, extra = {}) => ({ store, key, label, color: PALETTE[i % PALETTE.length], dash: [], ...extra });
  // Lines of metrics only some runs report (a per-token ratio's, a KL anchor's): drawn
  // once the run has them.
  const reported = (...lines) => lines.filter((l) => store.keys.has(l.key));
  // The indices the run reports a family of metrics at (`prefix{i}`), ascending: its
  // horizons' success, each action dim's entropy, each denoising step's KL and clips.
  function indices(prefix) {
    const found = [];
    for (const key of store.keys.keys()) {
      if (key.startsWith(prefix) && /^\d+$/.test(key.slice(prefix.length))) {
        found.push(Number(key.slice(prefix.length)));
      }
    }
    return found.sort((a, b) => a - b);
  }
  // A chart of one line per index the run reports (`prefix{i}`), shown once it has one.
  const indexedChart = (name, title, prefix, label) => ({ name, title,
    shown: () => indices(prefix).length > 0,
    linesFor: () => indices(prefix).map((i, n) => line(`${prefix}${i}`, `${label} ${i}`, n)) });
  const SPECS = [
    { name: "success_horizon", title: "Success rate per planning horizon", yRange: [0, 1],
      linesFor: () => horizons().map((h, i) => line(`rollout/plan_success_rate_h${h}`, `h${h}`, i)) },
    { name: "success", title: "Success rate", yRange: [0, 1], linesFor: () => [line(SUCCESS, "success", 0),
      // what the policy achieved on its own, where operators took over some episodes
      ...(context.interventions !== "none"
        ? [line("rollout/unassisted_success_rate", "without intervention", 1)] : [])] },
    { name: "return", title: "Episode return", linesFor: () => [line("rollout/episode_return", "return", 2)] },
    // An SFT (behaviour cloning) run's loss: the demos' token cross-entropy.
    { name: "bc_loss", title: "Behaviour cloning loss", linesFor: () => [
      line("bc/loss", "loss", 0), line("bc/nll_per_action_dim", "NLL per action dim", 1, { scale: "value" })] },
    { name: "loss", title: "Policy and value loss", linesFor: () => [
      line("losses/policy_loss", "policy loss", 0), line("losses/value_loss", "value loss", 1, { scale: "value" })] },
    { name: "entropy", title: "Entropy", linesFor: () => [line("losses/entropy", "entropy", 4)] },
    // `KL` is what target_kl reads: per token with the per-token ratio, else per chunk.
    { name: "kl", title: "Approximate KL", linesFor: () => [line("losses/approx_kl", "KL", 3),
      ...reported(line("losses/approx_kl_token", "per token", 0),
        line("losses/approx_kl_chunk", "per chunk", 1),
        line("losses/kl_reference", "to the start policy", 4))] },
    { name: "clip", title: "Clip fraction", linesFor: () => [
      line("losses/clip_fraction", "clip fraction", 6),
      ...reported(line("losses/clip_fraction_low", "below 1 - low", 0),
        line("losses/clip_fraction_high", "above 1 + high", 1))] },
    { name: "log_ratio", title: "Mean |log-ratio| per token",
      shown: () => store.keys.has("losses/abs_log_ratio_token"),
      linesFor: () => reported(line("losses/abs_log_ratio_token", "|log r| per token", 2)) },
    indexedChart("entropy_dims", "Token entropy per action dim (nats)", "policy/entropy_dim", "dim"),
    // A π0 with a token per denoising step (`flow.step_tokens`): the trust region per step.
    indexedChart("kl_steps", "Approximate KL per denoising step", "losses/approx_kl_step", "step"),
    indexedChart("clip_steps", "Clip fraction per denoising step", "losses/clip_fraction_step", "step"),
    { name: "informative_groups", title: "Informative groups (outcomes differ) / all groups",
      yRange: [0, 1], shown: () => store.keys.has("rollout/informative_group_share"),
      linesFor: () => reported(line("rollout/informative_group_share", "informative share", 5)) },
    { name: "throughput", title: "Throughput", linesFor: () => [
      line("charts/SPS", "env steps/s", 5), line("charts/iteration_seconds", "iteration s", 7, { scale: "seconds" })] },
    { name: "learning_rate", title: "Learning rate", linesFor: () => [line("charts/learning_rate", "learning rate", 8)] },
  ];
  const INTERVENTIONS = { name: "interventions", title: "Intervention rate", yRange: [0, 1], linesFor: () => [
    line("interventions/rate", "intervened steps", 7),
    // decisions a safety rule held still: recorded, and no demonstration
    line("interventions/held_steps", "held still (decisions)", 3, { scale: "count" })] };
  if (context.interventions !== "none") SPECS.push(INTERVENTIONS); // left out of the policy loss
  // RLPD (off-policy): Q values, temperature, interventions and buffer fill instead of
  // the policy-gradient losses; no planning horizons.
  const OFF_POLICY_SPECS = [
    { name: "success", title: "Success rate", yRange: [0, 1], linesFor: () => [
      line(SUCCESS, "success", 0), line("rollout/unassisted_success_rate", "without intervention", 1)] },
    { name: "return", title: "Episode return", linesFor: () => [line("rollout/episode_return", "return", 2)] },
    { name: "q_values", title: "Q values", linesFor: () => [
      line("rlpd/q_predicted", "predicted Q", 0), line("rlpd/q_target", "target Q", 1)] },
    { name: "rlpd_loss", title: "Critic and actor loss", linesFor: () => [
      line("rlpd/critic_loss", "critic loss", 3), line("rlpd/actor_loss", "actor loss", 4, { scale: "value" })] },
    { name: "temperature", title: "Temperature and entropy", linesFor: () => [
      line("rlpd/temperature", "temperature", 5), line("rlpd/entropy", "entropy", 6, { scale: "value" })] },
    INTERVENTIONS,
    { name: "buffers", title: "Buffer fill", linesFor: () => [
      line("buffers/online", "online", 0), line("buffers/demo", "demo", 1, { scale: "value" })] },
    { name: "throughput", title: "Throughput", linesFor: () => [
      line("charts/SPS", "env steps/s", 5), line("charts/update_rate", "updates/s", 8, { scale: "value" })] },
  ];
  // A run on a GPU reports its memory each iteration (trainer/devices.py); the charts
  // stay hidden for runs that compute on the CPU, which report none. A run of one
  // computing process reports plain `device/...` keys; a run of several reports each
  // process's under its name (`device/actor-1/...`, `device/rollout-0/...`), charted one
  // line per process, a process keeping its colour across the charts.
  const GPU_MEMORY = "device/memory_allocated_gb";
  const DEVICE = { name: "device", title: "GPU memory (GiB) and utilisation",
    shown: () => store.keys.has(GPU_MEMORY), linesFor: () => [
      line(GPU_MEMORY, "allocated GiB", 0), line("device/memory_reserved_gb", "reserved GiB", 1),
      line("device/memory_peak_gb", "peak GiB", 3),
      ...(store.keys.has("device/utilization")
        ? [line("device/utilization", "utilisation %", 6, { scale: "value" })] : [])] };
  const PROCESS_DEVICE_KEY = /^device\/([^/]+)\/memory_allocated_gb$/;
  const processOrder = (name) => [name.replace(/-\d+$/, ""), Number(name.split("-").pop())];
  function deviceProcesses() {
    const names = [];
    for (const key of store.keys.keys()) {
      const m = PROCESS_DEVICE_KEY.exec(key);
      if (m) names.push(m[1]);
    }
    return names.sort((a, b) => {
      const [kindA, rankA] = processOrder(a), [kindB, rankB] = processOrder(b);
      return kindA === kindB ? rankA - rankB : kindA.localeCompare(kindB);
    });
  }
  const perProcess = (name, title, metric, extra = {}) => ({ name, title, ...extra,
    shown: () => deviceProcesses().some((p) => store.keys.has(`device/${p}/${metric}`)),
    linesFor: () => deviceProcesses().map((p, i) => line(`device/${p}/${metric}`, p, i))
      .filter((l) => store.keys.has(l.key)) });
  const PROCESS_DEVICE = [
    perProcess("device_allocated", "GPU memory allocated per process (GiB)", "memory_allocated_gb"),
    perProcess("device_reserved", "GPU memory reserved per process (GiB)", "memory_reserved_gb"),
    perProcess("device_peak", "GPU memory peak per process (GiB)", "memory_peak_gb"),
    perProcess("device_utilization", "GPU utilisation per process (%)", "utilization"),
  ];
  // With an operator, each finished episode's share of steps a human took, over the
  // run's episodes (stored at the episode's number, not an iteration: a store and an
  // x axis of its own, and its own catching up).
  const EPISODE_RATE = "episodes/intervention_rate";
  const episodes = context.interventions !== "none"
    ? new RunSeries(context.run, ["episodes/*"], "step") : null;
  const EPISODES = { name: "episode_interventions", title: "Intervention rate per episode",
    yRange: [0, 1], linesFor: () => [{ store: episodes, key: EPISODE_RATE,
      label: "human share of the episode", color: PALETTE[7], dash: [] }] };
  const episodeView = { xMode: "episode", get smoothing() { return view.smoothing; } };
  const specs = [...(OFF_POLICY ? OFF_POLICY_SPECS : SPECS), ...(episodes ? [EPISODES] : []),
    DEVICE, ...PROCESS_DEVICE];
  const charts = specs.map((spec) => {
    const box = ArmatureCharts.chartFigure(spec);
    document.getElementById("run-charts").appendChild(box);
    const chart = new MetricChart(box.querySelector(".plot"), spec,
      spec === EPISODES ? episodeView : view);
    chart.box = box;
    return chart;
  });
  // A panel is drawn once the run logged one of its keys: an SFT run shows no PPO
  // losses, a run on the CPU no GPU memory. "All metrics" below charts every key.
  const hasData = (spec) => spec.linesFor().some((l) => l.store.keys.has(l.key));
  const redraw = throttled(() => {
    let any = false;
    for (const chart of charts) {
      const shown = chart.spec.shown ? chart.spec.shown() : hasData(chart.spec);
      const appears = shown && chart.box.hidden;
      chart.box.hidden = !shown;
      any ||= shown;
      chart.render();
      if (appears) chart.resize(); // it was drawn while hidden, at no width
    }
    const empty = document.getElementById("charts-empty"); // gone once the page is left
    if (empty) empty.hidden = any;
    updateSummary();
  }, 25);
  const allMetrics = new ArmatureMetricBrowser.MetricBrowser(
    document.getElementById("all-metrics"), [{ run: context.run, label: context.label }], view);
  window.addEventListener("resize", throttled(() => {
    charts.forEach((c) => c.resize());
    allMetrics.resize();
    if (taskData) drawHeatmap();
  }, 200));

  // ----- catching up, then live --------------------------------------------------------
  let syncing = null; // the running catch-up, if any
  let syncAgain = false; // a reconnect happened while it ran: its snapshot may be too early
  let buffered = [];

  function requestSync() {
    if (syncing) { syncAgain = true; return; }
    syncing = (async () => {
      do {
        syncAgain = false;
        try {
          await store.fetchMissing();
          chartStatus("");
        } catch (error) {
          chartStatus(`${error.message}; retrying…`);
          await new Promise((resolve) => setTimeout(resolve, 2000));
          syncAgain = true;
        }
      } while (syncAgain);
      const waiting = buffered;
      buffered = [];
      syncing = null;
      for (const message of waiting) applyMetrics(message);
      redraw();
    })();
  }

  function chartStatus(text) {
    // Gone once the page is left: a catch-up a late reconnect started may end after it.
    const element = document.getElementById("charts-status");
    if (!element) return;
    element.textContent = text;
    element.hidden = !text;
  }

  let episodeSync = null; // the episodes' catching up, if running
  let episodesWaiting = [];
  function syncEpisodes() {
    if (!episodes || episodeSync) return;
    episodeSync = episodes.fetchMissing()
      .catch(() => new Promise((resolve) => setTimeout(resolve, 2000))) // then again
      .finally(() => {
        episodeSync = null;
        const waiting = episodesWaiting;
        episodesWaiting = [];
        waiting.forEach(applyEpisodes);
        redraw();
      });
  }
  function applyEpisodes(message) {
    if (!episodes) return;
    if (episodeSync || !episodes.loaded || message.step > episodes.lastStep + 1) {
      episodesWaiting.push(message); // missed some, or not loaded yet: catch up first
      syncEpisodes();
      return;
    }
    episodes.addPush(message);
    redraw();
  }

  function applyMetrics(message) {
    if (Object.keys(message.values).every((key) => key.startsWith("episodes/"))) {
      applyEpisodes(message);
      return;
    }
    if (syncing) { buffered.push(message); return; }
    if (store.loaded && message.step > store.lastStep + 1) { // missed some: catch up first
      buffered.push(message);
      requestSync();
      return;
    }
    store.addPush(message);
    allMetrics.addPush(message);
    if (Object.keys(message.values).some((k) => TASK_KEY.test(k))) refreshTasks();
    redraw();
  }

  function onFrame(frame) {
    if (frame.type === "metrics") applyMetrics(frame);
    else if (frame.type === "progress") { progress = { step: frame.step, total: frame.total }; updateSummary(); }
  }

  const socketElement = document.querySelector("[ws-connect]");
  socketElement.addEventListener("htmx:wsBeforeMessage", (event) => {
    const text = event.detail.message;
    if (typeof text !== "string" || text[0] !== "{") return; // an htmx fragment
    event.preventDefault();
    onFrame(JSON.parse(text));
  });
  socketElement.addEventListener("htmx:wsOpen", () => {
    requestSync(); syncEpisodes(); refreshTasks(); allMetrics.load();
  });
  socketElement.addEventListener("htmx:wsAfterMessage", () => updateSummary());

  ArmatureCharts.bindControls(document.getElementById("chart-controls"), view, (what) => {
    if (what === "x") { // other x values: fetch everything again in the new unit
      store = new RunSeries(context.run, PATTERNS, view.xMode);
      buffered = [];
      requestSync();
      allMetrics.setX();
    }
    redraw();
    allMetrics.render();
  });

  // ----- summary strip -----------------------------------------------------------------
  const clockOffset = Date.parse(context.now) - Date.now(); // server clock minus ours
  let progress = { step: context.progress_step, total: context.progress_total };
  let latest = {}; // key -> value, from /latest, then from pushes

  function header() { return document.getElementById("run-header")?.dataset || {}; }

  function updateSummary() {
    const h = header();
    const step = Math.max(progress.step || 0, Number(h.step || 0));
    const total = Math.max(progress.total || 0, Number(h.total || 0));
    const started = h.startedAt ? Date.parse(h.startedAt) : null;
    const finished = h.finishedAt ? Date.parse(h.finishedAt) : null;
    const now = Date.now() + clockOffset;
    const elapsed = started ? ((finished || now) - started) / 1000 : null;
    const active = h.active === "true";
    const success = store.latest(SUCCESS) ?? latest[SUCCESS];
    const envSteps = store.latest("charts/env_steps") ?? latest["charts/env_steps"];
    let eta = "—";
    if (active && elapsed && step > 0 && total > step) eta = formatDuration((elapsed / step) * (total - step));
    else if (!active && h.state === "succeeded") eta = "done";
    set("state", h.state || context.state);
    set("elapsed", formatDuration(elapsed));
    set("iteration", total ? `${step} / ${total}` : String(step || "—"));
    // Two decimals, as Home, the runs list and the run's header show it.
    if (success != null) set("success", success.toFixed(2));
    set("env-steps", envSteps == null ? "—" : Math.round(envSteps).toLocaleString("en"));
    set("eta", eta);
  }
  function set(field, text) {
    const element = document.querySelector(`#run-summary [data-field="${field}"]`);
    if (element && element.textContent !== text) element.textContent = text;
  }
  setInterval(updateSummary, 1000);

  async function loadLatest() {
    const reply = await fetch(`/api/v1/runs/${context.run}/latest`, { credentials: "same-origin" })
      .catch(() => null); // the summary fills in from pushes anyway
    if (!reply || !reply.ok) return;
    const body = await reply.json();
    for (const [key, point] of Object.entries(body.values || {})) latest[key] = point.value;
    updateSummary();
  }

  // ----- per-task success: heatmap and table -------------------------------------------
  const TASK_BUCKETS = 200;
  let tasksLoading = false, tasksAgain = false;
  let taskSort = { column: "task", descending: false };
  let taskData = null;

  const refreshTasks = throttled(async () => {
    if (tasksLoading) { tasksAgain = true; return; }
    tasksLoading = true;
    try {
      const reply = await fetch(`/api/v1/runs/${context.run}/success?buckets=${TASK_BUCKETS}`, { credentials: "same-origin" });
      if (reply.ok) { taskData = await reply.json(); drawHeatmap(); drawTaskTable(); }
    } catch (error) { // the server is away: the next reconnect or push asks again
      console.warn(error);
    } finally {
      tasksLoading = false;
      if (tasksAgain) { tasksAgain = false; refreshTasks(); }
    }
  }, 300);

  function taskIds() {
    return Object.keys(taskData?.tasks || {}).sort((a, b) => Number(a) - Number(b) || a.localeCompare(b));
  }

  function rateColour(rate) { // red (0) → amber → green (1)
    const hue = Math.max(0, Math.min(1, rate)) * 120;
    return `hsl(${hue}, 65%, 48%)`;
  }

  function drawHeatmap() {
    const canvas = document.getElementById("task-heatmap");
    const empty = document.getElementById("tasks-empty");
    if (!canvas || !empty) return; // the page was left
    const tasks = taskIds();
    empty.hidden = tasks.length > 0;
    canvas.hidden = tasks.length === 0;
    if (!tasks.length) return;
    const label = 64, rowHeight = 22, top = 4;
    const width = Math.max(300, canvas.parentElement.clientWidth); // its box has no padding
    const ratio = window.devicePixelRatio || 1;
    canvas.style.width = `${width}px`;
    canvas.style.height = `${top + rowHeight * tasks.length + 18}px`;
    canvas.width = width * ratio;
    canvas.height = (top + rowHeight * tasks.length + 18) * ratio;
    const g = canvas.getContext("2d");
    g.scale(ratio, ratio);
    g.font = "12px system-ui, sans-serif";
    let lo = Infinity, hi = -Infinity;
    for (const t of tasks) for (const x of taskData.tasks[t].x) { lo = Math.min(lo, x); hi = Math.max(hi, x); }
    const span = Math.max(1, hi - lo + 1);
    // One cell per bucket: a step wide while the server sends every point, the
    // bucket's share of the steps once it downsamples.
    const stepsPerCell = Math.max(1, Math.ceil(span / TASK_BUCKETS));
    const plotWidth = width - label - 8;
    const cells = [];
    tasks.forEach((task, row) => {
      const s = taskData.tasks[task];
      const y = top + row * rowHeight;
      g.fillStyle = "#6b7383";
      g.fillText(`task ${task}`, 4, y + 15);
      g.fillStyle = "#f1f3f6";
      g.fillRect(label, y, plotWidth, rowHeight - 3);
      s.x.forEach((step, i) => {
        const x0 = label + (Math.max(0, step - stepsPerCell + 1 - lo) / span) * plotWidth;
        const w = Math.max(2, (stepsPerCell / span) * plotWidth);
        g.fillStyle = rateColour(s.rate[i]);
        g.fillRect(x0, y, w, rowHeight - 3);
        cells.push({ x0, x1: x0 + w, y0: y, y1: y + rowHeight, task, step, rate: s.rate[i],
          successes: s.successes[i], episodes: s.episodes[i] });
      });
    });
    g.fillStyle = "#6b7383";
    g.fillText(`iteration ${lo}`, label, top + rowHeight * tasks.length + 14);
    const end = `${hi}`;
    g.fillText(end, width - 8 - g.measureText(end).width, top + rowHeight * tasks.length + 14);
    canvas.cells = cells;
  }

  document.getElementById("task-heatmap").addEventListener("mousemove", (event) => {
    const canvas = event.currentTarget;
    const box = canvas.getBoundingClientRect();
    const x = event.clientX - box.left, y = event.clientY - box.top;
    const cell = (canvas.cells || []).find((c) => x >= c.x0 && x < c.x1 && y >= c.y0 && y < c.y1);
    canvas.title = cell ? `task ${cell.task} · iteration ${cell.step} · ${formatNumber(cell.rate)} (${cell.successes}/${cell.episodes})` : "";
  });

  function taskRows() {
    const rows = (taskData?.table || []).map((row) => ({ ...row }));
    const key = taskSort.column;
    const value = (row) => (key.startsWith("h") ? row.horizons?.[key.slice(1)] : row[key]);
    rows.sort((a, b) => {
      const va = value(a), vb = value(b);
      const na = Number(va), nb = Number(vb);
      const order = va == null ? 1 : vb == null ? -1 : (Number.isFinite(na) && Number.isFinite(nb) ? na - nb : String(va).localeCompare(String(vb)));
      return taskSort.descending ? -order : order;
    });
    return rows;
  }

  // Built with DOM calls: task names come from metric keys, which are the trainer's
  // text, so they only ever become text nodes and attribute values. The header's sort
  // buttons stay the same elements while the columns are the same (rows come and go
  // with every push; a button replaced under the pointer would miss its click).
  function drawTaskTable() {
    const table = document.getElementById("task-table");
    if (!table) return; // the page was left
    const horizonsSeen = new Set();
    for (const row of taskData?.table || []) for (const h of Object.keys(row.horizons || {})) horizonsSeen.add(h);
    const hs = [...horizonsSeen].sort((a, b) => Number(a) - Number(b));
    const columns = [["task", "Task"], ["step", "Iteration"], ["rate", "Success"],
      ["successes", "Successes"], ["episodes", "Episodes"], ...hs.map((h) => [`h${h}`, `h${h}`])];
    const signature = columns.map(([c]) => c).join(" ");
    let head = table.tHead;
    if (!head || head.dataset.columns !== signature) {
      const fresh = document.createElement("thead");
      fresh.dataset.columns = signature;
      const headRow = fresh.insertRow();
      for (const [c, title] of columns) {
        const th = document.createElement("th");
        th.scope = "col";
        const button = document.createElement("button");
        button.type = "button";
        button.className = "sort";
        button.dataset.column = c;
        button.dataset.title = title;
        th.append(button);
        headRow.append(th);
      }
      if (head) head.replaceWith(fresh); else table.prepend(fresh);
      head = fresh;
    }
    for (const button of head.querySelectorAll("button.sort")) {
      const c = button.dataset.column;
      const sorted = taskSort.column === c ? (taskSort.descending ? "descending" : "ascending") : "none";
      const label = `${button.dataset.title}${sorted === "none" ? "" : sorted === "descending" ? " ▼" : " ▲"}`;
      if (button.textContent !== label) button.textContent = label;
      button.parentElement.setAttribute("aria-sort", sorted);
    }
    const body = document.createElement("tbody");
    for (const row of taskRows()) {
      const tr = document.createElement("tr");
      tr.dataset.task = String(row.task);
      for (const [c] of columns) {
        const v = c.startsWith("h") ? row.horizons?.[c.slice(1)] : row[c];
        const rate = c === "rate" || c.startsWith("h");
        const td = document.createElement("td");
        td.dataset.column = c;
        td.dataset.value = v == null ? "" : String(v);
        td.textContent = c === "task" ? `task ${v}` : rate ? formatNumber(v) : String(v ?? "—");
        if (rate && v != null) td.style.background = rateColour(v).replace("48%)", "90%)");
        tr.append(td);
      }
      body.append(tr);
    }
    if (table.tBodies[0]) table.tBodies[0].replaceWith(body); else table.append(body);
  }

  document.getElementById("task-table").addEventListener("click", (event) => {
    const button = event.target.closest("button.sort");
    if (!button) return;
    const column = button.dataset.column;
    taskSort = { column, descending: taskSort.column === column ? !taskSort.descending : column !== "task" };
    drawTaskTable();
  });

  // ----- start ---------------------------------------------------------------------------
  window.armatureRun = { store: () => store, view }; // for the browser tests
  requestSync();
  allMetrics.load();
  syncEpisodes();
  refreshTasks();
  loadLatest();
  updateSummary();
})();
