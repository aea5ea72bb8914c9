// Keys (admin): create (the plaintext key is shown once), list (optionally with revoked), revoke.
// Says whether the service checks keys at all (whoami's auth_enabled).
import { ApiError, api } from "./api.js";
import { errorBox, fmt, h, table } from "./dom.js";

function authState(me) {
  return me.auth_enabled
    ? h("p", { class: "muted", id: "auth-state", "data-auth": "on" }, "Auth is on: every request needs a key.")
    : h("p", { class: "card auth-off", id: "auth-state", "data-auth": "off", role: "status" },
      "Auth is off (auth.enabled: false): the service checks no key, every caller is the anonymous admin with no " +
      "limits. Keys created here are stored, but their roles, limits and default policies apply only once auth is on.");
}

export async function render(root, { me }) {
  const listBox = h("div", { id: "keys-list" });
  const created = h("div", { id: "key-created" });
  const withRevoked = h("input", { type: "checkbox", id: "keys-revoked", onchange: () => load() });
  const f = {
    name: h("input", { id: "k-name" }),
    role: h("select", { id: "k-role" }, h("option", { value: "user" }, "user"), h("option", { value: "admin" }, "admin")),
    default_policy: h("input", { id: "k-default_policy", placeholder: "none" }),
    requests_per_minute: h("input", { id: "k-requests_per_minute", type: "number", min: 1 }),
    samples_per_minute: h("input", { id: "k-samples_per_minute", type: "number", min: 1 }),
  };
  const err = h("p", { class: "error", id: "key-error", role: "alert" });
  const formEl = h("form", { class: "card", id: "key-form", onsubmit: async (ev) => {
    ev.preventDefault();
    err.textContent = "";
    const body = { role: f.role.value };
    for (const k of ["name", "default_policy"]) if (f[k].value.trim()) body[k] = f[k].value.trim();
    for (const k of ["requests_per_minute", "samples_per_minute"]) if (f[k].value) body[k] = +f[k].value;
    try {
      const key = await api("/v1/keys", { method: "POST", body });
      created.replaceChildren(h("div", { class: "card notice" }, "New key (shown once, copy it now): ",
        h("code", { id: "new-key" }, key.key)));
      await load();
    } catch (e) {
      if (!(e instanceof ApiError)) throw e;
      err.textContent = e.param ? `${e.param}: ${e.message}` : e.message;
    }
  } },
  h("h2", null, "New key"),
  Object.entries(f).map(([k, el]) => h("div", { class: "field" }, h("label", { for: el.id }, k), el)),
  err, h("button", { type: "submit", id: "create-key" }, "Create key"));

  async function load() {
    const keys = (await api(`/v1/keys${withRevoked.checked ? "?include_revoked=true" : ""}`)).data;
    listBox.replaceChildren(table(["id", "name", "role", "default policy", "req/min", "samples/min", "created", "state", ""],
      keys.map((k) => h("tr", { "data-key": k.id }, [k.id, k.name ?? "", k.role, k.default_policy ?? "",
        fmt(k.requests_per_minute), fmt(k.samples_per_minute), new Date(k.created_at * 1000).toLocaleString(),
        k.revoked ? "revoked" : "active"].map((v) => h("td", null, v)),
      h("td", null, k.revoked ? null : h("button", { type: "button", class: "revoke", onclick: async () => {
        try { await api(`/v1/keys/${encodeURIComponent(k.id)}`, { method: "DELETE" }); await load(); }
        catch (e) { listBox.prepend(errorBox(e)); }
      } }, "Revoke")))), { id: "keys-table" }));
  }
  await load(); // first: a key that may not list keys sees the service's 403 and no form
  root.append(h("h1", null, "API keys"), authState(me), created, formEl,
    h("p", null, h("label", null, withRevoked, " show revoked")), listBox);
}
