// Words for numbers the service sends: a policy's stop rule from its resolved params, params as text,
// what an aggregator ranked answers by, and the tokens of a response split into the parts that make
// up its usage. Pure functions (no DOM), shared by the playground and the policies page.

/** A number as written in a spec (0.5, not 0.50); anything else as JSON; missing as "?". */
export function num(x) {
  if (x === undefined) return "?";
  if (x === null) return "none";
  if (typeof x === "number") return Number.isInteger(x) ? String(x) : String(+x.toPrecision(4));
  return typeof x === "string" ? x : JSON.stringify(x);
}

/** "k=v, k=v" over every param (nested values as JSON); "none" for an empty object. */
export function paramsText(params) {
  const entries = Object.entries(params || {});
  return entries.length ? entries.map(([k, v]) => `${k}=${num(v)}`).join(", ") : "none";
}

/** A stored spec's params on the Policies page: the allocators' defaults are not served, so the
 * stored ones are shown as they are and the rest is said to be the defaults. */
export function storedParamsText(params) {
  const entries = Object.entries(params || {});
  return entries.length ? `${paramsText(params)} · others: defaults` : "all defaults";
}

const clauses = (...parts) => {
  const xs = parts.filter(Boolean);
  return xs.length ? ` (${xs.join("; ")})` : "";
};
const cap = (p) => (p.max_samples !== undefined ? `cap ${num(p.max_samples)}` : null);
const giveUp = (p) => (p.give_up_after ? `gives up after ${num(p.give_up_after)} samples without an answer` : null);
const beta = (p) => `P(leader is the majority) ≥ ${num(p.consistency_threshold)} after ≥ ${num(p.min_samples)} samples`;

/** One line per built-in allocator, from its resolved params (the response's ttc.policy.params). */
const RULES = {
  margin: (p) => `stop when the leader's weighted vote leads by ≥ ${num(p.margin)}` + clauses(cap(p), giveUp(p)),
  calibrated_margin: (p) => `stop when the leader's weighted vote leads by the ${num(p.quantile)} quantile of the ` +
    `first sample's score over the last ${num(p.history)} queries (≥ ${num(p.margin)} until ${num(p.min_history)} ` +
    `have finished)` + clauses(cap(p), giveUp(p)),
  adaptive_consistency: (p) => `stop when P(leader is the majority) ≥ ${num(p.threshold)}, after ≥ ` +
    `${num(p.min_samples)} samples` + clauses(cap(p), giveUp(p)),
  esc: (p) => `stop when a window of ${num(p.window)} samples is unanimous` + clauses(cap(p), giveUp(p)),
  deepconf: (p) => `stop when the leader holds ≥ ${num(p.consensus)} of the confidence-weighted vote, after ` +
    `${num(p.warmup)} warm-up traces` + clauses(cap(p), giveUp(p), p.fixed !== null && p.fixed !== undefined
      ? `traces cut below confidence ${num(p.fixed)}`
      : `traces cut below the warm-up's ${num(100 - p.keep)}th-percentile confidence`),
  fixed: (p) => `no early stop: draws n = ${num(p.n)} samples` +
    clauses(p.per_round ? `${num(p.per_round)} per round` : "all in one round"),
  uniform: (p) => `no early stop: an even share of the batch budget` + clauses(`n = ${num(p.n)} without a budget`),
  elimination: (p) => `a query is done when a sample scores ≥ ${num(p.gamma)} (with a verifier), else when ` +
    beta(p) + clauses(cap(p)),
  greedy: (p) => `a query is done when a sample scores ≥ ${num(p.gamma)} (with a verifier), else when ${beta(p)}, ` +
    `or when one more sample is worth ≤ ${num(p.min_value)}` + clauses(cap(p)),
  two_stage: (p) => `no stop rule: ${num(p.explore_fraction)} of the budget explored evenly, the rest split by ` +
    `difficulty, skipping queries whose leader holds ≤ ${num(p.hopeless_share)}` + clauses(`n = ${num(p.n)} without a budget`),
  difficulty: (p) => `no stop rule: samples by predicted success (bins at ${num(p.success_edges)} → ` +
    `${num(p.bin_samples)} samples)` + clauses(cap(p)),
};

export const BUILTIN_ALLOCATORS = Object.keys(RULES);

/** A step-level search (policy.search, as the response's ttc.policy sends it): how it grows solutions. */
const searchRule = (s) => `${s.method} search: ${num(s.width)} solutions grown one step at a time ` +
  `(≤ ${num(s.max_steps)} steps of ≤ ${num(s.step_tokens)} tokens` +
  (s.method === "particles" ? "; particles resampled by the PRM's step scores)" :
    `; ${num(s.expand)} continuations per kept beam, the PRM keeps the best)`);

/** "margin: stop when the leader's weighted vote leads by ≥ 0.5 (cap 12)"; a step-level search or a
 * compute-optimal rule says so instead of its (fixed) allocator; an allocator without a built-in rule:
 * its name and every param. */
export function stopRule(policy) {
  if (policy?.optimal) {
    const o = policy.optimal;
    return `compute-optimal: ${num(o.probe)} probe samples, then by their agreement (bins ${num(o.bins)}): ` +
      o.table.map((c) => `${c.method} ${num(c.width)}`).join(" / ");
  }
  if (policy?.search) return searchRule(policy.search);
  const name = policy?.allocator ?? "?";
  const rule = RULES[name];
  return rule ? `${name}: ${rule(policy.params || {})}` : `${name}: no built-in rule; params ${paramsText(policy?.params)}`;
}

/** What each stop reason means. */
export const STOP_REASONS = {
  policy: "the allocator's rule ended it",
  cap: "the per-query cap (the request's or the policy's own)",
  no_answer: "given up: no sample carried an answer",
  no_agreement: "given up: no two samples agreed",
  budget: "the sample budget",
  tokens: "the token budget",
  deadline: "the deadline (budget.deadline_ms)",
  error: "an error",
};

/** The short label of what an aggregator ranked answers by (ttc.answer_scores), shown beside the
 * vote counts; null for plain majority (its score is the count's share). */
export function scoreLabel(aggregator) {
  if (aggregator === "majority") return null;
  if (aggregator === "weighted_majority") return { short: "w", long: "summed verifier weight" };
  if (aggregator === "best_of_n" || aggregator === "verifier_rerank") return { short: "best", long: "best verifier score" };
  return { short: "score", long: "the aggregator's score" };
}

/** Answers in the aggregator's order: by its score where it ranks by one, then by votes. */
export function rankedVotes(ttc) {
  const votes = ttc.votes || {}, scores = ttc.answer_scores || {};
  const label = scoreLabel(ttc.policy?.aggregator);
  const answers = [...new Set([...Object.keys(votes), ...Object.keys(scores)])];
  const key = (a) => [label && scores[a] !== undefined ? scores[a] : 0, votes[a] || 0];
  answers.sort((a, b) => { const ka = key(a), kb = key(b); return kb[0] - ka[0] || kb[1] - ka[1]; });
  return answers.map((a) => ({
    answer: a, votes: votes[a] || 0, score: scores[a],
    text: `${a}: ${votes[a] || 0}` + (label && scores[a] !== undefined ? ` (${label.short} ${scores[a].toFixed(2)})` : ""),
  }));
}

/** Verifiers that call a model and so spend tokens counted in usage (and which kinds). */
const VERIFIER_TOKENS = { llm_judge: { prompt: true, completion: true }, reward_model: { prompt: true, completion: false } };

/** The tokens of a response in parts: the samples' completion tokens, the cancelled samples',
 * the rest of usage.completion_tokens (a model-calling verifier's, else labelled unaccounted for),
 * the prompt tokens; each part with what it is, and whether the parts add up. */
export function tokenParts(ttc, usage) {
  const samples = ttc.samples || [];
  const counted = samples.filter((smp) => typeof smp.tokens === "number");
  const sampleTokens = counted.reduce((sum, smp) => sum + smp.tokens, 0);
  const cancelled = ttc.tokens_cancelled ?? 0;
  const verifier = typeof ttc.policy?.verifier === "string" ? ttc.policy.verifier : ttc.policy?.verifier?.name;
  const spends = VERIFIER_TOKENS[verifier] || { prompt: false, completion: false };
  const rows = [
    { part: "samples", label: `samples' completion tokens (${samples.length} sample(s))`, tokens: sampleTokens,
      what: "the sum of each sample's tokens (the Samples table below)" +
        (counted.length < samples.length ? `; ${samples.length - counted.length} sample(s) carry no token count` : "") },
    { part: "cancelled", label: `cancelled samples (${ttc.samples_cancelled ?? 0})`, tokens: cancelled,
      what: "tokens the samples cancelled once the query was decided had generated (ttc.tokens_cancelled)" },
  ];
  if (!usage) {
    return { rows, addsUp: null, note: "No usage was sent with this response: nothing to check the parts against." };
  }
  const rest = usage.completion_tokens - sampleTokens - cancelled;
  const byVerifier = spends.completion && rest >= 0;  // a judge's tokens are the rest; never a negative share
  if (byVerifier) {
    rows.push({ part: "verifier", label: `verifier calls (${verifier})`, tokens: rest,
      what: `the judge's completions: usage.completion_tokens − samples − cancelled (not itemised by the service)` });
  } else if (rest !== 0) {
    rows.push({ part: "difference", label: "difference (not accounted for)", tokens: rest, mismatch: true,
      what: "usage.completion_tokens − samples − cancelled: tokens no part above explains" });
  }
  rows.push({ part: "completion", label: "= completion tokens (usage.completion_tokens)", tokens: usage.completion_tokens,
    total: true, what: rest === 0 || byVerifier ? "the parts above add up to it"
      : `the parts above come to ${sampleTokens + cancelled}, ${Math.abs(rest)} ${rest > 0 ? "short" : "over"}` });
  rows.push({ part: "prompt", label: "prompt tokens (usage.prompt_tokens)", tokens: usage.prompt_tokens,
    what: "the prompt of every backend call: each sample call (one per n=k call, or per streamed sample)" +
      (spends.prompt ? ` and each verifier call (${verifier})` : "") + "; the service does not itemise them" });
  const totalRest = usage.total_tokens - usage.prompt_tokens - usage.completion_tokens;
  if (totalRest !== 0) {
    rows.push({ part: "total-difference", label: "difference (not accounted for)", tokens: totalRest, mismatch: true,
      what: "usage.total_tokens − prompt − completion" });
  }
  rows.push({ part: "total", label: "= total tokens (usage.total_tokens)", tokens: usage.total_tokens, total: true,
    what: totalRest === 0 ? "prompt + completion" : "not prompt + completion: see the difference above" });
  const addsUp = (rest === 0 || byVerifier) && totalRest === 0;
  return {
    rows, addsUp,
    note: addsUp ? "The parts add up to usage." : "The parts do not add up to usage: the difference is shown above.",
  };
}
