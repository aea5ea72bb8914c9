#!/usr/bin/env python
"""Train the demo model: a ~1M-parameter Llama that solves graded +/- chains with worked steps.

Plain torch + transformers on CPU (run it with the vLLM venv: ``.venv-vllm/bin/python``)::

    OMP_NUM_THREADS=2 nice -n 10 .venv-vllm/bin/python scripts/train_demo_model.py \
        --out models/arith-llama --minutes 28 --seed 0

Smoke test (seconds): ``--minutes 0.3 --out /tmp/x``.

What it does
* builds a character-level tokenizer offline (one token per character, so every digit is its own
  token; specials ``<pad> <s> </s> <unk>``), with a chat template that renders exactly the
  training sequence ``<s>{question}\\nA:\\n{worked}</s>`` (see ``ttc_tools/demo/problems.py``);
* trains a LlamaConfig model (hidden 128, 4 layers, 4 heads of size 32, FFN 512, tied embeddings)
  on problems streamed from ``ttc_tools.demo.problems.generate`` -- batches of a single level filled to a
  fixed token budget (5000), loss only on the answer tokens (worked steps + eos), AdamW, learning
  rate warmed up to 2e-3, held until 60% of the budget, then a cosine down to a twentieth of it;
* saves model, generation config (eos = ``</s>``) and tokenizer to ``--out``, runs a quick greedy
  eval per level and writes ``train_eval.json`` and a model card ``README.md``.

Determinism: initialisation and the data stream are fixed by ``--seed``; with ``--steps N`` the run
(schedule included) is exactly reproducible on the same machine/thread count.  With ``--minutes``
(the default, 28) the learning-rate schedule follows wall-clock progress so the whole run, eval and
save included, fits the budget; the same data is seen in the same order, but where it stops
depends on the machine's speed (the step count reached is recorded in the model card).
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
# Under CPU contention, spinning OpenMP workers stall each other (measured: 2 threads with the
# default spin policy ran 5-25x slower than 1 thread while other jobs held a core); passive waiting
# keeps 2 threads at least as fast as 1.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors  # noqa: E402
from transformers import (  # noqa: E402
    GenerationConfig,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedTokenizerFast,
)

from ttc_tools.demo.problems import (  # noqa: E402
    BOS,
    EOS,
    LEVELS,
    SEPARATOR,
    extract_answer,
    generate,
    make_set,
    worked_paths,
)

PAD, UNK = "<pad>", "<unk>"
SPECIALS = [PAD, BOS, EOS, UNK]
CHARS = ["\n"] + [chr(c) for c in range(32, 127)]
MAX_LEN = 256
EVAL_SEED = 1234  # eval problems (make_set(..., seed=EVAL_SEED)) are excluded from training
EVAL_N = 100  # per level, the size the eval script uses; excluded from training

# The chat template renders ``<s>`` + user content; an assistant turn is SEPARATOR + content + ``</s>``;
# the generation prompt is SEPARATOR. System messages are ignored.
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{% if message['role'] == 'user' %}{{ message['content'] }}"
    "{% elif message['role'] == 'assistant' %}{{ '" + SEPARATOR.replace("\n", "\\n") + "' }}"
    "{{ message['content'] }}{{ eos_token }}"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '" + SEPARATOR.replace("\n", "\\n") + "' }}{% endif %}"
)

# level -> relative share of batches (harder levels slightly favoured)
LEVEL_WEIGHTS = {1: 0.5, 2: 0.9, 3: 1.1, 4: 1.2, 5: 1.3}


def build_tokenizer() -> PreTrainedTokenizerFast:
    vocab = {tok: i for i, tok in enumerate(SPECIALS + CHARS)}
    tk = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    tk.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tk.decoder = decoders.Fuse()
    tk.add_special_tokens(SPECIALS)
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
    """Fast char -> id encoding for training (same ids as the tokenizer)."""

    def __init__(self, tok: PreTrainedTokenizerFast) -> None:
        self.map = {c: tok.convert_tokens_to_ids(c) for c in CHARS}
        self.bos, self.eos, self.pad = tok.bos_token_id, tok.eos_token_id, tok.pad_token_id

    def encode(self, s: str) -> list[int]:
        return [self.map[c] for c in s]

    def example(self, question: str, worked: str) -> tuple[list[int], int]:
        prefix = [self.bos, *self.encode(question + SEPARATOR)]
        return prefix + self.encode(worked) + [self.eos], len(prefix)


def make_batch(enc: Encoder, rng: random.Random, level: int, budget: int, exclude: set[str]):
    seqs: list[tuple[list[int], int]] = []
    longest = 0
    while True:
        p = generate(level, rng)
        if p.question in exclude:
            continue
        ids, plen = enc.example(p.question, rng.choice(worked_paths(p)))
        new_longest = max(longest, len(ids))
        if seqs and new_longest * (len(seqs) + 1) > budget:
            break
        seqs.append((ids, plen))
        longest = new_longest
    x = torch.full((len(seqs), longest), enc.pad, dtype=torch.long)
    y = torch.full((len(seqs), longest), -100, dtype=torch.long)
    for i, (ids, plen) in enumerate(seqs):
        t = torch.tensor(ids)
        x[i, : len(ids)] = t
        y[i, plen : len(ids)] = t[plen:]  # loss only on answer tokens (HF shifts labels)
    return x, y, int((y != -100).sum())


def lr_at(p: float, peak: float, warmup: float = 0.02, hold: float = 0.6) -> float:
    """Warmup-hold-decay over progress p in [0, 1]: linear warmup to ``peak``, constant until ``hold``,
    then a cosine down to peak/20 at the end."""
    if p < warmup:
        return peak * p / warmup
    if p < hold:
        return peak
    q = min(1.0, (p - hold) / (1 - hold))
    return peak / 20 + (peak - peak / 20) * 0.5 * (1 + math.cos(math.pi * q))


@torch.no_grad()
def greedy_eval(model, tok, n_per_level: int, seed: int) -> dict[int, float]:
    model.eval()
    res: dict[int, float] = {}
    for level in sorted(LEVELS):
        probs = make_set(n_per_level, [level], seed=seed)
        prompts = [tok.apply_chat_template([{"role": "user", "content": p.question}],
                                           tokenize=False, add_generation_prompt=True) for p in probs]
        batch = tok(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
        out = model.generate(**batch, max_new_tokens=MAX_LEN - batch["input_ids"].shape[1],
                             do_sample=False, eos_token_id=tok.eos_token_id,
                             pad_token_id=tok.pad_token_id)
        texts = tok.batch_decode(out[:, batch["input_ids"].shape[1]:], skip_special_tokens=True)
        res[level] = sum(extract_answer(t) == p.gold for t, p in zip(texts, probs, strict=False)) / len(probs)
    model.train()
    return res


def write_card(out: Path, info: dict) -> None:
    levels = "\n".join(
        f"| {lv} | {n} | {a[0]}-{a[1]} | {o[0]}-{o[1]} | {info['greedy_eval'].get(str(lv), float('nan')):.2f} |"
        for lv, (n, a, o) in sorted(LEVELS.items())
    )
    card = f"""# arith-llama: a tiny char-level Llama for graded multi-step arithmetic

A {info['params']/1e6:.2f}M-parameter Llama (hidden 128, 4 layers, 4 heads of size 32, FFN 512,
tied embeddings, fp32, {info['size_mb']:.1f} MB) trained from scratch on CPU for the
test-time-compute service's demo. Single samples are often wrong on the harder levels, and sampled
at temperature 0.7-1.0 the wrong answers differ, so majority voting over samples helps.

## Task

Chains of `+`/`-` on non-negative integers, asked in symbols ("What is 37 + 85 - 19?",
"Compute 37 + 85 - 19.") or in words ("Start with 37, add 85, then subtract 19. What is the
result?"). The answer is one worked line per operation and a fixed final line, then the end token:

```
37 + 85 = 122
122 - 19 = 103
The answer is 103.
```

Multi-step problems are taught two solution paths, picked at random per training example: left to
right (above), or grouped -- the added numbers first, the subtracted ones summed, one subtraction
(`37 + 85 = 122`, `122 - 19 = 103` stays; `408 - 86 - 22` becomes `86 + 22 = 108`, `408 - 108 = 300`).
Sampled answers take either route, so their mistakes differ and a majority vote over samples beats
one sample (`worked_paths` in the generator).

Generator with gold answers: `ttc_tools/demo/problems.py` (`generate(level, rng)`, `make_set(n, levels,
seed)`, `worked_paths(problem)`, `extract_answer(text)`), pure stdlib. Each step aims for a
carry/borrow with probability 1/2; intermediate results never go negative.

| level | operations | first operand digits | other operand digits | greedy accuracy (train-time check, {info['greedy_n']}/level) |
|---|---|---|---|---|
{levels}

## Prompt formats

* **Chat** (`/v1/chat/completions`): one user message whose content is the question. The chat
  template renders `<s>{{question}}\\nA:\\n` for that message plus the generation prompt --
  exactly the training prefix. The reply is the worked steps ending in `The answer is N.`; the
  model then emits `</s>`, which is `eos_token_id` in `config.json` and `generation_config.json`.
* **Raw completion** (`/v1/completions`): prompt = `question + "\\nA:\\n"`; the tokenizer adds
  `<s>` itself (`add_special_tokens=True`, vLLM's default for completions).

Tokenizer: one token per character ({info['vocab']} tokens: `<pad> <s> </s> <unk>`, newline and
printable ASCII), `tokenizer.json` built offline with `tokenizers`; loads with
`AutoTokenizer.from_pretrained`.

## Training

`scripts/train_demo_model.py --out models/arith-llama --minutes {info['minutes']} --seed {info['seed']}`
(`make demo-model`), plain torch {info['torch']} / transformers {info['transformers']} on CPU,
{info['threads']} threads. Problems streamed from the generator (eval problems, seed {EVAL_SEED},
excluded); batches of one level filled to {info['budget']} tokens; loss only on answer tokens;
AdamW (wd 0.01, clip 1.0); learning rate over wall-clock progress: 2% linear warmup to
{info['peak_lr']:g}, held until 60%, then a cosine down to a twentieth of it. Level shares: {LEVEL_WEIGHTS}.

* steps: {info['steps']}, answer tokens seen: {info['answer_tokens']:,}, tokens seen: {info['tokens']:,}
* training time: {info['train_seconds']/60:.1f} min (whole script {info['total_seconds']/60:.1f} min)
* final loss (answer tokens, mean of last 50 steps): {info['final_loss']:.4f}

Initialisation and data order are fixed by the seed; `--steps N` makes a run exactly reproducible,
while `--minutes` stops wherever the machine's speed allows within the budget.

## Evaluation (sampled)

<!-- EVAL:START -->
Not evaluated yet: run `scripts/eval_demo_model.py`.
<!-- EVAL:END -->
"""
    (out / "README.md").write_text(card)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="models/arith-llama")
    ap.add_argument("--minutes", type=float, default=28.0, help="wall-clock budget for the whole script")
    ap.add_argument("--steps", type=int, default=0, help="fixed step count (exactly reproducible); overrides --minutes for the schedule")
    ap.add_argument("--seed", type=int, default=0)
    # ~5000 tokens per batch runs at ~13k tokens/s on two idle cores (2000: ~11k). The run needs the
    # machine to itself: under contention (~4k tokens/s) 28 minutes are not enough to learn the carries.
    ap.add_argument("--budget", type=int, default=5000, help="tokens per batch (incl. padding)")
    ap.add_argument("--peak-lr", type=float, default=2e-3)
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
    enc = Encoder(tok)
    cfg = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=128,
        intermediate_size=512,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=4,
        head_dim=32,
        max_position_embeddings=MAX_LEN,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        tie_word_embeddings=True,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        initializer_range=0.02,
    )
    if args.init:
        # continue training an earlier checkpoint (fresh optimizer, new data stream)
        model = LlamaForCausalLM.from_pretrained(args.init, dtype=torch.float32)
    else:
        model = LlamaForCausalLM(cfg)
    model.train()
    params = sum(p.numel() for p in model.parameters())
    print(f"params={params:,} vocab={len(tok)} threads={args.threads}", flush=True)

    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=1e-4, betas=(0.9, 0.98), eps=1e-8)

    exclude = {p.question for p in make_set(EVAL_N, seed=EVAL_SEED)}
    data_rng = random.Random(f"train-{args.seed}" + (f"-resume-{args.init}" if args.init else ""))
    levels = sorted(LEVEL_WEIGHTS)
    weights = [LEVEL_WEIGHTS[lv] for lv in levels]

    total = args.minutes * 60
    reserve = min(75.0, 0.12 * total)  # save + greedy eval + card
    train_end = t0 + total - reserve
    t_train = time.monotonic()
    span = max(1e-6, train_end - t_train)

    step = tokens = ans_tokens = 0
    losses: list[float] = []
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
        lr = lr_at(p, args.peak_lr)
        for g in opt.param_groups:
            g["lr"] = lr
        level = data_rng.choices(levels, weights)[0]
        x, y, n_ans = make_batch(enc, data_rng, level, args.budget, exclude)
        loss = model(input_ids=x, labels=y).loss
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
            print(f"step {step} t={el/60:.1f}m p={p:.3f} lr={lr:.2e} lvl={level} "
                  f"loss={sum(losses[-50:])/len(losses[-50:]):.4f} tok/s={tokens/max(el,1e-6):.0f}",
                  flush=True)
            last_print = time.monotonic()
    train_seconds = time.monotonic() - t_train
    print(f"training done: {step} steps, {tokens:,} tokens in {train_seconds/60:.1f} min", flush=True)

    model.generation_config = GenerationConfig(
        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
        do_sample=True, temperature=0.8, top_p=1.0, max_new_tokens=200,
    )
    model.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)

    greedy_n = 30 if total >= 300 else 5
    acc = greedy_eval(model, tok, greedy_n, seed=EVAL_SEED)
    print("greedy accuracy by level:", {k: round(v, 3) for k, v in acc.items()}, flush=True)
    import transformers

    info = {
        "params": params,
        "vocab": len(tok),
        "size_mb": (out / "model.safetensors").stat().st_size / 1e6,
        "seed": args.seed,
        "minutes": args.minutes,
        "steps_arg": args.steps,
        "steps": step,
        "tokens": tokens,
        "answer_tokens": ans_tokens,
        "budget": args.budget,
        "peak_lr": args.peak_lr,
        "init": args.init,
        "threads": args.threads,
        "train_seconds": train_seconds,
        "final_loss": sum(losses[-50:]) / max(1, len(losses[-50:])),
        "greedy_n": greedy_n,
        "greedy_eval": {str(k): v for k, v in acc.items()},
        "torch": torch.__version__,
        "transformers": transformers.__version__,
    }
    info["total_seconds"] = time.monotonic() - t0
    write_card(out, info)
    info["total_seconds"] = time.monotonic() - t0
    (out / "train_eval.json").write_text(json.dumps(info, indent=2) + "\n")
    print(f"saved to {out} in {info['total_seconds']/60:.1f} min total", flush=True)


if __name__ == "__main__":
    main()
