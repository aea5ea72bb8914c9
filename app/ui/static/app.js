// The console shell: sign-in, navigation by #hash, one page module mounted at a time.
import { ApiError, api, forgetKey, getKey, setKey } from "./api.js";
import { errorBox } from "./dom.js";
import * as keys from "./keys.js";
import * as overview from "./overview.js";
import * as playground from "./playground.js";
import * as policies from "./policies.js";
import * as reports from "./reports.js";

const PAGES = { overview, policies, playground, reports, keys };
const $ = (id) => document.getElementById(id);
let me = null;
let cleanup = null;

async function signIn(key) {
  setKey(key);
  try {
    me = await api("/v1/ttc/whoami");
  } catch (err) {
    forgetKey();
    me = null;
    throw err;
  }
}

function showLogin(message) {
  $("login").hidden = false;
  $("page").replaceChildren();
  $("nav").hidden = true;
  $("logout").hidden = true;
  $("who").textContent = "";
  $("login-error").textContent = message || "";
}

async function route() {
  if (cleanup) { cleanup(); cleanup = null; }
  if (!me) return showLogin();
  $("login").hidden = true;
  $("nav").hidden = false;
  $("logout").hidden = !me.auth_enabled;
  $("who").textContent = me.auth_enabled ? `${me.name || me.key_id || "key"} (${me.role})` : "auth off";
  for (const a of document.querySelectorAll("#nav a")) a.hidden = a.hasAttribute("data-admin") && me.role !== "admin";
  const name = (location.hash.match(/^#\/(\w+)/) || [])[1] || "overview";
  const page = PAGES[name] || overview;
  for (const a of document.querySelectorAll("#nav a")) a.classList.toggle("active", a.dataset.page === name);
  const root = $("page");
  root.replaceChildren();
  root.dataset.page = name;
  try {
    cleanup = (await page.render(root, { me })) || null;
  } catch (err) {
    if (err instanceof ApiError && err.status === 401) { forgetKey(); me = null; return showLogin(err.message); }
    root.append(errorBox(err));
  }
}

$("login-form").addEventListener("submit", async (ev) => {
  ev.preventDefault();
  try {
    await signIn($("key").value.trim());
    $("key").value = "";
    await route();
  } catch (err) {
    showLogin(err.message);
  }
});
$("logout").addEventListener("click", () => { forgetKey(); me = null; route(); });
window.addEventListener("hashchange", route);

(async () => {
  const key = getKey();
  if (key !== null) {
    try { await signIn(key); } catch { /* fall through to the form */ }
  } else {
    try { await signIn(""); } catch { /* auth is on: ask for a key */ }
  }
  await route();
})();
