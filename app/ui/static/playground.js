// Playground: one chat request with a chosen policy (by name, or an inline spec), always with
// ttc.return_samples. Shows every sample with its answer, score and tokens, the votes as they grew
// (stream mode: one row per progress event the service sent; otherwise: after each round, or launch
// wave of the stream schedule, from each sample's round), where and why the policy stopped, and the
// tokens spent.
import { ApiError, api, sse } from "./api.js";
import { bars, lineChart } from "./charts.js";
import { errorBox, fmt, h, table } from "./dom.js";

/** Cumulative vote counts after each round, from return_samples: one row per round (each sample
 * says the round, or launch wave, that started it; in the stream schedule samples of a later wave may
 * finish first, so they are grouped by round, not by order); samples without an answer do not vote. */
export function growth(samples) {
  const byRound = [...samples].sort((a, b) => a.round - b.round);  // stable: finish order within a round
  const votes = {};
  const steps = [];
  byRound.forEach((smp, i) => {
    if (smp.answer !== null && smp.answer !== undefined) votes[smp.answer] = (votes[smp.answer] || 0) + 1;
    if (i === byRound.length - 1 || byRound[i + 1].round !== smp.round) {
      steps.push({ step: `round ${smp.round}`, samples_drawn: i + 1, votes: { ...votes } });
    }
  });
  return steps;
}

function growthChart(steps) {
  const answers = [...new Set(steps.flatMap((st) => Object.keys(st.votes)))].slice(0, 7);
  if (!answers.length || steps.length < 1) return null;
  return lineChart(answers.map((a) => ({
    name: `answer ${a}`, points: steps.map((st) => ({ x: st.samples_drawn, y: st.votes[a] || 0 })),
  })), { title: "votes as they grew", x: "samples drawn", y: "votes", yMin: 0 });
}

function result(ttc, usage, steps, streamed) {
  const samples = ttc.samples || [];
  const stop = `Stopped after ${ttc.samples_drawn} sample(s) of at most ${ttc.max_samples ?? "?"}, in ` +
    `${ttc.rounds} round(s): ${ttc.stop_reason}` + (ttc.samples_cancelled ? ` (${ttc.samples_cancelled} cancelled)` : "");
  return h("div", { id: "result" },
    h("div", { class: "tiles" },
      h("div", { class: "tile" }, h("div", { class: "label" }, "answer"), h("div", { class: "value", id: "pg-answer" }, ttc.answer ?? "–"),
        h("div", { class: "sub" }, `confidence ${fmt(ttc.confidence)}`)),
      h("div", { class: "tile" }, h("div", { class: "label" }, "stop reason"), h("div", { class: "value", id: "pg-stop" }, ttc.stop_reason)),
      h("div", { class: "tile" }, h("div", { class: "label" }, "samples"), h("div", { class: "value", id: "pg-samples" }, ttc.samples_drawn),
        h("div", { class: "sub" }, `cap ${ttc.max_samples ?? "?"} · ${ttc.schedule}`)),
      h("div", { class: "tile" }, h("div", { class: "label" }, "tokens"), h("div", { class: "value", id: "pg-tokens" }, usage ? usage.total_tokens : "–"),
        h("div", { class: "sub" }, usage ? `${usage.prompt_tokens} prompt + ${usage.completion_tokens} completion` : ""))),
    h("p", { id: "pg-stopline" }, stop, ` · policy ${ttc.policy?.name ?? "?"} v${ttc.policy?.version ?? "?"}`),
    h("div", { class: "cols" },
      h("div", null, h("h2", null, "Final votes"), bars(Object.entries(ttc.votes || {}).sort((a, b) => b[1] - a[1])))),
    h("h2", null, streamed ? "Votes as they grew (progress events)" : "Votes as they grew (per round)"),
    h("div", { class: "cols" },
      table(["step", "samples drawn", "votes"], steps.map((st) => [st.step, st.samples_drawn,
        Object.entries(st.votes).map(([a, n]) => `${a}: ${n}`).join(", ")]), { id: "vote-growth" }),
      growthChart(steps)),
    h("h2", null, `Samples (${samples.length})`),
    table(["#", "round", "answer", "score", "tokens", "finish", "text"], samples.map((smp) => h("tr", {
      class: smp.index === ttc.selected_index ? "sample selected" : "sample" },
    [smp.index, smp.round, smp.answer ?? "–", fmt(smp.score, 3), smp.tokens, smp.finish_reason ?? "",
      (smp.text || "").slice(0, 160)].map((v) => h("td", null, v)))), { id: "samples" }));
}

export async function render(root, { me }) {
  const models = await api("/v1/models").catch(() => ({ data: [] }));
  const names = me.role === "admin" ? (await api("/v1/policies").catch(() => ({ data: [] }))).data.map((p) => p.name) : [];
  const out = h("div", { id: "pg-out" });
  const prompt = h("textarea", { id: "pg-prompt", rows: 3, value: "What is 2 + 40?" });
  const policy = h("input", { id: "pg-policy", list: "pg-policies", placeholder: "the key's default" });
  const inline = h("textarea", { id: "pg-inline", rows: 3, placeholder: '{"allocator": "fixed", "params": {"n": 4}}' });
  const useInline = h("input", { type: "checkbox", id: "pg-use-inline" });
  const stream = h("input", { type: "checkbox", id: "pg-stream" });
  const maxSamples = h("input", { id: "pg-max-samples", type: "number", min: 1, placeholder: "policy's" });
  const send = h("button", { type: "submit", id: "pg-send" }, "Send");
  const formEl = h("form", { class: "card", id: "pg-form", onsubmit: async (ev) => {
    ev.preventDefault();
    out.replaceChildren(h("p", { class: "muted" }, "running …"));
    send.disabled = true;
    try { await run(); } catch (err) { out.replaceChildren(errorBox(err instanceof ApiError && err.param ? Object.assign(err, { message: `${err.param}: ${err.message}` }) : err)); }
    finally { send.disabled = false; }
  } },
  h("div", { class: "field" }, h("label", { for: "pg-prompt" }, "prompt"), prompt),
  h("div", { class: "field" }, h("label", { for: "pg-policy" }, "policy"), policy,
    h("datalist", { id: "pg-policies" }, names.map((n) => h("option", { value: n })))),
  h("div", { class: "field" }, h("label", { for: "pg-inline" }, h("span", null, useInline, " inline spec")), inline),
  h("div", { class: "field" }, h("label", { for: "pg-max-samples" }, "budget.max_samples"), maxSamples),
  h("div", { class: "field" }, h("label", { for: "pg-stream" }, "stream"), stream), send);
  root.append(h("h1", null, "Playground"), formEl, out);

  async function run() {
    const ttc = { return_samples: true };
    if (useInline.checked) ttc.policy = JSON.parse(inline.value || "{}");
    else if (policy.value.trim()) ttc.policy = policy.value.trim();
    if (maxSamples.value) ttc.budget = { max_samples: +maxSamples.value };
    const body = { messages: [{ role: "user", content: prompt.value }], ttc };
    if (models.data.length) body.model = models.data[0].id;
    if (!stream.checked) {
      const resp = await api("/v1/chat/completions", { method: "POST", body });
      out.replaceChildren(result(resp.ttc, resp.usage, growth(resp.ttc.samples || []), false));
      return;
    }
    body.stream = true;
    body.stream_options = { include_usage: true };
    const steps = [];
    let final = null, usage = null;
    const live = h("ul", { id: "pg-live" });
    out.replaceChildren(h("h2", null, "Progress"), live);
    for await (const ev of sse("/v1/chat/completions", body)) {
      if (ev.error) throw new ApiError(200, ev);
      if (ev.usage) usage = ev.usage;
      const choice = (ev.choices || [])[0];
      if (choice && choice.finish_reason && ev.ttc) final = ev.ttc;
      else if (ev.ttc && ev.ttc.votes) {
        steps.push({ step: `round ${ev.ttc.round}`, samples_drawn: ev.ttc.samples_drawn, votes: ev.ttc.votes });
        live.append(h("li", null, `${ev.ttc.samples_drawn} drawn: ${JSON.stringify(ev.ttc.votes)}`));
      }
    }
    if (final) out.replaceChildren(result(final, usage, steps, true));
  }
}
