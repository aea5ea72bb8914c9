// Playground: one chat request with a chosen policy (by name, or an inline spec), always with
// ttc.return_samples. Shows every sample with its answer, score and tokens, the votes as they grew
// (stream mode: one row per progress event the service sent, an event identical to the one before it
// counted but not shown again; otherwise: after each round, or launch wave of the stream schedule,
// from each sample's round), the final votes with what the aggregator ranked them by, where and why
// the policy stopped (its stop rule from the resolved params), and the tokens spent in parts that
// add up to usage.
import { ApiError, api, sse } from "./api.js";
import { bars, lineChart } from "./charts.js";
import { errorBox, fmt, h, table } from "./dom.js";
import { STOP_REASONS, paramsText, rankedVotes, scoreLabel, stopRule, tokenParts } from "./explain.js";

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

/** What one progress event carries, its votes in a canonical order (an event that repeats the one
 * before it with its vote keys in another order is still a repeat). */
const progressKey = (t) => JSON.stringify([t.round, t.samples_drawn, t.samples_cancelled ?? 0,
  Object.entries(t.votes || {}).sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0))]);

/** Rows of the streamed vote growth: one per progress event, except an event identical to the one
 * before it (same round, samples drawn, cancelled and votes: it carries no change), which is counted
 * in `repeats` and not shown again. */
export function progressRows(events) {
  const rows = [];
  let prev = null, repeats = 0;
  events.forEach((t, i) => {
    const key = progressKey(t);
    if (key === prev) { repeats += 1; return; }
    prev = key;
    rows.push({ step: `event ${i + 1} · round ${t.round}`, samples_drawn: t.samples_drawn,
      samples_cancelled: t.samples_cancelled ?? 0, votes: t.votes || {} });
  });
  return { rows, events: events.length, repeats };
}

function votesTable(ttc) {
  const label = scoreLabel(ttc.policy?.aggregator);
  const ranked = rankedVotes(ttc);
  return h("div", null,
    h("h2", null, "Final votes"),
    h("p", { class: "muted", id: "pg-votes-by" }, label
      ? `${ttc.policy.aggregator}: votes, and beside them the ${label.long} (${label.short}) it ranked the answers by`
      : `${ttc.policy?.aggregator ?? "?"}: ranked by votes`),
    h("ul", { id: "pg-votes" }, ranked.map((r) => h("li", { "data-answer": r.answer }, r.text))),
    bars(ranked.map((r) => [r.answer, r.votes])));
}

function tokensTable(ttc, usage) {
  const parts = tokenParts(ttc, usage);
  return h("div", null,
    h("h2", null, "Tokens"),
    table(["part", "tokens", "what it is"], parts.rows.map((r) => h("tr", {
      "data-part": r.part, class: [r.mismatch ? "mismatch" : "", r.total ? "total" : ""].join(" ").trim() || null },
    [r.label, fmt(r.tokens), r.what].map((v) => h("td", null, v)))), { id: "pg-token-parts" }),
    h("p", { id: "pg-token-check", class: parts.addsUp === false ? "error" : "muted" }, parts.note));
}

function policyLine(pol) {
  if (!pol) return null;
  const verifier = typeof pol.verifier === "string" ? { name: pol.verifier } : pol.verifier;
  const sched = typeof pol.schedule === "string" ? { mode: pol.schedule } : pol.schedule;
  return h("p", { id: "pg-policy-params" },
    h("span", { class: "muted" }, "resolved params: "), h("code", null, paramsText(pol.params)),
    ` · aggregator ${pol.aggregator ?? "?"}`,
    verifier ? ` · verifier ${verifier.name}` + (Object.keys(verifier.params || {}).length
      ? ` (${paramsText(verifier.params)}; others: defaults)` : " (defaults)") : " · no verifier",
    ` · schedule ${sched ? sched.mode + (sched.width ? ` (width ${sched.width})` : "") : "rounds"}`);
}

function result(ttc, usage, steps, progress) {
  const samples = ttc.samples || [];
  const streamed = progress !== null;
  const reason = STOP_REASONS[ttc.stop_reason];
  const stop = `Stopped after ${ttc.samples_drawn} sample(s) of at most ${ttc.max_samples ?? "?"}, in ` +
    `${ttc.rounds} round(s): ${ttc.stop_reason}` + (reason ? ` (${reason})` : "") +
    (ttc.samples_cancelled ? `, ${ttc.samples_cancelled} cancelled` : "");
  const columns = streamed ? ["step", "samples drawn", "votes", "cancelled"] : ["step", "samples drawn", "votes"];
  return h("div", { id: "result", "data-request": ttc.request_id },
    h("div", { class: "tiles" },
      h("div", { class: "tile" }, h("div", { class: "label" }, "answer"), h("div", { class: "value", id: "pg-answer" }, ttc.answer ?? "–"),
        h("div", { class: "sub" }, `confidence ${fmt(ttc.confidence)}`)),
      h("div", { class: "tile wide" }, h("div", { class: "label" }, "stop reason"), h("div", { class: "value", id: "pg-stop" }, ttc.stop_reason),
        h("div", { class: "sub", id: "pg-rule" }, stopRule(ttc.policy))),
      h("div", { class: "tile" }, h("div", { class: "label" }, "samples"), h("div", { class: "value", id: "pg-samples" }, ttc.samples_drawn),
        h("div", { class: "sub" }, `cap ${ttc.max_samples ?? "?"} · ${ttc.schedule}`)),
      h("div", { class: "tile" }, h("div", { class: "label" }, "tokens"), h("div", { class: "value", id: "pg-tokens" }, usage ? usage.total_tokens : "–"),
        h("div", { class: "sub" }, usage ? `${usage.prompt_tokens} prompt + ${usage.completion_tokens} completion` : ""))),
    h("p", { id: "pg-stopline" }, stop, ` · policy ${ttc.policy?.name ?? "?"} v${ttc.policy?.version ?? "?"}`,
      ` · request ${ttc.request_id ?? "?"}`),
    policyLine(ttc.policy),
    h("div", { class: "cols" }, votesTable(ttc), tokensTable(ttc, usage)),
    h("h2", null, streamed ? "Votes as they grew (progress events)" : "Votes as they grew (per round)"),
    streamed ? h("p", { class: "muted", id: "pg-growth-note" }, `${progress.events} progress event(s), ${steps.length} row(s)` +
      (progress.repeats ? `: ${progress.repeats} event(s) repeated the one before (no change) and are not shown again` : "")) : null,
    h("div", { class: "cols" },
      table(columns, steps.map((st) => [st.step, st.samples_drawn,
        Object.entries(st.votes).map(([a, n]) => `${a}: ${n}`).join(", "), ...(streamed ? [st.samples_cancelled] : [])]),
      { id: "vote-growth" }),
      growthChart(steps)),
    h("h2", null, `Samples (${samples.length})`),
    table(["#", "round", "answer", "score", "tokens", "finish", "text"], samples.map((smp) => h("tr", {
      class: smp.index === ttc.selected_index ? "sample selected" : "sample" },
    [smp.index, smp.round, smp.answer ?? "–", fmt(smp.score, 3), smp.tokens, smp.finish_reason ?? "",
      [thought(smp), (smp.text || "").slice(0, 160)]].map((v) => h("td", null, v)))), { id: "samples" }));
}

/** A reasoning model's thought, folded: a summary with its length, the text when opened (the answer
 * that follows it is the sample's text). Nothing for a sample without a thought. */
function thought(smp) {
  if (!smp.reasoning) return null;
  const tokens = smp.reasoning_tokens ?? "?";
  return h("details", { class: "thought" }, h("summary", null, `thought · ${fmt(tokens)} tokens`),
    h("pre", null, smp.reasoning));
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
      out.replaceChildren(result(resp.ttc, resp.usage, growth(resp.ttc.samples || []), null));
      return;
    }
    body.stream = true;
    body.stream_options = { include_usage: true };
    const events = [];
    let final = null, usage = null;
    const live = h("ul", { id: "pg-live" });
    out.replaceChildren(h("h2", null, "Progress"), live);
    for await (const ev of sse("/v1/chat/completions", body)) {
      if (ev.error) throw new ApiError(200, ev);
      if (ev.usage) usage = ev.usage;
      const choice = (ev.choices || [])[0];
      if (choice && choice.finish_reason && ev.ttc) final = ev.ttc;
      else if (ev.ttc && ev.ttc.votes) {
        const repeat = events.length > 0 && progressKey(events[events.length - 1]) === progressKey(ev.ttc);
        events.push(ev.ttc);
        if (!repeat) {  // an event that repeats the one before it carries no change: no new line
          live.append(h("li", null, `${ev.ttc.samples_drawn} drawn, ${ev.ttc.samples_cancelled ?? 0} cancelled: ` +
            JSON.stringify(ev.ttc.votes)));
        }
      }
    }
    const progress = progressRows(events);
    if (final) out.replaceChildren(result(final, usage, progress.rows, progress));
  }
}
