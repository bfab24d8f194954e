// Episode videos (frontend/templates/runs/_episodes.html): the step timeline under each
// video shows where playback is, and a click on it seeks there.
(() => {
  "use strict";
  const timelineOf = (video) => video.closest("figure.episode")?.querySelector("svg.episode-steps");

  // Media events do not bubble: caught on their way down. A seek moves the cursor at
  // once, playback as it goes.
  function follow(event) {
    const video = event.target;
    if (!(video instanceof HTMLVideoElement) || !video.duration) return;
    const svg = timelineOf(video);
    if (!svg) return;
    const steps = svg.viewBox.baseVal.width;
    const x = Math.min(steps, (video.currentTime / video.duration) * steps);
    svg.querySelector(".cursor").setAttribute("x", String(x));
  }
  for (const name of ["timeupdate", "seeked"]) document.addEventListener(name, follow, true);

  document.addEventListener("click", (event) => {
    const svg = event.target.closest?.("svg.episode-steps");
    const video = svg?.closest("figure.episode")?.querySelector("video");
    if (!video || !video.duration) return;
    const box = svg.getBoundingClientRect();
    video.currentTime = ((event.clientX - box.left) / box.width) * video.duration;
  });

  // The compare page's pair (runs/_episodes_side_by_side.html): one button plays or
  // pauses every video, one slider seeks them all to the same share of their length.
  const videosOf = (sync) => [...sync.querySelectorAll("video")];
  document.addEventListener("click", (event) => {
    const button = event.target.closest?.("[data-sync-play]");
    if (!button) return;
    const videos = videosOf(button.closest("[data-synced]"));
    const playing = videos.some((video) => !video.paused && !video.ended);
    for (const video of videos) {
      if (playing) video.pause();
      else video.play().catch(() => {});
    }
    button.textContent = playing ? "Play both" : "Pause both";
  });
  document.addEventListener("input", (event) => {
    const slider = event.target.closest?.("[data-sync-seek]");
    if (!slider) return;
    for (const video of videosOf(slider.closest("[data-synced]"))) {
      if (video.duration) video.currentTime = (Number(slider.value) / 1000) * video.duration;
    }
  });
})();
