// The run page's log panel: the server re-renders its lines every 3 s (htmx swaps the
// <pre>); this keeps the view following the newest line while "follow" is ticked, marks
// what the search box holds in every line (<mark>, case-insensitive) and counts lines and
// matches. The text's colours are the server's (ansi… classes).
"use strict";

(() => {
  const panel = document.getElementById("log-panel");
  if (!panel) return;
  const search = panel.querySelector("[name=log-search]");
  const follow = panel.querySelector("[name=follow]");
  const count = panel.querySelector("[data-log-count]");
  const matches = panel.querySelector("[data-log-matches]");
  panel.querySelector("form").addEventListener("submit", (event) => event.preventDefault());

  function unmark(pre) {
    for (const mark of pre.querySelectorAll("mark")) mark.replaceWith(mark.textContent);
    pre.normalize();
  }

  // Wraps each occurrence of `needle` in the <pre>'s text nodes (inside colour spans too).
  function mark(pre, needle) {
    const lower = needle.toLowerCase();
    const walker = document.createTreeWalker(pre, NodeFilter.SHOW_TEXT);
    const nodes = [];
    while (walker.nextNode()) nodes.push(walker.currentNode);
    let found = 0;
    for (const node of nodes) {
      const text = node.textContent;
      const at = [];
      for (let i = text.toLowerCase().indexOf(lower); i >= 0; i = text.toLowerCase().indexOf(lower, i + lower.length)) at.push(i);
      if (!at.length) continue;
      const parts = [];
      let last = 0;
      for (const i of at) {
        parts.push(document.createTextNode(text.slice(last, i)));
        const hit = document.createElement("mark");
        hit.textContent = text.slice(i, i + needle.length);
        parts.push(hit);
        last = i + needle.length;
      }
      parts.push(document.createTextNode(text.slice(last)));
      node.replaceWith(...parts);
      found += at.length;
    }
    return found;
  }

  function refresh() {
    const pre = document.getElementById("run-logs");
    if (!pre) return;
    const lines = Number(pre.dataset.lines || 0);
    count.textContent = `· ${lines} line${lines === 1 ? "" : "s"}`;
    unmark(pre);
    const needle = search.value;
    if (needle) {
      const found = mark(pre, needle);
      matches.textContent = `${found} match${found === 1 ? "" : "es"}`;
    } else {
      matches.textContent = "";
    }
    if (follow.checked) pre.scrollTop = pre.scrollHeight;
    else if (needle) pre.querySelector("mark")?.scrollIntoView({ block: "nearest" });
  }

  // Scrolling up to read stops following; scrolling back to the end follows again.
  panel.addEventListener("scroll", (event) => {
    const pre = event.target;
    if (pre.id !== "run-logs") return;
    follow.checked = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 4;
  }, true);
  search.addEventListener("input", refresh);
  follow.addEventListener("change", refresh);
  // Each poll brings a new <pre>: refresh it, and where the reader scrolled to (not
  // following) the new one opens at the same place.
  let shown = document.getElementById("run-logs");
  let readAt = 0;
  document.body.addEventListener("htmx:beforeSwap", () => { readAt = shown?.scrollTop || 0; });
  document.body.addEventListener("htmx:afterSettle", () => {
    const pre = document.getElementById("run-logs");
    if (!pre || pre === shown) return;
    shown = pre;
    if (!follow.checked) pre.scrollTop = readAt;
    refresh();
  });
  refresh();
})();
