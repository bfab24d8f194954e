// The operator console of one run (frontend/templates/console/robots.html): live robot
// state and camera frames over /ws/console/<run>/, and, for operators, takeover with the
// keyboard or a gamepad. The robots' safety rules (deadman, command window, one holder,
// e-stop) are enforced where the robot is; this page sends a command at the control rate
// while it holds a robot, and those commands are its heartbeat.
(() => {
  "use strict";
  const root = document.getElementById("console");
  if (!root) return;
  const runId = root.dataset.run;
  const operator = root.dataset.operator;
  const canControl = root.dataset.canControl === "true";
  const isAdmin = root.dataset.admin === "true";
  const $ = (id) => document.getElementById(id);

  const MOTIONS = ["x", "y", "z", "roll", "pitch", "yaw"];
  const DEFAULT_KEYS = {
    x: ["a", "d"], y: ["s", "w"], z: ["arrowdown", "arrowup"],
    roll: ["j", "l"], pitch: ["k", "i"], yaw: ["u", "o"],
  };
  const SHORTCUTS = {
    t: "take_over", y: "release", 1: "mark_success", 2: "mark_failure", q: "request",
    c: "clear_stop", escape: "estop",
  };
  const GRIPPER_KEY = "g";
  const HEARTBEAT_MS = 25;
  const STORE = "armature.console.keys";

  let keys = loadKeys();
  let socket = null;
  let selected = Number(new URLSearchParams(location.search).get("robot") || 0);
  // The camera shown of the selected robot; empty: the robot's first. Frames are sent
  // only of the cameras consoles show.
  let camera = "";
  let robots = [];
  // Each process that steps robots reports its own (the learner's, or a placed env
  // worker's): source → {robots, at}; one not heard from for STALE_MS drops out.
  const bySource = new Map();
  const STALE_MS = 3000;
  let controlHz = 20;
  let lastStateAt = 0;
  // The gripper as this page shows it: the robot's measured state until the operator
  // toggles it while holding the robot; only then does a command carry it (+1 closed,
  // -1 open), and before that 0, which keeps it as it is: taking over never moves it.
  let gripperClosed = false;
  let gripperTouched = false;
  let padButtonDown = false;
  let commandSeq = 0;
  const sentAt = new Map(); // command id → performance.now() when sent
  const pressed = new Set();
  let frames = 0;
  let loop = null;
  // Release pressed: no command goes out from then on (one already on its way would be
  // refused once the release lands), until this operator holds a robot again.
  let letGo = false;
  // Left (the page replaced by another, boosted navigation included): the socket closes
  // and stays closed, and the keys no longer drive anything.
  let left = false;
  const listening = new AbortController();
  const { signal } = listening;

  function loadKeys() {
    try {
      return { ...DEFAULT_KEYS, ...JSON.parse(localStorage.getItem(STORE) || "{}") };
    } catch (error) {
      return { ...DEFAULT_KEYS };
    }
  }

  function renderKeyMap() {
    const body = $("key-map").querySelector("tbody");
    body.replaceChildren();
    for (const motion of MOTIONS) {
      const row = document.createElement("tr");
      row.append(cell(motion));
      keys[motion].forEach((key, side) => {
        const input = document.createElement("input");
        input.value = key;
        input.setAttribute("aria-label", `${motion} ${side ? "+" : "−"} key`);
        input.addEventListener("change", () => {
          keys[motion][side] = input.value.trim().toLowerCase();
          localStorage.setItem(STORE, JSON.stringify(keys));
        });
        const td = document.createElement("td");
        td.append(input);
        row.append(td);
      });
      body.append(row);
    }
  }

  function cell(text) {
    const td = document.createElement("td");
    td.textContent = text;
    return td;
  }

  function scale() {
    return Number($("scale").value);
  }

  // The operator's action: 6-DoF end-effector deltas in [-1, 1] and the gripper (+1
  // closed, -1 open, 0 as it is).
  function action() {
    const values = MOTIONS.map((motion) => {
      const [minus, plus] = keys[motion];
      return (pressed.has(plus) ? 1 : 0) - (pressed.has(minus) ? 1 : 0);
    });
    const pad = gamepad();
    if (pad) {
      const dead = (v) => (Math.abs(v) < 0.15 ? 0 : v);
      values[0] += dead(pad.axes[0] || 0);
      values[1] -= dead(pad.axes[1] || 0);
      values[2] -= dead(pad.axes[3] || 0);
      values[5] += dead(pad.axes[2] || 0);
    }
    const scaled = values.map((v) => Math.max(-1, Math.min(1, v)) * scale());
    return [...scaled, gripperTouched ? (gripperClosed ? 1 : -1) : 0];
  }

  function gamepad() {
    const pads = navigator.getGamepads ? navigator.getGamepads() : [];
    const pad = [...pads].find((p) => p && p.connected);
    $("gamepad").textContent = pad ? `gamepad: ${pad.id}` : "no gamepad";
    const down = Boolean(pad && pad.buttons[0] && pad.buttons[0].pressed);
    if (down && !padButtonDown) toggleGripper(); // on the press, not while held
    padButtonDown = down;
    return pad || null;
  }

  function setGripper(closed) {
    gripperClosed = closed;
    $("gripper").textContent = closed ? "closed" : "open";
  }

  function toggleGripper() {
    if (!holding()) return;
    gripperTouched = true;
    setGripper(!gripperClosed);
  }

  function robot() {
    return robots.find((r) => r.robot === selected);
  }

  function held() {
    const r = robot();
    return Boolean(r && r.mode === "human" && r.holder === operator);
  }

  function holding() {
    return held() && !letGo;
  }

  function live() {
    return Boolean(socket && socket.readyState === WebSocket.OPEN && robot() &&
                   performance.now() - lastStateAt < STALE_MS);
  }

  // Why a button cannot act now ("" when it can): the robot's safety rules are enforced
  // where the robot is; this only spares the operator a refusal.
  function whyNot(op) {
    const r = robot();
    if (!live()) return "no robot online: the run's trainer is not stepping robots now";
    const mine = r.holder === operator;
    switch (op) {
      case "take_over":
        if (r.mode === "e-stopped") return `e-stopped by ${r.holder}: clear the stop first`;
        if (r.mode === "human") return mine ? "you hold this robot" : `held by ${r.holder}: request control`;
        return "";
      case "release":
        return holding() ? "" : "you hold no robot to release";
      case "request":
        return r.mode === "human" && !mine ? "" : "nobody else holds this robot";
      case "clear_stop":
        if (r.mode !== "stopped" && r.mode !== "e-stopped") return "the robot is not stopped";
        if (r.mode === "e-stopped" && r.holder && !mine && !isAdmin) {
          return `e-stopped by ${r.holder}: only they or an admin may clear it`;
        }
        return "";
      default:
        return "";
    }
  }

  function renderButtons() {
    root.querySelectorAll("button[data-op]").forEach((button) => {
      const reason = whyNot(button.dataset.op);
      button.disabled = Boolean(reason);
      button.title = reason;
    });
  }

  function send(message) {
    if (socket && socket.readyState === WebSocket.OPEN) socket.send(JSON.stringify(message));
  }

  function watch() {
    send(camera ? { op: "watch", robot: selected, camera } : { op: "watch", robot: selected });
  }

  function press(op) {
    // Keys send whatever the buttons show: the robot's end judges, and answers why not.
    if (op === "release") letGo = true;
    if (op === "take_over") letGo = false;
    if (op === "mark_success" || op === "mark_failure") {
      send({ op: "mark", robot: selected, success: op === "mark_success" });
    } else {
      send({ op, robot: selected });
    }
  }

  function tick() {
    if (!holding()) return;
    const id = `c${++commandSeq}`;
    sentAt.set(id, performance.now());
    if (sentAt.size > 500) sentAt.delete(sentAt.keys().next().value);
    const values = action();
    $("your-action").textContent = values.map((v) => v.toFixed(2)).join(" ");
    send({ op: "command", robot: selected, action: values, id });
  }

  // Commands are the heartbeat too: sent at least every 25 ms (the robot's deadman is a
  // few times that), and at the control rate when it is faster.
  function restartLoop() {
    if (loop) clearInterval(loop);
    loop = setInterval(tick, Math.min(1000 / controlHz, HEARTBEAT_MS));
  }

  function showError(text) {
    const box = $("console-error");
    box.textContent = text;
    box.hidden = !text;
  }

  function onConsole(message) {
    lastStateAt = performance.now();
    $("task").textContent = message.task || "—";
    if (message.control_hz && message.control_hz !== controlHz) {
      controlHz = message.control_hz;
      restartLoop();
    }
    const now = performance.now();
    bySource.set(message.source || "", { robots: message.robots, at: now });
    for (const [source, kept] of bySource) if (now - kept.at > STALE_MS) bySource.delete(source);
    robots = [...bySource.values()].flatMap((kept) => kept.robots).sort((a, b) => a.robot - b.robot);
    renderTabs();
    renderRobot();
    for (const frame of message.frames) {
      if (frame.robot !== selected || (camera && frame.camera !== camera)) continue;
      $("camera").src = `data:image/jpeg;base64,${frame.jpeg}`;
      $("camera").dataset.frames = String(Number($("camera").dataset.frames || 0) + 1);
      $("camera-note").textContent = `${frame.camera} · ${frame.width}×${frame.height}`;
      frames += 1;
    }
    for (const reply of message.replies) {
      if (reply.operator !== operator) continue;
      // A command sent just before a release is refused once the release landed.
      if (!reply.ok && reply.op === "command" && !holding()) continue;
      if (!reply.ok) showError(`${reply.op}: ${reply.error}`);
      else showError("");
    }
    for (const applied of message.applied) {
      const start = sentAt.get(applied.id);
      if (start !== undefined) {
        $("applied-latency").textContent = (performance.now() - start).toFixed(1);
        sentAt.delete(applied.id);
      }
    }
  }

  function renderTabs() {
    const tabs = $("robot-tabs");
    if (tabs.childElementCount !== robots.length) {
      tabs.replaceChildren(
        ...robots.map((_, index) => {
          const button = document.createElement("button");
          button.type = "button";
          button.setAttribute("role", "tab");
          button.addEventListener("click", () => {
            selected = robots[index].robot;
            camera = "";
            watch();
            renderTabs();
            renderRobot();
          });
          return button;
        })
      );
    }
    robots.forEach((r, index) => {
      const button = tabs.children[index];
      button.textContent = `${r.name} · ${r.mode}`;
      button.setAttribute("aria-selected", String(r.robot === selected));
    });
  }

  function renderRobot() {
    const r = robot();
    renderButtons();
    if (!r) return;
    if (!held()) letGo = false; // the release landed: the next takeover may drive
    if (!holding()) gripperTouched = false; // the next takeover starts from the robot's
    if (!gripperTouched && typeof r.gripper_closed === "boolean") setGripper(r.gripper_closed);
    $("mode").textContent = r.mode;
    $("holder").textContent = r.holder || "—";
    $("episode").textContent = r.episode;
    $("episode-step").textContent = r.episode_step;
    $("last-success").textContent =
      r.last_success === null ? "—" : r.last_success ? "success" : "failure";
    $("policy-action").textContent = r.policy_action.map((v) => v.toFixed(2)).join(" ");
    renderTimeline(r.timeline || []);
    renderCameras(r.cameras || []);
    $("robot-state").textContent = Object.entries(r.state)
      .map(([name, values]) => `${name} ${values.join(" ")}`)
      .join(" · ");
  }

  // The current episode as a bar of who acted, each segment as wide as its steps, and
  // the totals in words (the bar's colours: policy, human, held still).
  function renderTimeline(segments) {
    const bar = $("episode-timeline");
    const text = segments.map(({ who, steps }) => `${who} ${steps}`).join(" · ");
    if (bar.dataset.segments === text) return; // unchanged: no re-layout 15 times a second
    bar.dataset.segments = text;
    bar.replaceChildren(
      ...segments.map(({ who, steps }) => {
        const part = document.createElement("span");
        part.className = `segment segment-${who}`;
        part.style.flexGrow = String(steps);
        part.title = `${who}: ${steps} step${steps === 1 ? "" : "s"}`;
        return part;
      })
    );
    const totals = {};
    for (const { who, steps } of segments) totals[who] = (totals[who] || 0) + steps;
    $("episode-timeline-note").textContent = Object.keys(totals).length
      ? Object.entries(totals).map(([who, steps]) => `${who} ${steps}`).join(" · ")
      : "—";
  }

  function renderCameras(names) {
    const pick = $("camera-pick");
    if (camera && !names.includes(camera)) camera = "";
    const shown = camera || names[0] || "";
    if ([...pick.options].map((o) => o.value).join("\n") !== names.join("\n")) {
      pick.replaceChildren(
        ...names.map((name) => {
          const option = document.createElement("option");
          option.value = option.textContent = name;
          return option;
        })
      );
    }
    pick.value = shown;
    pick.disabled = names.length < 2;
  }

  function onMessage(event) {
    const message = JSON.parse(event.data);
    if (message.type === "console") onConsole(message);
    else if (message.type === "pong") $("rtt").textContent = (performance.now() - message.t).toFixed(1);
    else if (message.type === "refused") showError(`${message.op}: refused (${message.status}): ${message.error}`);
    else if (message.type === "error") showError(message.error);
    else if (message.type === "request") {
      const box = $("console-request");
      box.textContent = `${message.by} asks for robot ${message.robot}.`;
      box.hidden = false;
    }
  }

  function connect() {
    if (left) return;
    const scheme = location.protocol === "https:" ? "wss" : "ws";
    socket = new WebSocket(`${scheme}://${location.host}/ws/console/${runId}/`);
    socket.addEventListener("open", watch);
    socket.addEventListener("message", onMessage);
    socket.addEventListener("close", () => setTimeout(connect, 1000));
  }

  // What the page holds ends with it: the server lets go of the robots this socket
  // held as it closes.
  function leave() {
    if (left) return;
    left = true;
    listening.abort();
    clearInterval(loop);
    clearInterval(ticker);
    pressed.clear();
    if (socket) socket.close();
  }

  function showLinkState() {
    const badge = $("link-state");
    let state = "disconnected";
    if (socket && socket.readyState === WebSocket.OPEN) {
      state = performance.now() - lastStateAt < 1000 ? "live" : "no trainer";
    }
    badge.textContent = state;
    badge.className = `badge ${state === "live" ? "up" : state === "no trainer" ? "idle" : "down"}`;
    renderButtons();
    $("fps").textContent = String(frames);
    frames = 0;
  }

  document.addEventListener("htmx:beforeCleanupElement", (event) => {
    if (event.target === root || event.target.contains(root)) leave();
  }, { signal });
  document.addEventListener("keydown", (event) => {
    if (event.target instanceof HTMLInputElement) return;
    const key = event.key.toLowerCase();
    if (canControl && !event.repeat) {
      if (key in SHORTCUTS) {
        event.preventDefault();
        press(SHORTCUTS[key]);
        return;
      }
      if (key === GRIPPER_KEY) {
        toggleGripper();
        return;
      }
    }
    if (Object.values(keys).some((pair) => pair.includes(key))) {
      event.preventDefault();
      pressed.add(key);
    }
  }, { signal });
  document.addEventListener("keyup", (event) => pressed.delete(event.key.toLowerCase()), { signal });
  window.addEventListener("blur", () => pressed.clear(), { signal });
  root.querySelectorAll("button[data-op]").forEach((button) =>
    button.addEventListener("click", () => press(button.dataset.op))
  );
  $("camera-pick").addEventListener("change", (event) => {
    camera = event.target.value;
    watch();
  });
  $("scale").addEventListener("input", () => {
    $("scale-value").textContent = scale().toFixed(1);
  });

  renderKeyMap();
  connect();
  restartLoop();
  const ticker = setInterval(() => {
    if (!root.isConnected) return leave(); // taken off the page by any means
    send({ op: "ping", t: performance.now() });
    watch();
    showLinkState();
  }, 1000);
})();
