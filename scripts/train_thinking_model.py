#!/usr/bin/env python
"""Train the thinking demo model ``arith-thinker``: a ~1M-parameter char-level Llama that answers +/-
chains with a column-by-column, self-checked thought ``<think>...</think>`` and one final line.

Plain torch + transformers on CPU (run it with the vLLM venv: ``.venv-vllm/bin/python``)::

    OMP_NUM_THREADS=2 nice -n 5 .venv-vllm/bin/python scripts/train_thinking_model.py \\
        --out models/arith-thinker --minutes 32 --seed 0

Smoke test (seconds): ``--minutes 0.3 --out /tmp/x``. ``make demo-thinker`` runs this, then
``scripts/eval_thinking_model.py``.

What it does
* builds a character-level tokenizer offline (one token per character, so every digit is its own
  token; specials ``<pad> <s> </s> <unk>``, plus ``<think>`` and ``</think>`` as single, non-special
  tokens: vLLM's reasoning parsers look them up in the vocabulary, and the decoded text keeps them so
  the parser can split on them), with a chat template that renders exactly the training sequence
  ``<s>{question}\\nA:\\n<think>\\n{thought}</think>{final}</s>`` (``ttc_tools/demo/thinking.py``); the
  generation prompt ends in ``<think>\\n`` (``enable_thinking=false`` in ``chat_template_kwargs``
  closes the thought at once: ``<think>\\n</think>``);
* trains a LlamaConfig model (hidden 128, 4 layers, 4 heads of size 32, FFN 512, tied embeddings,
  2048 positions) on traces streamed from ``ttc_tools.demo.thinking`` -- batches of a single level
  filled to a fixed token budget, loss only on the completion (thought, ``</think>``, final line,
  eos), AdamW, learning rate warmed up to ``--peak-lr``, held until ``--hold`` of the budget, then a
  cosine down to a twentieth of it;
* saves model, generation config (eos = ``</s>``) and tokenizer to ``--out``, checks that the chat
  template renders the training text, optionally runs a small greedy check, and writes
  ``train_eval.json`` and the model card ``README.md`` (evaluation section filled in by the eval script).

Determinism: initialisation and the data stream are fixed by ``--seed``; ``--steps N`` makes the run
(schedule included) exactly reproducible on the same machine/thread count, while ``--minutes`` follows
wall-clock progress so the run fits its budget wherever the machine's speed lets it stop.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
# Spinning OpenMP workers stall each other under CPU contention; passive waiting keeps 2 threads useful.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors  # noqa: E402
from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast  # noqa: E402

from ttc_tools.demo.problems import BOS, EOS  # noqa: E402
from ttc_tools.demo.thinking import (  # noqa: E402
    GENERATION_PROMPT,
    LEVELS,
    THINK_END,
    THINK_START,
    extract_answer,
    generate,
    make_set,
    make_trace,
)

PAD, UNK = "<pad>", "<unk>"
SPECIALS = [PAD, BOS, EOS, UNK]
THINK_TOKENS = [THINK_START, THINK_END]
CHARS = ["\n"] + [chr(c) for c in range(32, 127)]
MAX_LEN = 2048
EVAL_SEED = 1234  # eval problems (thinking.make_set(EVAL_N, seed=EVAL_SEED)) are excluded from training
EVAL_N = 100

_GEN = GENERATION_PROMPT.replace("\n", "\\n")
# User messages render as their content after <s>; an assistant turn renders the generation prompt, its
# thought (the content up to </think> when the content carries it, else `reasoning` /
# `reasoning_content`), </think>, the final line and </s>. System messages are ignored.
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{% if message['role'] == 'user' %}{{ message['content'] }}"
    "{% elif message['role'] == 'assistant' %}{{ '" + _GEN + "' }}"
    "{% set content = message['content'] or '' %}"
    "{% if '" + THINK_END + "' in content %}{{ content }}"
    "{% else %}"
    "{% if message['reasoning'] is defined and message['reasoning'] %}{{ message['reasoning'] }}"
    "{% elif message['reasoning_content'] is defined and message['reasoning_content'] %}"
    "{{ message['reasoning_content'] }}{% endif %}"
    "{{ '" + THINK_END + "' }}{{ content }}"
    "{% endif %}{{ eos_token }}"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '" + _GEN + "' }}"
    "{% if enable_thinking is defined and enable_thinking is false %}{{ '" + THINK_END + "' }}{% endif %}"
    "{% endif %}"
)

# level -> relative share of batches (each batch holds the same number of tokens)
LEVEL_WEIGHTS = {1: 0.6, 2: 0.8, 3: 1.0, 4: 1.0, 5: 1.0, 6: 1.0, 7: 1.0, 8: 1.0}
# the shares at the start of a curriculum (--curriculum): short traces first, where copying and the column
# arithmetic are learned from many more examples per token; they move linearly to LEVEL_WEIGHTS
EARLY_WEIGHTS = {1: 3.0, 2: 3.0, 3: 2.0, 4: 1.0, 5: 0.3, 6: 0.2, 7: 0.2, 8: 0.2}


def build_tokenizer() -> PreTrainedTokenizerFast:
    """One token per character; ``<think>``/``</think>`` are added (non-special) tokens of their own."""
    # the old model's 100 ids first (so --init models/arith-llama keeps its embeddings), then the think tokens
    vocab = {tok: i for i, tok in enumerate(SPECIALS + CHARS + THINK_TOKENS)}
    tk = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    tk.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tk.decoder = decoders.Fuse()
    tk.add_special_tokens(SPECIALS)
    tk.add_tokens([AddedToken(t, special=False, normalized=False) for t in THINK_TOKENS])
    tk.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A $B", special_tokens=[(BOS, vocab[BOS])]
    )
    tok = PreTrainedTokenizerFast(
        tokenizer_object=tk,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        unk_token=UNK,
        model_max_length=MAX_LEN,
        padding_side="left",
        clean_up_tokenization_spaces=False,
    )
    tok.chat_template = CHAT_TEMPLATE
    return tok


class Encoder:
    """Fast text -> ids for training (the tokenizer's ids; ``<think>``/``</think>`` as one id each)."""

    def __init__(self, tok: PreTrainedTokenizerFast, format_weight: float = 1.0) -> None:
        self.format_weight = format_weight
        self.map = {c: tok.convert_tokens_to_ids(c) for c in CHARS}
        self.think = {t: tok.convert_tokens_to_ids(t) for t in THINK_TOKENS}
        self.bos, self.eos, self.pad = tok.bos_token_id, tok.eos_token_id, tok.pad_token_id

    def encode(self, s: str) -> list[int]:
        ids: list[int] = []
        i = 0
        while i < len(s):
            for t, tid in self.think.items():
                if s.startswith(t, i):
                    ids.append(tid)
                    i += len(t)
                    break
            else:
                ids.append(self.map[s[i]])
                i += 1
        return ids

    def example(self, segments: list[tuple[str, bool]]) -> tuple[list[int], list[float]]:
        """Ids of ``Trace.segments`` (``<s>``/``</s>`` as their ids) and each id's loss weight: 0 for
        non-targets, 1 for targets, ``format_weight`` for the first token of the final line (the one that
        decides between ``The answer is`` and ``{``, i.e. whether the question asked for JSON)."""
        ids: list[int] = []
        weight: list[float] = []
        for k, (text, is_target) in enumerate(segments):
            piece = self.encode(text.removeprefix(BOS).removesuffix(EOS))
            piece = ([self.bos] if text.startswith(BOS) else []) + piece + ([self.eos] if text.endswith(EOS) else [])
            w = [float(is_target)] * len(piece)
            if k == len(segments) - 1 and w:
                w[0] = self.format_weight
            ids += piece
            weight += w
        return ids, weight


def trace_kwargs(args: argparse.Namespace) -> dict:
    return {"slip_rate": args.slip_rate, "reorder": args.reorder, "json_cue_rate": args.json_cue,
            "json_silent_rate": args.json_silent, "no_think_rate": args.no_think, "cut_rate": args.cut}


class Batches:
    """Batches of one level at a time, each filled to ``budget`` tokens (longest row x rows, padding
    included): examples are drawn in pools of about ``pool`` batches, sorted by length and cut into
    batches of similar lengths (~97% real tokens instead of ~65-88% for random order), which are then
    served in random order. Deterministic in ``rng``."""

    def __init__(self, enc: Encoder, rng: random.Random, budget: int, exclude: set[str], kw: dict,
                 pool: int = 4) -> None:
        self.enc, self.rng, self.budget, self.exclude, self.kw, self.pool = enc, rng, budget, exclude, kw, pool
        self.ready: dict[int, list[list[tuple[list[int], list[float]]]]] = {}

    def _fill(self, level: int) -> None:
        examples: list[tuple[list[int], list[float]]] = []
        n_tokens = 0
        while n_tokens < self.pool * self.budget:
            p = generate(level, self.rng)
            if p.question in self.exclude:
                continue
            ids, weight = self.enc.example(make_trace(p, self.rng, **self.kw).segments)
            if len(ids) > MAX_LEN:
                continue
            examples.append((ids, weight))
            n_tokens += len(ids)
        examples.sort(key=lambda e: len(e[0]))
        batches: list[list[tuple[list[int], list[float]]]] = [[]]
        for ex in examples:
            cur = batches[-1]
            if cur and len(ex[0]) * (len(cur) + 1) > self.budget:
                batches.append([ex])
            else:
                cur.append(ex)
        self.rng.shuffle(batches)
        self.ready[level] = batches

    def next(self, level: int) -> tuple[torch.Tensor, torch.Tensor, int]:
        """``(input_ids, loss weights, completion tokens)`` of the next batch of ``level``; the weight of
        position i applies to predicting token i from the tokens before it (0 for padding and prompt)."""
        if not self.ready.get(level):
            self._fill(level)
        seqs = self.ready[level].pop()
        longest = max(len(ids) for ids, _ in seqs)
        x = torch.full((len(seqs), longest), self.enc.pad, dtype=torch.long)
        w = torch.zeros((len(seqs), longest), dtype=torch.float32)
        for i, (ids, weight) in enumerate(seqs):
            x[i, : len(ids)] = torch.tensor(ids)
            w[i, : len(ids)] = torch.tensor(weight)
        return x, w, int((w > 0).sum())


def lr_at(p: float, peak: float, warmup: float = 0.02, hold: float = 0.6) -> float:
    """Linear warmup to ``peak`` over ``warmup``, constant until ``hold``, cosine to peak/20 at p=1."""
    if p < warmup:
        return peak * p / warmup
    if p < hold:
        return peak
    q = min(1.0, (p - hold) / (1 - hold))
    return peak / 20 + (peak - peak / 20) * 0.5 * (1 + math.cos(math.pi * q))


def check_template(tok: PreTrainedTokenizerFast, enc: Encoder, kw: dict) -> None:
    """The chat template renders exactly the training text; token ids agree with the encoder."""
    rng = random.Random(7)
    for level in (1, 4):
        tr = make_trace(generate(level, rng), rng, **{**kw, "json_cue_rate": 0.5})
        user = [{"role": "user", "content": tr.question}]
        full = tok.apply_chat_template([*user, {"role": "assistant", "content": tr.completion}], tokenize=False)
        split = tok.apply_chat_template(
            [*user, {"role": "assistant", "reasoning": tr.thought, "content": tr.final}], tokenize=False)
        gen = tok.apply_chat_template(user, tokenize=False, add_generation_prompt=True)
        off = tok.apply_chat_template(user, tokenize=False, add_generation_prompt=True, enable_thinking=False)
        assert full == split == tr.text, (full, tr.text)
        assert gen == BOS + tr.prompt and off == gen + THINK_END, (gen, off)
        ids = tok(tr.text[len(BOS):len(tr.text) - len(EOS)])["input_ids"]
        assert ids == enc.example(tr.segments)[0][:-1], "tokenizer and encoder disagree"
        assert tok.decode(ids, skip_special_tokens=True) == tr.text[len(BOS):len(tr.text) - len(EOS)]


def write_card_section(card_path: Path, info: dict) -> None:
    """Write the training numbers into the model card between ``<!-- TRAIN:START -->`` and
    ``<!-- TRAIN:END -->`` (the rest of the card is kept; a missing card gets a stub)."""
    greedy = ", ".join(f"L{k} {v:.2f}" for k, v in info["greedy_eval"].items()) or "not run (`--greedy-n`)"
    section = (
        "<!-- TRAIN:START -->\n"
        f"`scripts/train_thinking_model.py --out {info['out']}{' --init ' + info['init'] if info['init'] else ''} "
        f"--minutes {info['minutes']:g} --seed {info['seed']}"
        f"{' --curriculum ' + format(info['curriculum'], 'g') if info['curriculum'] else ''}` "
        f"(`make demo-thinker`), torch {info['torch']} / transformers {info['transformers']} on CPU, "
        f"{info['threads']} threads, bfloat16 autocast {'on' if info['bf16'] else 'off'} (weights fp32).\n\n"
        f"* {info['params']:,} parameters, {info['layers']} layers, hidden {info['hidden']}, vocabulary {info['vocab']}, "
        f"model.safetensors {info['size_mb']:.1f} MB\n"
        f"* steps: {info['steps']:,}; tokens seen: {info['tokens']:,} (completion tokens with loss: "
        f"{info['answer_tokens']:,}); batches of one level, {info['budget']:,} tokens each\n"
        f"* learning rate: 2% warmup to {info['peak_lr']:g}, held to {info['hold']:.0%} of the run, cosine to a "
        f"twentieth; level shares {info['level_weights']}"
        f"{', starting from ' + str(EARLY_WEIGHTS) + ' over the first ' + format(info['curriculum'], '.0%') if info['curriculum'] else ''}\n"
        f"* trace mix: {info['trace']}\n"
        f"* training time {info['train_seconds'] / 60:.1f} min, whole script {info['total_seconds'] / 60:.1f} min; "
        f"final loss (completion tokens, mean of the last 50 steps) {info['final_loss']:.4f}\n"
        f"* greedy check (transformers, {info['greedy_n']} problems per level): {greedy}\n"
        "<!-- TRAIN:END -->"
    )
    card = card_path.read_text() if card_path.exists() else (
        "# arith-thinker\n\n## Training\n\n<!-- TRAIN:START -->\n<!-- TRAIN:END -->\n\n"
        "## Evaluation\n\n<!-- EVAL:START -->\nNot evaluated yet: run `scripts/eval_thinking_model.py`.\n"
        "<!-- EVAL:END -->\n")
    start, end = card.find("<!-- TRAIN:START -->"), card.find("<!-- TRAIN:END -->")
    if start >= 0 and end >= 0:
        card = card[:start] + section + card[end + len("<!-- TRAIN:END -->"):]
    else:
        card += "\n## Training\n\n" + section + "\n"
    card_path.write_text(card)


@torch.no_grad()
def greedy_eval(model, tok, n_per_level: int, seed: int) -> dict[int, float]:
    """Greedy accuracy per level on ``n_per_level`` eval problems (transformers ``generate``)."""
    model.eval()
    res: dict[int, float] = {}
    for level in sorted(LEVELS):
        probs = make_set(n_per_level, [level], seed=seed)
        prompts = [tok.apply_chat_template([{"role": "user", "content": p.question}], tokenize=False,
                                           add_generation_prompt=True) for p in probs]
        batch = tok(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
        n_new = min(MAX_LEN - batch["input_ids"].shape[1], 220 + 160 * LEVELS[level][0])
        out = model.generate(**batch, max_new_tokens=n_new, do_sample=False, eos_token_id=tok.eos_token_id,
                             pad_token_id=tok.pad_token_id)
        texts = tok.batch_decode(out[:, batch["input_ids"].shape[1]:], skip_special_tokens=True)
        res[level] = sum(extract_answer(t) == p.gold for t, p in zip(texts, probs, strict=True)) / len(probs)
        print(f"greedy level {level}: {res[level]:.2f}", flush=True)
    model.train()
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="models/arith-thinker")
    ap.add_argument("--minutes", type=float, default=32.0, help="wall-clock budget for the whole script")
    ap.add_argument("--steps", type=int, default=0, help="fixed step count (reproducible); overrides --minutes")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--budget", type=int, default=6000, help="tokens per batch (incl. padding)")
    ap.add_argument("--peak-lr", type=float, default=3e-3)
    ap.add_argument("--hold", type=float, default=0.55, help="fraction of the run at peak learning rate")
    ap.add_argument("--slip-rate", type=float, default=0.1)
    ap.add_argument("--reorder", type=float, default=0.5)
    ap.add_argument("--json-cue", type=float, default=0.2)
    ap.add_argument("--json-silent", type=float, default=0.05)
    ap.add_argument("--no-think", type=float, default=0.03)
    ap.add_argument("--format-weight", type=float, default=1.0,
                    help="loss weight of the final line's first token (JSON or not: the cue's only signal)")
    ap.add_argument("--cut", type=float, default=0.05, help="share of thoughts cut short and closed (no loss on </think>)")
    ap.add_argument("--bf16", action=argparse.BooleanOptionalAction, default=True,
                    help="bfloat16 autocast for forward/backward (fp32 weights): ~2x on AVX512-BF16 CPUs")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--curriculum", type=float, default=0.0,
                    help="fraction of the run over which level shares move from EARLY_WEIGHTS to the final ones")
    ap.add_argument("--level-weights", default="", help='JSON {"level": share}; default LEVEL_WEIGHTS')
    ap.add_argument("--greedy-n", type=int, default=0, help="greedy check problems per level (0: none)")
    ap.add_argument("--init", default="", help="continue from this checkpoint instead of a random init")
    ap.add_argument("--threads", type=int, default=int(os.environ.get("OMP_NUM_THREADS", "2")))
    args = ap.parse_args()

    t0 = time.monotonic()
    torch.set_num_threads(args.threads)
    random.seed(args.seed)
    torch.manual_seed(args.seed)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    tok = build_tokenizer()
    enc = Encoder(tok, args.format_weight)
    kw = trace_kwargs(args)
    check_template(tok, enc, kw)
    heads = args.hidden // 32
    cfg = LlamaConfig(
        vocab_size=len(tok), hidden_size=args.hidden, intermediate_size=4 * args.hidden,
        num_hidden_layers=args.layers, num_attention_heads=heads, num_key_value_heads=heads, head_dim=32,
        max_position_embeddings=MAX_LEN, rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=True,
        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
        initializer_range=0.02,
    )
    if args.init:  # e.g. models/arith-llama: same architecture, 100 of the 102 token ids, 256 positions
        model = LlamaForCausalLM.from_pretrained(args.init, dtype=torch.float32)
        if model.config.vocab_size < len(tok):
            model.resize_token_embeddings(len(tok), mean_resizing=True)
        model.config.max_position_embeddings = MAX_LEN
    else:
        model = LlamaForCausalLM(cfg)
    model.train()
    params = sum(p.numel() for p in model.parameters())
    print(f"params={params:,} vocab={len(tok)} threads={args.threads}", flush=True)

    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=1e-4, betas=(0.9, 0.98), eps=1e-8)

    exclude = {p.question for p in make_set(EVAL_N, seed=EVAL_SEED)}
    data_rng = random.Random(f"think-{args.seed}" + (f"-resume-{args.init}" if args.init else ""))
    batches = Batches(enc, data_rng, args.budget, exclude, kw)
    level_weights = {int(k): float(v) for k, v in json.loads(args.level_weights).items()} \
        if args.level_weights else LEVEL_WEIGHTS
    levels = sorted(level_weights)

    def weights_at(p: float) -> list[float]:
        a = min(1.0, p / args.curriculum) if args.curriculum > 0 else 1.0
        return [(1 - a) * EARLY_WEIGHTS.get(lv, 0.0) + a * level_weights[lv] for lv in levels]

    total = args.minutes * 60
    reserve = min(60.0, 0.1 * total) + (12.0 * args.greedy_n if args.greedy_n else 0.0)  # save + greedy check
    train_end = t0 + total - reserve
    t_train = time.monotonic()
    span = max(1e-6, train_end - t_train)

    step = tokens = ans_tokens = 0
    losses: list[float] = []
    log: list[dict] = []
    last_print = time.monotonic()
    while True:
        now = time.monotonic()
        if args.steps:
            if step >= args.steps:
                break
            p = step / args.steps
        else:
            if now >= train_end:
                break
            p = (now - t_train) / span
        lr = lr_at(p, args.peak_lr, hold=args.hold)
        for g in opt.param_groups:
            g["lr"] = lr
        level = data_rng.choices(levels, weights_at(p))[0]
        x, w, n_ans = batches.next(level)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.bf16):
            logits = model(input_ids=x).logits
        ce = torch.nn.functional.cross_entropy(logits[:, :-1].float().reshape(-1, logits.shape[-1]),
                                               x[:, 1:].reshape(-1), reduction="none")
        loss = (ce * w[:, 1:].reshape(-1)).sum() / w[:, 1:].sum()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        tokens += x.numel()
        ans_tokens += n_ans
        losses.append(loss.item())
        if time.monotonic() - last_print > 30 or step == 1:
            el = time.monotonic() - t_train
            mean = sum(losses[-50:]) / len(losses[-50:])
            print(f"step {step} t={el/60:.1f}m p={p:.3f} lr={lr:.2e} lvl={level} loss={mean:.4f} "
                  f"tok/s={tokens/max(el, 1e-6):.0f}", flush=True)
            log.append({"step": step, "minutes": round(el / 60, 2), "loss": round(mean, 5), "lr": lr})
            last_print = time.monotonic()
    train_seconds = time.monotonic() - t_train
    print(f"training done: {step} steps, {tokens:,} tokens in {train_seconds/60:.1f} min", flush=True)

    model.generation_config = GenerationConfig(
        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
        do_sample=True, temperature=1.0, top_p=1.0, max_new_tokens=1600,
    )
    model.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    acc = greedy_eval(model, tok, args.greedy_n, seed=EVAL_SEED) if args.greedy_n else {}
    import transformers

    info = {
        "params": params, "vocab": len(tok), "layers": args.layers, "hidden": args.hidden,
        "size_mb": (out / "model.safetensors").stat().st_size / 1e6,
        "seed": args.seed, "minutes": args.minutes, "steps_arg": args.steps, "steps": step,
        "tokens": tokens, "answer_tokens": ans_tokens, "budget": args.budget, "peak_lr": args.peak_lr,
        "hold": args.hold, "curriculum": args.curriculum, "format_weight": args.format_weight, "bf16": args.bf16, "level_weights": level_weights, "trace": kw, "init": args.init,
        "threads": args.threads, "train_seconds": train_seconds,
        "final_loss": sum(losses[-50:]) / max(1, len(losses[-50:])),
        "greedy_n": args.greedy_n, "greedy_eval": {str(k): v for k, v in acc.items()},
        "torch": torch.__version__, "transformers": transformers.__version__, "loss_log": log,
    }
    info["out"] = args.out
    info["total_seconds"] = time.monotonic() - t0
    write_card_section(out / "README.md", info)
    (out / "train_eval.json").write_text(json.dumps(info, indent=2) + "\n")
    print(f"saved to {out} in {info['total_seconds']/60:.1f} min total", flush=True)


if __name__ == "__main__":
    main()
