// Reports: a `ttc replay --json` file or a `ttc loadtest` summary.json, opened from disk (parsed in
// this page, nothing is uploaded) or from the service's ui.reports_dir, drawn as SVG charts.
import { api } from "./api.js";
import { lineChart } from "./charts.js";
import { errorBox, fmt, h, table } from "./dom.js";

/** "replay", "loadtest" or null (the same rule as app.routes.ui.report_kind). */
export function kindOf(data) {
  if (data && Array.isArray(data.rows) && Array.isArray(data.uniform)) return "replay";
  if (data && Array.isArray(data.levels) && data.meta && typeof data.meta === "object") return "loadtest";
  return null;
}

function ci(row, key) {
  const c = row[`${key}_ci`];
  return c ? { lo: c[0], hi: c[1] } : {};
}

function replayCharts(rep, axis) {
  const byTokens = axis === "tokens";
  const x = (r, i) => (byTokens ? rep.costs?.[i]?.tokens : r.mean_samples);
  const series = (key) => [
    { name: rep.policy, points: rep.rows.map((r, i) => ({ x: x(r, i), y: r[key], ...ci(r, key) })).filter((p) => p.x !== undefined) },
    ...(byTokens ? [] : [
      { name: "uniform majority", dash: "6 3", points: rep.uniform.map((r) => ({ x: r.mean_samples, y: r[key], ...ci(r, key) })) },
      { name: "oracle", dash: "2 3", points: rep.oracle.map((r) => ({ x: r.mean_samples, y: r[key], ...ci(r, key) })) },
    ]),
  ].filter((se) => se.points.length);
  const xl = byTokens ? "mean tokens per problem" : "mean samples per problem";
  return [lineChart(series("accuracy"), { title: "accuracy", x: xl, y: "accuracy (95% CI)", logX: !byTokens }),
    lineChart(series("coverage"), { title: "coverage", x: xl, y: "coverage (95% CI)", logX: !byTokens })];
}

function replay(rep) {
  const charts = h("div", { class: "cols charts", id: "report-charts" });
  const hasTokens = Array.isArray(rep.costs) && rep.costs.length === rep.rows.length;
  const axis = h("select", { id: "report-axis", disabled: !hasTokens },
    h("option", { value: "samples" }, "samples"), h("option", { value: "tokens" }, "tokens"));
  const note = h("span", { class: "muted" });
  const draw = () => {
    charts.replaceChildren(...replayCharts(rep, axis.value));
    note.textContent = axis.value === "tokens" ? " (the file has token costs for the policy only, not the references)" : "";
  };
  axis.addEventListener("change", draw);
  draw();
  return h("div", { id: "report", "data-kind": "replay" },
    h("h2", null, `Replay of ${rep.policy} on ${rep.data}`),
    h("p", null, `${rep.problems} problems × ${rep.seeds} seeds · budget: ${rep.budget_axis} · schedule ${rep.schedule ?? "rounds"}` +
      ` · pass@1 ${fmt(rep.pass_at_1, 3)} · majority@${rep.majority_at_k?.k} ${fmt(rep.majority_at_k?.accuracy, 3)}`),
    h("p", null, "x axis: ", axis, note), charts,
    table(["budget", "mean samples", "accuracy [95% CI]", "coverage [95% CI]", "uniform acc.", "efficiency", "tokens"],
      rep.rows.map((r, i) => [fmt(r.budget), fmt(r.mean_samples), `${fmt(r.accuracy, 3)} [${fmt(r.accuracy_ci[0], 3)}, ${fmt(r.accuracy_ci[1], 3)}]`,
        `${fmt(r.coverage, 3)} [${fmt(r.coverage_ci[0], 3)}, ${fmt(r.coverage_ci[1], 3)}]`, fmt(rep.uniform[i]?.accuracy, 3),
        rep.efficiency?.[i] == null ? "n/a" : `${fmt(rep.efficiency[i])}x`, fmt(rep.costs?.[i]?.tokens, 1)])));
}

function loadtest(rep) {
  const levels = rep.levels;
  const policies = [...new Set(levels.map((l) => l.policy))];
  const modes = [...new Set(levels.map((l) => l.mode))];
  const latency = modes.map((mode) => lineChart(policies.flatMap((p) => {
    const ls = levels.filter((l) => l.policy === p && l.mode === mode);
    return [{ name: `${p} p50`, dash: "5 3", points: ls.map((l) => ({ x: l.load, y: l.latency_p50_ms })) },
      { name: `${p} p99`, points: ls.map((l) => ({ x: l.load, y: l.latency_p99_ms })) }];
  }).filter((se) => se.points.length), { title: `latency (${mode})`, yMin: 0,
    x: mode === "closed" ? "concurrent clients" : "offered rate (req/s)", y: "latency (ms)" }));
  const accuracy = lineChart(policies.map((p) => ({ name: p, points: levels.filter((l) => l.policy === p && l.accuracy !== null)
    .map((l) => ({ x: l.tokens_per_query, y: l.accuracy, lo: l.accuracy_ci_low, hi: l.accuracy_ci_high })) }))
    .filter((se) => se.points.length), { title: "accuracy vs tokens", x: "completion tokens per query", y: "accuracy (95% CI)" });
  return h("div", { id: "report", "data-kind": "loadtest" },
    h("h2", null, `Load test of ${rep.meta.target ?? "?"} on ${rep.meta.data ?? "?"}`),
    h("p", null, `${rep.meta.time ?? ""} · ${policies.length} policies × ${levels.length / Math.max(policies.length, 1)} levels`),
    h("div", { class: "cols charts", id: "report-charts" }, ...latency, accuracy),
    table(["policy", "mode", "load", "reqs", "failed", "rps", "p50 ms", "p99 ms", "samples/q", "tokens/q", "accuracy", "stop reasons"],
      levels.map((l) => [l.policy, l.mode, fmt(l.load), l.requests, l.failed, fmt(l.throughput_rps, 1), fmt(l.latency_p50_ms, 1),
        fmt(l.latency_p99_ms, 1), fmt(l.samples_per_query), fmt(l.tokens_per_query, 1),
        l.accuracy == null ? "–" : `${fmt(l.accuracy, 3)} [${fmt(l.accuracy_ci_low, 3)}, ${fmt(l.accuracy_ci_high, 3)}]`,
        Object.entries(l.stop_reasons || {}).map(([r, n]) => `${r} ${n}`).join(", ")])));
}

export function show(box, data, label) {
  const kind = kindOf(data);
  if (!kind) return box.replaceChildren(errorBox(new Error(`${label} is neither a ttc replay nor a ttc loadtest report.`)));
  box.replaceChildren(kind === "replay" ? replay(data) : loadtest(data));
}

export async function render(root, { me }) {
  const box = h("div", { id: "report-box" });
  const file = h("input", { type: "file", id: "report-file", accept: ".json,application/json" });
  file.addEventListener("change", async () => {
    const f = file.files[0];
    if (!f) return;
    try { show(box, JSON.parse(await f.text()), f.name); } catch (err) { box.replaceChildren(errorBox(err)); }
  });
  const recent = h("div", { id: "recent-reports" });
  root.append(h("h1", null, "Reports"),
    h("div", { class: "card" }, h("label", { for: "report-file" }, "Open a report file: "), file), recent, box);
  if (me.role !== "admin") {
    recent.append(h("p", { class: "muted" }, "The service's report folder is listed for admin keys."));
    return;
  }
  const list = await api("/v1/ui/reports");
  if (!list.dir) recent.append(h("p", { class: "muted" }, "No ui.reports_dir configured: open a file above."));
  else recent.append(h("h2", null, `Recent runs in ${list.dir}`), table(["report", "kind", "modified", ""],
    list.data.map((r) => [r.name, r.kind, new Date(r.modified * 1000).toLocaleString(),
      h("button", { type: "button", class: "open-report", "data-name": r.name, onclick: async () => {
        try { show(box, await api(`/v1/ui/reports/${r.name.split("/").map(encodeURIComponent).join("/")}`), r.name); }
        catch (err) { box.replaceChildren(errorBox(err)); }
      } }, "Open")]), { id: "reports-table" }));
}
