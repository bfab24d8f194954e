// Runs list: tick runs, then "Compare" opens /runs/compare/?ids=1,2,…
// Live updates replace a row wholesale (hx-swap-oob), so the ticked ids live here and
// are put back on every swapped-in row.
(() => {
  const picked = new Set();
  const button = document.getElementById("compare-runs");
  if (!button) return;

  function refresh() {
    for (const box of document.querySelectorAll(".pickable .compare-pick")) {
      box.checked = picked.has(box.value);
    }
    button.disabled = picked.size < 2;
    button.textContent = picked.size ? `Compare (${picked.size})` : "Compare";
  }

  document.addEventListener("change", (event) => {
    const box = event.target;
    if (!box.classList?.contains("compare-pick")) return;
    if (box.checked) picked.add(box.value); else picked.delete(box.value);
    refresh();
  });
  document.body.addEventListener("htmx:oobAfterSwap", refresh);
  document.body.addEventListener("htmx:afterSwap", refresh);
  button.addEventListener("click", () => {
    const ids = [...picked].sort((a, b) => Number(a) - Number(b));
    window.location.href = `${button.dataset.href}?ids=${ids.join(",")}`;
  });
  refresh();
})();
