// Settings page: copy the new token to the clipboard; confirm before revoking.
document.addEventListener("click", async (event) => {
  const button = event.target.closest("button[data-copy-target]");
  if (!button) return;
  const text = document.getElementById(button.dataset.copyTarget).textContent;
  const status = button.parentElement.querySelector("[data-copy-status]");
  try {
    await navigator.clipboard.writeText(text);
    if (status) status.textContent = "Copied.";
  } catch {
    // The clipboard API needs a secure context; select the text so Ctrl+C works instead.
    const range = document.createRange();
    range.selectNodeContents(document.getElementById(button.dataset.copyTarget));
    getSelection().removeAllRanges();
    getSelection().addRange(range);
    if (status) status.textContent = "Selected: press Ctrl+C to copy.";
  }
});
document.addEventListener("submit", (event) => {
  const message = event.target.dataset.confirm;
  if (message && !window.confirm(message)) event.preventDefault();
});
// The page that shows a new token answered the form's POST: its address becomes the
// settings page's, so a reload asks for the page and sends the form no second time.
const settingsForm = document.getElementById("token-create");
if (document.getElementById("new-token") && settingsForm?.dataset.settingsUrl) {
  history.replaceState(null, "", settingsForm.dataset.settingsUrl);
}
