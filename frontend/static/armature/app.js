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

// Line numbers beside a code textarea, lines with errors marked. The preview fragment
// carries the error lines in data-error-lines.
function drawGutter(textarea, gutter) {
  const result = document.getElementById("placement-result");
  const bad = new Set((result?.dataset.errorLines || "").trim().split(/\s+/).filter(Boolean));
  const count = textarea.value.split("\n").length;
  gutter.innerHTML = Array.from({ length: count }, (_, i) =>
    bad.has(String(i + 1)) ? `<span class="bad">${i + 1}</span>` : String(i + 1)).join("\n");
  gutter.scrollTop = textarea.scrollTop;
}
function setUpGutter() {
  const textarea = document.getElementById("placement");
  const gutter = document.getElementById("placement-gutter");
  if (!textarea || !gutter) return;
  const redraw = () => drawGutter(textarea, gutter);
  textarea.addEventListener("input", redraw);
  textarea.addEventListener("scroll", () => { gutter.scrollTop = textarea.scrollTop; });
  document.body.addEventListener("htmx:afterSwap", redraw);
  redraw();
}
document.addEventListener("DOMContentLoaded", setUpGutter);
