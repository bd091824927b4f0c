// The playground's shell: one page per URL hash (#jobs, #talk, #world), each a module
// started the first time it is shown; and the "API key" button.
import { askKey } from "./api.js";
import * as jobs from "./jobs.js";
import * as talk from "./talk.js";
import * as world from "./world.js";

const PAGES = { jobs, talk, world };
const started = new Set();

function show() {
  const name = location.hash.slice(1) in PAGES ? location.hash.slice(1) : "jobs";
  for (const page of Object.keys(PAGES)) {
    document.getElementById(page).hidden = page !== name;
    const link = document.querySelector(`nav a[data-page="${page}"]`);
    if (page === name) link.setAttribute("aria-current", "page");
    else link.removeAttribute("aria-current");
  }
  document.body.dataset.page = name;
  if (!started.has(name)) {
    started.add(name);
    PAGES[name].init().catch((e) => {
      started.delete(name);
      const status = document.querySelector(`#${name} [role=status], #${name} .state dd`);
      if (status) status.textContent = `could not load: ${e.message}`;
    });
  }
}

document.getElementById("key-button").addEventListener("click", async () => {
  const before = sessionStorage.getItem("omniqueue.apiKey") || "";
  await askKey("The key is sent as a bearer header and as the WebSocket subprotocol.");
  if ((sessionStorage.getItem("omniqueue.apiKey") || "") !== before) location.reload();
});
window.addEventListener("hashchange", show);
show();
