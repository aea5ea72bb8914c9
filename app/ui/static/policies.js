// Policies (admin): list with the default and the keys bound to each, create / edit through a form
// whose server-side validation errors appear next to the field their `param` names, set the
// default, and a diff between any two versions. Params are shown as stored, with the note that the
// others are the allocator's defaults (the allocators' defaults are not served: the playground shows
// a request's fully resolved params).
import { ApiError, api } from "./api.js";
import { errorBox, h, table } from "./dom.js";
import { storedParamsText } from "./explain.js";

const TEXT = ["name", "description", "allocator", "aggregator"];
const JSONISH = ["params", "verifier", "answer", "budget", "schedule"];
const HINT = {
  params: '{"max_samples": 8}', verifier: '"likelihood" or {"name": ..., "params": {...}}',
  answer: '{"kind": "number"}', budget: '{"max_samples": 16}', schedule: '"stream" or {"mode": "rounds"}',
};

/** The form field a server error's param names: its first segment ("params.threshold" -> "params"). */
export const fieldOf = (param) => (param ? String(param).split(/[.[]/)[0] : null);

/** Flatten a JSON value into {"a.b[0]": JSON text} for the version diff. */
export function flatten(value, path = "", out = {}) {
  if (value && typeof value === "object" && !Array.isArray(value) && Object.keys(value).length) {
    for (const [k, v] of Object.entries(value)) flatten(v, path ? `${path}.${k}` : k, out);
  } else if (Array.isArray(value) && value.length) {
    value.forEach((v, i) => flatten(v, `${path}[${i}]`, out));
  } else {
    out[path || "(root)"] = JSON.stringify(value);
  }
  return out;
}

export function diff(a, b) {
  const fa = flatten(a), fb = flatten(b);
  const keys = [...new Set([...Object.keys(fa), ...Object.keys(fb)])].sort();
  return keys.filter((k) => fa[k] !== fb[k]).map((k) => ({
    path: k, change: !(k in fa) ? "added" : !(k in fb) ? "removed" : "changed", old: fa[k], new: fb[k],
  }));
}

function policyDoc(p) {
  return { description: p.description ?? null, ...p.spec };
}

function form(existing, onSaved) {
  const inputs = {}, errors = {};
  const general = h("p", { class: "error", id: "form-error", role: "alert" });
  const field = (name, control) => {
    inputs[name] = control;
    errors[name] = h("span", { class: "field-error", id: `err-${name}`, "data-field": name });
    return h("div", { class: "field" }, h("label", { for: `f-${name}` }, name), control, errors[name]);
  };
  const spec = existing ? existing.spec : { allocator: "", aggregator: "majority" };
  const rows = [
    ...TEXT.map((n) => field(n, h("input", {
      id: `f-${n}`, name: n, value: n === "name" ? existing?.name ?? "" : n === "description"
        ? existing?.description ?? "" : spec[n] ?? "", readOnly: n === "name" && !!existing,
    }))),
    ...JSONISH.map((n) => field(n, h("textarea", {
      id: `f-${n}`, name: n, rows: 2, placeholder: n === "params" ? `all defaults, or e.g. ${HINT[n]}` : HINT[n],
      value: spec[n] === undefined || (n === "params" && !Object.keys(spec[n] || {}).length) ? "" : JSON.stringify(spec[n]),
    }))),
    field("record", h("select", { id: "f-record", name: "record" },
      ["", "true", "false"].map((v) => h("option", { value: v, selected: String(spec.record ?? "") === v },
        v || "service default")))),
  ];
  const clear = () => {
    general.textContent = "";
    for (const n of Object.keys(errors)) { errors[n].textContent = ""; inputs[n].classList.remove("invalid"); }
  };
  const show = (name, message) => {
    if (name && errors[name]) { errors[name].textContent = message; inputs[name].classList.add("invalid"); }
    else general.textContent = message;
  };
  const body = () => {
    const out = {};
    for (const n of TEXT) { const v = inputs[n].value.trim(); if (v) out[n] = v; }
    for (const n of JSONISH) {
      const v = inputs[n].value.trim();
      if (!v) continue;
      try { out[n] = JSON.parse(v); } catch {
        if (/^[\w.-]+$/.test(v)) out[n] = v;
        else throw Object.assign(new Error(`${n} is not JSON.`), { field: n });
      }
    }
    if (inputs.record.value) out.record = inputs.record.value === "true";
    if (existing) out.expected_version = existing.latest_version;
    return out;
  };
  const el = h("form", { id: "policy-form", class: "card", novalidate: true, onsubmit: async (ev) => {
    ev.preventDefault();
    clear();
    let data;
    try { data = body(); } catch (err) { return show(err.field, err.message); }
    try {
      const saved = existing
        ? await api(`/v1/policies/${encodeURIComponent(existing.name)}`, { method: "PUT", body: data })
        : await api("/v1/policies", { method: "POST", body: data });
      onSaved(saved);
    } catch (err) {
      if (!(err instanceof ApiError)) throw err;
      show(fieldOf(err.param), err.param ? `${err.param}: ${err.message}` : err.message);
    }
  } },
  h("h2", null, existing ? `Edit ${existing.name} (new version after v${existing.latest_version})` : "New policy"),
  rows, general, h("button", { type: "submit", id: "save-policy" }, existing ? "Save new version" : "Create"));
  return el;
}

async function versions(name, box) {
  const list = (await api(`/v1/policies/${encodeURIComponent(name)}/versions`)).data;
  const pick = (id, selected) => h("select", { id },
    list.map((v) => h("option", { value: v.version, selected: v.version === selected }, `v${v.version}`)));
  const last = list[list.length - 1]?.version ?? 1;
  const a = pick("diff-a", Math.max(1, last - 1)), b = pick("diff-b", last);
  const out = h("div", { id: "diff" });
  const show = () => {
    const va = list.find((v) => v.version === +a.value), vb = list.find((v) => v.version === +b.value);
    const rows = diff(policyDoc(va), policyDoc(vb));
    out.replaceChildren(rows.length
      ? table(["field", "change", `v${va.version}`, `v${vb.version}`],
        rows.map((r) => h("tr", { class: `diff-${r.change}` },
          [r.path, r.change, r.old ?? "", r.new ?? ""].map((v) => h("td", null, v)))), { id: "diff-table" })
      : h("p", { class: "muted" }, "No difference."));
  };
  a.addEventListener("change", show);
  b.addEventListener("change", show);
  box.replaceChildren(h("div", { class: "card", id: "versions" },
    h("h2", null, `Versions of ${name}`),
    table(["version", "created", "by", "source", "description"], list.map((v) => [
      `v${v.version}`, new Date(v.created_at * 1000).toLocaleString(), v.created_by ?? "", v.source ?? "",
      v.description ?? ""])),
    h("p", null, "Diff ", a, " → ", b), out));
  show();
}

export async function render(root) {
  const side = h("div", { id: "policy-side" });
  const listBox = h("div", { id: "policy-list" });
  const status = h("p", { class: "muted", id: "policy-status" });
  await load(); // first: a key that may not list policies sees the service's 403 and no form
  root.append(h("h1", null, "Policies"), status,
    h("button", { type: "button", id: "new-policy", onclick: () => side.replaceChildren(form(null, saved)) }, "New policy"),
    h("div", { class: "cols" }, listBox, side));
  async function load() {
    const [pols, keys] = await Promise.all([api("/v1/policies"), api("/v1/keys")]);
    const bound = {};
    for (const k of keys.data) if (k.default_policy) (bound[k.default_policy] ||= []).push(k.name || k.id);
    listBox.replaceChildren(table(["name", "version", "allocator", "params", "aggregator", "default", "bound keys", ""],
      pols.data.map((p) => h("tr", { "data-policy": p.name }, [
        h("td", null, p.name), h("td", null, `v${p.version}`), h("td", null, p.spec.allocator),
        h("td", { class: "params" }, storedParamsText(p.spec.params)),
        h("td", null, p.spec.aggregator ?? ""), h("td", { class: "default" }, p.default ? "default" : ""),
        h("td", { class: "bound" }, (bound[p.name] || []).join(", ")),
        h("td", null,
          h("button", { type: "button", class: "edit", onclick: () => side.replaceChildren(form(p, saved)) }, "Edit"),
          h("button", { type: "button", class: "versions", onclick: () => versions(p.name, side).catch(fail) }, "Versions"),
          p.default ? null : h("button", { type: "button", class: "make-default", onclick: () => makeDefault(p.name) },
            "Make default")),
      ])), { id: "policies-table" }));
  }
  const fail = (err) => side.replaceChildren(errorBox(err));
  async function saved(p) {
    status.textContent = `Saved ${p.name} v${p.version}.`;
    await load();
    await versions(p.name, side);
  }
  async function makeDefault(name) {
    try {
      await api("/v1/settings/default_policy", { method: "PUT", body: { policy: name } });
      status.textContent = `${name} is the default policy.`;
      await load();
    } catch (err) { fail(err); }
  }
}
