// The "live" dot of a section connected over a WebSocket: green while the socket
// is open, grey while it is down (the htmx ws extension reconnects by itself).
function setLive(socketElt, on) {
  for (const dot of socketElt.querySelectorAll(".live-dot")) {
    dot.classList.toggle("on", on);
    dot.title = on ? "live" : "reconnecting…";
  }
}
document.addEventListener("htmx:wsOpen", (e) => setLive(e.target, true));
document.addEventListener("htmx:wsClose", (e) => setLive(e.target, false));

// A page's sockets end with the page. Leaving it by an htmx swap (a boosted link) keeps
// the document: the ws extension closes the socket of each element swapped out, but a
// reconnect it had already timed (after the server dropped the socket) still opens a new
// one for the element that left, which nothing would close. That one closes as it opens,
// before the page's own listeners on the element (run_page.js) take it for their page.
document.addEventListener("htmx:beforeCleanupElement", (e) => {
  const left = e.target;
  if (!left.hasAttribute?.("ws-connect")) return;
  left.addEventListener("htmx:wsOpen", (opened) => {
    opened.stopImmediatePropagation();
    opened.detail.event.target.close();
  }, { capture: true });
});

// What a socket pushes is swapped by element id (every element of a message is taken
// as out of band). An element this page does not have (the page it was meant for is no
// longer shown) is dropped before that swap, which would log htmx:oobErrorNoTarget.
// As an htmx extension named on <body> (base.html), so every socket has it, after the
// socket element's own (live-runs first gives a new row its place). Responses to
// requests (with an xhr) are left as they are: a whole page holds elements of its own.
htmx.defineExtension("shown-targets", {
  transformResponse(text, xhr) {
    if (xhr || typeof text !== "string" || text[0] !== "<") return text;
    const incoming = document.createElement("template");
    incoming.innerHTML = text;
    const strays = [...incoming.content.children].filter((element) => {
      const how = element.getAttribute("hx-swap-oob") || "true";
      return !how.includes(":") && !(element.id && document.getElementById(element.id));
    });
    if (!strays.length) return text;
    strays.forEach((element) => element.remove());
    return incoming.innerHTML;
  },
});

// A socket's JSON frames (a run's metrics and progress) are for a page script that
// takes them first (run_page.js); on a page without one, htmx would parse them as HTML
// to swap. Fragments always start with "<".
document.addEventListener("htmx:wsBeforeMessage", (e) => {
  const text = e.detail.message;
  if (typeof text === "string" && text[0] === "{") e.preventDefault();
});

// Line numbers beside a code textarea, lines with errors marked: the placement preview
// carries them in data-error-lines, a config's issue list in each item's data-line.
function errorLines() {
  const bad = new Set((document.getElementById("placement-result")?.dataset.errorLines || "")
    .trim().split(/\s+/).filter(Boolean));
  for (const item of document.querySelectorAll("#config-issues li[data-line]")) {
    if (item.dataset.line) bad.add(item.dataset.line);
  }
  return bad;
}
function drawGutter(textarea, gutter) {
  const bad = errorLines();
  const count = textarea.value.split("\n").length;
  const lines = document.createDocumentFragment();
  let plain = ""; // runs of good line numbers as one text node
  for (let number = 1; number <= count; number++) {
    const separator = number > 1 ? "\n" : "";
    if (!bad.has(String(number))) { plain += separator + number; continue; }
    lines.append(plain + separator);
    plain = "";
    const marked = document.createElement("span");
    marked.className = "bad";
    marked.textContent = String(number);
    lines.append(marked);
  }
  lines.append(plain);
  gutter.replaceChildren(lines);
  gutter.scrollTop = textarea.scrollTop;
}
function setUpGutters() {
  for (const editor of document.querySelectorAll(".code-editor")) {
    const textarea = editor.querySelector("textarea");
    const gutter = editor.querySelector("pre.gutter");
    if (!textarea || !gutter) continue;
    const redraw = () => drawGutter(textarea, gutter);
    textarea.addEventListener("input", redraw);
    textarea.addEventListener("scroll", () => { gutter.scrollTop = textarea.scrollTop; });
    document.body.addEventListener("htmx:afterSettle", redraw);
    redraw();
  }
}
document.addEventListener("DOMContentLoaded", setUpGutters);

// Forms that go to an address built from their fields instead of submitting, e.g. the
// run page's config diff: data-go="/runs/3/diff/{other}/" (no inline handlers: the
// Content-Security-Policy runs only static scripts).
document.addEventListener("submit", (e) => {
  const form = e.target;
  const address = form.dataset?.go;
  if (!address) return;
  e.preventDefault();
  location.href = address.replace(/\{(\w+)\}/g,
    (_, name) => encodeURIComponent(form.elements[name]?.value ?? ""));
});

// Forms the page's socket re-renders (e.g. the Evaluate form once a checkpoint arrives)
// come without a CSRF token: they are rendered without a request. A POST form without
// one gets the page's own token (the one htmx sends as a header) as it is submitted.
document.addEventListener("submit", (e) => {
  const form = e.target;
  if (form.method !== "post" || form.elements.csrfmiddlewaretoken?.value) return;
  const token = JSON.parse(document.body.getAttribute("hx-headers") || "{}")["X-CSRFToken"];
  if (!token) return;
  form.elements.csrfmiddlewaretoken?.remove();
  const field = document.createElement("input");
  field.type = "hidden";
  field.name = "csrfmiddlewaretoken";
  field.value = token;
  form.append(field);
});

// Styles that depend on data, e.g. an evaluation cell's colour (data-hue), are set
// through element.style: the CSP allows no style attribute in the markup. htmx calls
// this for the page and for every fragment it swaps in.
htmx.onLoad((root) => {
  const marked = [...root.querySelectorAll("[data-hue]")];
  if (root.matches?.("[data-hue]")) marked.push(root);
  for (const element of marked) element.style.setProperty("--hue", element.dataset.hue);
});

// A live update that re-renders a form marked data-keep-input (e.g. the Evaluate form
// when a checkpoint arrives) keeps what the user changed in it, and the focus.
document.addEventListener("htmx:oobBeforeSwap", (e) => {
  const { target, fragment } = e.detail;
  const forms = [...target.querySelectorAll("form[data-keep-input][id]")];
  if (target.matches("form[data-keep-input][id]")) forms.push(target);
  for (const form of forms) {
    const twin = fragment.querySelector(`#${CSS.escape(form.id)}`);
    if (!twin) continue;
    for (const field of form.elements) {
      const other = field.name && twin.elements[field.name];
      if (!other || other.tagName !== field.tagName) continue;
      const changed = field.tagName === "SELECT"
        ? [...field.options].some((o) => o.selected !== o.defaultSelected)
        : field.value !== field.defaultValue;
      if (changed && (field.tagName !== "SELECT" || [...other.options].some((o) => o.value === field.value))) {
        other.value = field.value;
      }
    }
    const focused = form.contains(document.activeElement) ? document.activeElement.name : "";
    if (focused) queueMicrotask(() => document.getElementById(form.id)?.elements[focused]?.focus());
  }
});

// Dialogs opened by a button naming them (data-opens="dialog-id"), e.g. Home's launch.
document.addEventListener("click", (e) => {
  const opener = e.target.closest("[data-opens]");
  if (!opener) return;
  e.preventDefault();
  document.getElementById(opener.dataset.opens)?.showModal();
});

// Live run tables (Home, the runs list). The server pushes each changed run's row as an
// out-of-band fragment. A row the page does not show yet gets a place first, in the
// first live table that would list it (a run launched while the page is open); after
// the swap, a row that no longer belongs to its table (a finished run under "Active")
// moves to the table that takes it, or leaves. Tables say what they take:
//   data-accept="active|final|any"  data-experiment / data-creator / data-state filters
//   data-insert="false" (only update rows in place, e.g. a later page)  data-limit="N"
function takes(table, row) {
  const want = table.dataset, has = row.dataset;
  if (want.accept === "active" && has.active !== "true") return false;
  if (want.accept === "final" && has.active !== "false") return false;
  for (const field of ["experiment", "creator", "state"]) {
    if (want[field] && want[field] !== has[field]) return false;
  }
  return true;
}
function liveTables() { return [...document.querySelectorAll("tbody[data-live-runs]")]; }
function placeRow(row) {
  const table = liveTables().find((t) => t.dataset.insert !== "false" && takes(t, row));
  if (!table) return false;
  const place = document.createElement("tr");
  place.id = row.id;
  table.prepend(place);
  return true;
}
function tidyTables() {
  for (const table of liveTables()) {
    for (const row of [...table.querySelectorAll("tr[id^=run-row-]")]) {
      if (takes(table, row)) continue;
      const other = liveTables().find((t) => t !== table && t.dataset.insert !== "false" && takes(t, row));
      if (other) other.prepend(row); else row.remove();
    }
    const rows = table.querySelectorAll("tr[id^=run-row-]");
    const limit = Number(table.dataset.limit || 0);
    if (limit) [...rows].slice(limit).forEach((row) => row.remove());
    const empty = table.querySelector("tr.empty");
    if (empty) empty.hidden = table.querySelector("tr[id^=run-row-]") !== null;
  }
}
// As an htmx extension on the socket's element (hx-ext="ws,live-runs"), so a row that
// has no place on this page (another experiment's run) is dropped before the swap.
// Rows pushed while the tables are being fetched afresh (below), latest per run: the
// fetched tables may have been rendered before them, so they go back on top.
// The pushed text is the server's template-escaped fragment, the same htmx swaps in; it
// is parsed inert (a <template>) to look at its rows, and handed back to htmx as text.
let fetchingTables = 0;
const pushedWhileFetching = new Map();
htmx.defineExtension("live-runs", {
  transformResponse(text) {
    const incoming = document.createElement("template");
    incoming.innerHTML = text;
    for (const row of incoming.content.querySelectorAll("tr[id^=run-row-]")) {
      if (!document.getElementById(row.id) && !placeRow(row)) { row.remove(); continue; }
      keepChosenCells(row);
      if (fetchingTables) pushedWhileFetching.set(row.id, row.cloneNode(true));
    }
    return incoming.innerHTML;
  },
});
// The runs list's chosen columns are this page's own (its query names them): a pushed
// row, the same for every page, has none, so it gets the cells the shown row had ("—"
// for a new row), as of when the page was drawn.
function keepChosenCells(row) {
  const shown = document.getElementById(row.id);
  const wanted = shown?.closest("table")?.querySelectorAll("th.chosen").length || 0;
  const kept = shown ? [...shown.querySelectorAll("td.chosen")] : [];
  for (let index = 0; index < wanted; index++) {
    const cell = kept[index]?.cloneNode(true) || document.createElement("td");
    if (!kept[index]) { cell.className = "chosen num"; cell.textContent = "—"; }
    row.append(cell);
  }
}
function sameWhereUnchanged(fresh) {
  return [...fresh.childNodes].map((node) => {
    const shown = node.id ? document.getElementById(node.id) : null;
    return shown && shown.isEqualNode(node) ? shown : keepPreserved(node);
  });
}
// A changed row replaces the shown one, but its hx-preserve controls stay the page's
// elements, as in htmx's own swaps: a tick or a press under way is not lost.
function keepPreserved(row) {
  if (!row.querySelectorAll) return row;
  for (const control of row.querySelectorAll("[hx-preserve][id]")) {
    const shown = document.getElementById(control.id);
    if (shown && shown !== control) control.replaceWith(shown);
  }
  return row;
}
function putRowBack(pushed) {
  const row = keepPreserved(document.importNode(pushed, true));
  row.removeAttribute("hx-swap-oob");
  const existing = document.getElementById(row.id);
  if (existing) existing.replaceWith(row);
  else if (placeRow(row)) document.getElementById(row.id).replaceWith(row);
}
document.addEventListener("htmx:wsAfterMessage", tidyTables);
document.addEventListener("DOMContentLoaded", tidyTables);
// Pushes reach a list only while its socket is open: runs that changed between the
// page's render and the socket's opening, or while it was down, are fetched afresh
// (the page itself, whose tables hold the same filters) each time it opens.
// A row pushed while that fetch is under way may be newer than the fetched tables: it is
// put back on top of them (every change is pushed, so the last push is the latest state).
// A fetched row equal to the one shown keeps the element shown (a tick box or a link
// under the user's pointer stays the same element), only changed rows are replaced.
document.addEventListener("htmx:wsOpen", async (e) => {
  const tables = [...e.target.querySelectorAll("tbody[data-live-runs]")];
  if (!tables.length) return;
  fetchingTables += 1;
  try {
    const response = await fetch(location.href, { credentials: "same-origin" });
    if (!response.ok) return;
    const fresh = new DOMParser().parseFromString(await response.text(), "text/html");
    for (const table of tables) {
      const twin = fresh.querySelector(`tbody[data-live-runs][data-accept="${table.dataset.accept}"]`);
      if (twin) table.replaceChildren(...sameWhereUnchanged(document.importNode(twin, true)));
    }
    for (const row of pushedWhileFetching.values()) putRowBack(row);
  } finally {
    fetchingTables -= 1;
    if (!fetchingTables) pushedWhileFetching.clear();
    tidyTables();
  }
});
