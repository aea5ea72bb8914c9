// Overview: live numbers from GET /v1/ttc/stats, polled every POLL_MS while this tab is visible.
// Rates and percentiles are over the last poll interval (difference of two snapshots); before the
// second snapshot, and while no request finished in the interval, the totals since start are shown.
import { api } from "./api.js";
import { sparkline } from "./charts.js";
import { errorBox, fmt, h, table } from "./dom.js";

export const POLL_MS = 2000;
const HISTORY = 60;

/** Quantile q of a cumulative histogram ({le, counts}), linear within the bucket (as Prometheus does). */
export function quantile(q, le, counts) {
  const total = counts[counts.length - 1] || 0;
  if (!total) return null;
  const rank = q * total;
  for (let i = 0; i < le.length; i++) {
    if (counts[i] >= rank) {
      if (le[i] >= 1e308) return i ? le[i - 1] : null;
      const lo = i ? le[i - 1] : 0, below = i ? counts[i - 1] : 0;
      const inBucket = counts[i] - below;
      return inBucket ? lo + ((le[i] - lo) * (rank - below)) / inBucket : le[i];
    }
  }
  return null;
}

function totals(stats) {
  const t = { ok: 0, samples: 0, saved: 0, tokens: 0, stop: {} };
  for (const p of Object.values(stats.policies)) {
    t.ok += p.requests; t.samples += p.samples; t.saved += p.saved;
    t.tokens += p.prompt_tokens + p.completion_tokens;
    for (const [r, n] of Object.entries(p.stop_reasons)) t.stop[r] = (t.stop[r] || 0) + n;
  }
  t.requests = Object.values(stats.requests).reduce((a, b) => a + b, 0);
  t.failed = t.requests - (stats.requests.ok || 0);
  return t;
}

function tile(id, label, value, sub) {
  return h("div", { class: "tile" }, h("div", { class: "label" }, label),
    h("div", { class: "value", id }, value), h("div", { class: "sub" }, sub || ""));
}

export function view(cur, prev, history) {
  const t = totals(cur);
  const p = prev ? totals(prev) : null;
  const dt = prev ? cur.time - prev.time : 0;
  const dOk = p ? t.ok - p.ok : 0;
  const windowed = p && dOk > 0;
  const rate = p && dt > 0 ? (t.requests - p.requests) / dt : null;
  const per = (key) => (windowed ? (t[key] - p[key]) / dOk : t.ok ? t[key] / t.ok : null);
  const lat = cur.latency;
  const counts = windowed && prev.latency.count < lat.count
    ? lat.counts.map((c, i) => c - (prev.latency.counts[i] || 0)) : lat.counts;
  const ms = (q) => { const v = quantile(q, lat.le, counts); return v === null ? "–" : `${fmt(v * 1000, 0)} ms`; };
  const cap = t.samples + t.saved;
  const scope = windowed ? `last ${fmt(dt, 1)} s` : "since start";
  return h("div", null,
    h("div", { class: "tiles" },
      tile("stat-rate", "Requests / s", rate === null ? "–" : fmt(rate, 2), sparkline(history)),
      tile("stat-requests", "Requests", fmt(t.requests), `${fmt(t.failed)} failed`),
      tile("stat-samples", "Samples / query", fmt(per("samples")), scope),
      tile("stat-tokens", "Tokens / query", fmt(per("tokens"), 0), scope),
      tile("stat-p50", "p50 latency", ms(0.5), scope),
      tile("stat-p99", "p99 latency", ms(0.99), scope),
      tile("stat-saved", "Samples saved", fmt(t.saved),
        cap ? `${fmt((100 * t.saved) / cap, 0)}% of the policies' caps` : "against the policies' caps"),
      tile("stat-inflight", "Streamed samples in flight", fmt(cur.stream_samples_in_flight),
        `${fmt(cur.batches_running)} background batches`)),
    h("div", { class: "cols" },
      h("div", null, h("h2", null, "Stop reasons"),
        table(["reason", "runs"], Object.entries(t.stop).sort((a, b) => b[1] - a[1]), { id: "stop-reasons" })),
      h("div", null, h("h2", null, "Backends"),
        table(["backend", "state", "in flight", "calls", "errors"], cur.backends.map((b) => [
          b.name, b.up ? "up" : "down", b.outstanding, fmt(b.calls), fmt(b.errors)]), { id: "backends" }))),
    h("h2", null, "Per policy (since start)"),
    table(["policy", "requests", "samples / q", "saved / q", "tokens / q", "stop reasons"],
      Object.entries(cur.policies).map(([name, s]) => {
        const n = s.requests || 1;
        return [name, fmt(s.requests), fmt(s.samples / n), fmt(s.saved / n),
          fmt((s.prompt_tokens + s.completion_tokens) / n, 0),
          Object.entries(s.stop_reasons).map(([r, c]) => `${r} ${c}`).join(", ")];
      }), { id: "per-policy" }));
}

export async function render(root) {
  const body = h("div", { id: "overview" });
  const stamp = h("p", { class: "muted", id: "updated" });
  root.append(h("h1", null, "Overview"), stamp, body);
  let prev = null, timer = null, stopped = false;
  const history = [];
  async function tick() {
    timer = null;
    if (stopped) return;
    if (document.visibilityState === "visible") {
      try {
        const cur = await api("/v1/ttc/stats");
        if (stopped) return;
        if (prev && cur.time > prev.time) {
          const req = (x) => Object.values(x.requests).reduce((a, b) => a + b, 0);
          history.push((req(cur) - req(prev)) / (cur.time - prev.time));
          if (history.length > HISTORY) history.shift();
        }
        body.replaceChildren(view(cur, prev, history));
        stamp.textContent = `updated ${new Date(cur.time * 1000).toLocaleTimeString()} · every ${POLL_MS / 1000} s`;
        prev = cur;
      } catch (err) {
        body.replaceChildren(errorBox(err));
      }
    }
    if (!stopped) timer = setTimeout(tick, POLL_MS);
  }
  await tick();
  return () => { stopped = true; if (timer) clearTimeout(timer); };
}
