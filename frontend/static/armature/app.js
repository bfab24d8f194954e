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
