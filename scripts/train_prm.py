#!/usr/bin/env python
"""Train arith-prm: a tiny process reward model (Qwen2ForProcessRewardModel) for the demo arithmetic task.

Plain torch + transformers on CPU (the vLLM venv)::

    OMP_NUM_THREADS=2 .venv-vllm/bin/python scripts/train_prm.py --out models/arith-prm \
        --samples .cache/demo-prm/train.jsonl --minutes 25 --seed 0

Smoke test (seconds): ``--minutes 0.3 --out /tmp/x``.

Model (what vLLM's ``Qwen2ForProcessRewardModel`` loads, the architecture of Qwen2.5-Math-PRM): a Qwen2
decoder (hidden 128, 4 layers, 4 heads of size 32, FFN 512, RMSNorm eps 1e-5, no tied LM head) and the
PRM head ``score = Sequential(Linear(128, 128), ReLU, Linear(128, 2))`` applied to every token; the
checkpoint's tensors are ``model.*`` and ``score.0.*``/``score.2.*``. P(step correct) is
``softmax(score(h))[1]`` at each step tag ``<extra_0>``, the way Qwen2.5-Math-PRM is read.

Tokenizer: the generator's (``models/arith-llama``: one token per character, ids 0-99) plus the special
token ``<extra_0>`` (id 100). Input: ``<s>`` question ``\\nA:\\n`` then each step followed by ``<extra_0>``
(:func:`ttc_tools.demo.steps.prm_text`); the chat template renders the same for ``[user(question),
assistant(tagged steps)]`` (plus ``</s>``, which no tag sees).

Initialisation (``--init arith-llama``, the default): the decoder starts from the generator's weights
(Llama and Qwen2 share every tensor name and shape; Qwen2's q/k/v biases start at zero, the new
``<extra_0>`` embedding at the mean embedding), like a PRM fine-tuned from its policy model. ``--init
scratch`` starts from random weights.

Data, streamed (nothing of the evaluation set ``make_set(100, seed=1234)`` is used):

* synthetic: a problem from the generator, either a taught path (all steps right) or a :func:`corrupt`
  -ion of one (wrong result propagated or not, wrong operand, a line not continuing from the previous
  result, wrong operation, skipped or repeated line, wrong final answer);
* the generator's own samples (``--samples``, from ``scripts/sample_demo_solutions.py --set train``).

Labels are :func:`ttc_tools.demo.steps.label_steps` (first-error). Loss: cross-entropy of the 2-way head
at the step tags, plus ``--dense-weight`` times the same head's cross-entropy at the characters of the
steps against :func:`ttc_tools.demo.steps.char_labels` (can the solution so far still be completed into a
right one?) up to the first character where it goes wrong, that one weighted ``--first-wrong-weight`` --
dense targets that teach the decoder to notice where a step goes wrong, which the tag then reads, plus ``--lm-weight`` times the next-token loss on the tokens of right steps (keeps the
arithmetic the decoder knows; its LM head is the input embedding and is not saved). Only the tag outputs
are what vLLM returns. Batches of one level filled to ``--batch-tokens``; AdamW (wd 0.01, clip 1.0); learning rate over
wall-clock progress: 3% linear warmup, cosine down to a twentieth.

Writes ``config.json``, ``model.safetensors``, the tokenizer files (``tokenizer.json``,
``tokenizer_config.json``, ``chat_template.jinja``) and ``train_info.json`` to ``--out``.
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
sys.path.insert(0, str(ROOT / "scripts"))
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # see train_demo_model.py

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402
from torch import nn  # noqa: E402
from transformers import Qwen2Config, Qwen2Model  # noqa: E402

from ttc_tools.demo.problems import BOS, LEVELS, SEPARATOR, Problem, generate, make_set, worked_paths  # noqa: E402
from ttc_tools.demo.steps import (  # noqa: E402
    STEP_TAG,
    char_labels,
    corrupt,
    label_steps,
    prm_messages,
    prm_text,
    split_steps,
)

EVAL_SEED, EVAL_N = 1234, 100
MAX_LEN = 256
LEVEL_WEIGHTS = {1: 0.5, 2: 0.8, 3: 1.0, 4: 1.2, 5: 1.3}
ARCH = "Qwen2ForProcessRewardModel"


# ------------------------------------------------------------------------------------------ model
def prm_config(vocab_size: int, layers: int = 4, hidden: int = 128, heads: int = 4, ffn: int = 512) -> Qwen2Config:
    """The Qwen2 config vLLM reads (``architectures = [Qwen2ForProcessRewardModel]``, 2 labels)."""
    cfg = Qwen2Config(
        vocab_size=vocab_size, hidden_size=hidden, intermediate_size=ffn, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=heads, head_dim=hidden // heads,
        max_position_embeddings=MAX_LEN, rms_norm_eps=1e-5, tie_word_embeddings=False,
        bos_token_id=1, eos_token_id=2, pad_token_id=0, use_cache=False,
        id2label={0: "wrong", 1: "right"}, label2id={"wrong": 0, "right": 1},
    )
    cfg.architectures = [ARCH]
    return cfg


class PRM(nn.Module):
    """Qwen2 decoder + the Qwen2.5-Math-PRM head; ``state_dict`` keys are exactly the checkpoint's."""

    def __init__(self, cfg: Qwen2Config) -> None:
        super().__init__()
        self.config = cfg
        self.model = Qwen2Model(cfg)
        h = cfg.hidden_size
        self.score = nn.Sequential(nn.Linear(h, h), nn.ReLU(), nn.Linear(h, 2))

    def hidden(self, ids: torch.Tensor) -> torch.Tensor:
        """Last hidden states ``[batch, seq, hidden]`` of right-padded ``ids`` (causal: padding after a
        sequence never changes its states, so no attention mask is needed)."""
        return self.model(input_ids=ids).last_hidden_state

    def step_probs(self, ids: torch.Tensor, tag_id: int) -> list[list[float]]:
        """Per sequence of ``ids`` (right-padded), P(right) at each ``tag_id`` position, in order."""
        h = self.hidden(ids)
        p = torch.softmax(self.score(h), -1)[..., 1]
        return [p[i][ids[i] == tag_id].tolist() for i in range(ids.shape[0])]


def load_prm(path: Path) -> PRM:
    """The PRM saved at ``path`` (config.json + model.safetensors), in eval mode."""
    cfg = Qwen2Config.from_pretrained(path)
    m = PRM(cfg)
    missing, unexpected = m.load_state_dict(load_file(str(path / "model.safetensors")), strict=False)
    if missing or unexpected:
        raise ValueError(f"checkpoint mismatch: missing {missing}, unexpected {unexpected}")
    return m.eval()


def init_from_generator(m: PRM, gen_dir: Path, tag_like: int) -> list[str]:
    """Copy the generator's decoder into ``m``'s first layers; returns the names copied.

    The new tag embedding starts as a copy of token ``tag_like`` (the newline the tag replaces, so the
    copied layers read a tagged solution like the text they were trained on). Layers above the generator's
    (``m`` may be deeper) start as identities on the residual stream: their output projections
    (``o_proj``, ``down_proj``) are zero, so the initial final hidden states are the generator's.
    """
    src = load_file(str(gen_dir / "model.safetensors"))
    own = m.state_dict()
    copied = []
    with torch.no_grad():
        for k, v in src.items():
            if k not in own:
                continue  # lm_head (tied in the generator)
            if k == "model.embed_tokens.weight":
                own[k][: v.shape[0]] = v
                own[k][v.shape[0]:] = v[tag_like]
            elif own[k].shape == v.shape:
                own[k].copy_(v)
            else:
                raise ValueError(f"{k}: {tuple(v.shape)} vs {tuple(own[k].shape)}")
            copied.append(k)
        n_gen = 1 + max(int(k.split(".")[2]) for k in src if k.startswith("model.layers."))
        for i in range(n_gen, m.config.num_hidden_layers):
            own[f"model.layers.{i}.self_attn.o_proj.weight"].zero_()
            own[f"model.layers.{i}.mlp.down_proj.weight"].zero_()
    return copied


# ------------------------------------------------------------------------------------------- data
class Encoder:
    """Characters -> token ids, the generator's (``<s>`` = 1, one id per character) plus the step tag (100).
    The saved tokenizer gives the same ids (checked by :func:`check_tokenizer`)."""

    def __init__(self, generator: Path) -> None:
        vocab = json.loads((generator / "tokenizer.json").read_text())["model"]["vocab"]
        self.map = {t: i for t, i in vocab.items() if len(t) == 1}
        self.bos, self.unk = vocab[BOS], vocab["<unk>"]
        self.tag = len(vocab)  # the next id
        self.vocab = {**vocab, STEP_TAG: self.tag}

    def encode(self, s: str) -> list[int]:
        return [self.map.get(c, self.unk) for c in s]

    def example(self, question: str, steps: list[str], labels: list[bool],
                chars: list[list[bool]] | None = None) -> tuple[list[int], list[int], list[int], list[int]]:
        """``(ids, tags, dense, lm)``, all -100 where unused: ``tags[t]`` is 1/0 at a step tag (right/wrong
        step); ``dense[t]`` is 1/0 at a step's characters (:func:`char_labels`: still completable into a
        right solution) when ``chars`` is given, up to and including the first 0 (the character where the
        solution goes wrong; later characters are trivially 0 and left out); ``lm[t]`` is the token at ``t``
        when it belongs to a right step (auxiliary next-token target)."""
        ids = [self.bos, *self.encode(question + SEPARATOR)]
        tags = [-100] * len(ids)
        dense = [-100] * len(ids)
        lm = [-100] * len(ids)
        wrong_seen = chars is None
        for k, (step, ok) in enumerate(zip(steps, labels, strict=True)):
            e = self.encode(step)
            ids += [*e, self.tag]
            lm += ([*e] if ok else [-100] * len(e)) + [-100]
            tags += [-100] * len(e) + [int(ok)]
            row = [-100] * len(e)
            if not wrong_seen and chars is not None:
                for j, x in enumerate(chars[k]):
                    row[j] = int(x)
                    if not x:
                        wrong_seen = True
                        break
            dense += [*row, -100]
        return ids, tags, dense, lm


def _byte_char(c: str) -> str:
    """GPT-2 byte-level alphabet: printable ASCII maps to itself, space and newline to ``Ġ`` / ``Ċ``."""
    b = ord(c)
    return c if 33 <= b <= 126 else chr(256 + b) if b < 33 else chr(256 + 33 + b - 127)


def build_tokenizer(enc: Encoder, generator: Path):
    """The PRM's tokenizer: the generator's one-token-per-character vocabulary (same ids) written in the
    byte-level alphabet, plus ``<extra_0>``.

    Why byte-level: transformers 5 (``AutoTokenizer``, which vLLM uses) always builds ``Qwen2Tokenizer`` for
    ``model_type: qwen2`` whatever ``tokenizer_class`` says, and that class rebuilds the tokenizer as a
    byte-level BPE from the vocabulary -- a plain " " or "\n" entry is then never matched and spaces and
    newlines silently vanish. With ``Ġ``/``Ċ`` entries and no merges, every character is still one token.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    specials = [t for t, i in sorted(enc.vocab.items(), key=lambda kv: kv[1]) if len(t) > 1]
    vocab = {(_byte_char(t) if len(t) == 1 else t): i for t, i in enc.vocab.items()}
    tk = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tk.decoder = decoders.ByteLevel()
    tk.add_special_tokens(specials)
    tk.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A $B", special_tokens=[(BOS, enc.bos)])
    tok = PreTrainedTokenizerFast(
        tokenizer_object=tk, bos_token=BOS, eos_token="</s>", pad_token="<pad>", unk_token="<unk>",
        additional_special_tokens=[STEP_TAG], model_max_length=MAX_LEN, clean_up_tokenization_spaces=False)
    tok.chat_template = (generator / "chat_template.jinja").read_text()
    return tok


def check_tokenizer(out: Path, enc: Encoder) -> None:
    """Load the saved tokenizer the way vLLM does (``AutoTokenizer``) and check it gives the training ids
    for raw text and for the chat template; raises ``AssertionError`` otherwise."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(out)
    steps = ["37 + 85 = 122", "122 - 19 = 103", "The answer is 103."]
    ids = enc.example("What is 37 + 85 - 19?", steps, [True] * 3)[0]
    text = prm_text("What is 37 + 85 - 19?", steps)
    got = tok(text)["input_ids"]
    assert got == ids, (type(tok).__name__, got, ids)
    chat = tok.apply_chat_template(prm_messages("What is 37 + 85 - 19?", steps), tokenize=False)
    assert tok(chat, add_special_tokens=False)["input_ids"] == [*ids, tok.eos_token_id], chat
    assert tok.decode(ids, skip_special_tokens=True) == text.replace(STEP_TAG, ""), tok.decode(ids)


class Stream:
    """Training examples: synthetic (taught path or corruption) or the generator's own samples."""

    def __init__(self, enc: Encoder, rng: random.Random, own: dict[int, list[Own]],
                 own_share: float, p_right: float, exclude: set[str]) -> None:
        self.enc, self.rng, self.own, self.own_share, self.p_right = enc, rng, own, own_share, p_right
        self.exclude = exclude

    def one(self, level: int) -> tuple[list[int], list[int], list[int], list[int]]:
        rng = self.rng
        if self.own.get(level) and rng.random() < self.own_share:
            return self.enc.example(*rng.choice(self.own[level]))
        p = generate(level, rng)
        while p.question in self.exclude:
            p = generate(level, rng)
        if rng.random() < self.p_right:
            steps = split_steps(rng.choice(worked_paths(p)))
            return self.enc.example(p.question, steps, [True] * len(steps), [[True] * len(s) for s in steps])
        c = corrupt(p, rng)
        return self.enc.example(p.question, c.steps, c.labels, char_labels(p, c.steps))

    def batch(self, level: int, budget: int) -> tuple[torch.Tensor, ...]:
        """``(ids, tags, dense, lm, n_tokens)`` of one level's examples filled to ``budget`` padded tokens."""
        seqs: list[tuple[list[int], list[int], list[int], list[int]]] = []
        longest = 0
        while True:
            ex = self.one(level)
            if len(ex[0]) > MAX_LEN:
                continue
            new_longest = max(longest, len(ex[0]))
            if seqs and new_longest * (len(seqs) + 1) > budget:
                break
            seqs.append(ex)
            longest = new_longest
        x = torch.zeros((len(seqs), longest), dtype=torch.long)
        out = [torch.full((len(seqs), longest), -100, dtype=torch.long) for _ in range(3)]
        for i, seq in enumerate(seqs):
            x[i, : len(seq[0])] = torch.tensor(seq[0])
            for t, col in zip(out, seq[1:], strict=True):
                t[i, : len(col)] = torch.tensor(col)
        return x, *out, torch.tensor(sum(len(s[0]) for s in seqs))


Own = tuple[str, list[str], list[bool], list[list[bool]]]  # question, steps, step labels, char labels


def load_own(path: Path | None, exclude: set[str]) -> dict[int, list[Own]]:
    """The generator's labelled samples by level (records of sample_demo_solutions.py), eval questions out."""
    own: dict[int, list[Own]] = {}
    if path is None:
        return own
    from sample_demo_solutions import problem_from_json, read_records

    for r in read_records(path):
        p = problem_from_json(r)
        if p.question in exclude:
            continue
        for text in r["samples"]:
            steps = split_steps(text)
            if steps:
                own.setdefault(p.level, []).append((p.question, steps, label_steps(p, steps), char_labels(p, steps)))
    return own


class Distiller:
    """Surprise distillation (training only; nothing of it is saved).

    The generator's log-probability of the character actually written next, ``s[t] = log P_gen(x[t] |
    x[<t])``, is an almost perfect step checker by itself (its running minimum over a solution: step ROC AUC
    1.00 on one-step and 0.997 on three-step problems against wrong results, wrongly copied numbers and wrong
    answers), but a decoder sees it one position apart from the character it judges. This auxiliary loss asks
    the PRM to compute it at ``t``: a linear head on the final hidden state regresses ``max(s[t], -8)`` (MSE)
    at every position of the solution; ``s`` comes from a frozen copy of the generator run on the same text
    (the step tag read as the newline it replaces).
    """

    def __init__(self, generator: Path, hidden: int, enc: Encoder) -> None:
        from transformers import AutoModelForCausalLM

        self.teacher = AutoModelForCausalLM.from_pretrained(generator, dtype=torch.float32).eval()
        for prm in self.teacher.parameters():
            prm.requires_grad_(False)
        self.tag, self.newline = enc.tag, enc.map["\n"]
        self.head = nn.Linear(hidden, 1)

    def loss(self, x: torch.Tensor, h: torch.Tensor, labelled: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            xt = x.clone()
            xt[xt == self.tag] = self.newline
            lp = torch.log_softmax(self.teacher(input_ids=xt).logits, -1)
            target = lp[:, :-1].gather(-1, xt[:, 1:].unsqueeze(-1)).squeeze(-1).clamp(min=-8.0)
            mask = (labelled.cumsum(1) > 0)[:, 1:] & (x[:, 1:] != 0)
        pred = self.head(h[:, 1:][mask]).squeeze(-1)
        return F.mse_loss(pred, target[mask])


# ------------------------------------------------------------------------------------------- eval
@torch.no_grad()
def quick_eval(m: PRM, enc: Encoder, problems: list[Problem], seed: int) -> dict[str, float]:
    """On one right path + two corruptions per held-out problem: step accuracy (threshold 0.5), step AUC, the
    share of corrupted solutions whose lowest-scored step is the first wrong one (``located``) and the AUC
    of the last step's score against the solution being right (``final_auc``): the search issue's targets."""
    m.eval()
    rng = random.Random(seed)
    exs: list[tuple[list[int], list[bool]]] = []
    for p in problems:
        steps = split_steps(rng.choice(worked_paths(p)))
        exs.append((enc.example(p.question, steps, [True] * len(steps))[0], [True] * len(steps)))
        for _ in range(2):
            c = corrupt(p, rng)
            exs.append((enc.example(p.question, c.steps, c.labels)[0], c.labels))
    from eval_prm import auc, issue_targets

    scores: list[float] = []
    labels: list[bool] = []
    solutions: list[tuple[list[float], list[bool], bool]] = []
    for s in range(0, len(exs), 64):
        chunk = exs[s:s + 64]
        x = torch.zeros((len(chunk), max(len(e[0]) for e in chunk)), dtype=torch.long)
        for i, (ids, _) in enumerate(chunk):
            x[i, : len(ids)] = torch.tensor(ids)
        for probs, (_, lab) in zip(m.step_probs(x, enc.tag), chunk, strict=True):
            scores += probs
            labels += lab
            solutions.append((probs, lab, all(lab)))
    m.train()
    acc = sum((s >= 0.5) == y for s, y in zip(scores, labels, strict=True)) / len(labels)
    targets = issue_targets(solutions)
    return {"step_acc": acc, "step_auc": auc(scores, labels), "steps": len(labels),
            "located": targets["argmin_located"], "final_auc": targets["final_auc"]}


# ------------------------------------------------------------------------------------------- main
def lr_at(p: float, peak: float, warmup: float = 0.03) -> float:
    """Linear warmup to ``peak`` over ``warmup`` of the progress ``p`` in [0, 1], then a cosine to peak/20."""
    if p < warmup:
        return peak * p / warmup
    q = min(1.0, (p - warmup) / (1 - warmup))
    return peak / 20 + (peak - peak / 20) * 0.5 * (1 + math.cos(math.pi * q))


def save(m: PRM, tok, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    m.config.save_pretrained(out)
    sd = {k: v.detach().contiguous() for k, v in m.state_dict().items()}
    save_file(sd, str(out / "model.safetensors"), metadata={"format": "pt"})
    tok.save_pretrained(out)
    (out / "tokenizer_config.json").write_text(  # drop what save_pretrained records of the local load
        json.dumps({k: v for k, v in json.loads((out / "tokenizer_config.json").read_text()).items()
                    if k not in ("is_local", "local_files_only")}, indent=2) + "\n")


def train_summary(info: dict) -> str:
    """The model card's training paragraph (between its ``TRAIN`` markers)."""
    a = info["args"]
    h = info["heldout_synthetic_torch"]
    return (
        f"Measured run: `scripts/train_prm.py --layers {a['layers']} --minutes {a['minutes']} --seed {a['seed']}` "
        f"(init {info['init']}, lr {a['lr']}, dense weight {a['dense_weight']}, distill weight {a['distill_weight']}, "
        f"LM weight {a['lm_weight']}, own-sample share {a['own_share']}), torch {info['torch']} on "
        f"{info['threads']} threads: {info['steps']} steps, {info['tokens']:,} tokens in {info['train_minutes']} min "
        f"(whole script {info['script_minutes']} min); {info['params']:,} parameters ({info['size_bytes'] / 1e6:.1f} MB); "
        f"final tag loss {info['final_cls_loss']:.3f}; held-out synthetic steps in torch: accuracy {h['step_acc']:.3f}, "
        f"ROC AUC {h['step_auc']:.3f}. Own samples used: {sum(info['own_samples'].values()):,}."
    )


def update_card(path: Path, name: str, text: str) -> None:
    """Replace the text between ``<!-- NAME:START -->`` and ``<!-- NAME:END -->`` in the card at ``path``
    (appended, markers included, when the card or the markers are missing)."""
    card = path.read_text() if path.exists() else "# arith-prm\n"
    start, end = card.find(f"<!-- {name}:START -->"), card.find(f"<!-- {name}:END -->")
    section = f"<!-- {name}:START -->\n{text}\n<!-- {name}:END -->"
    if start >= 0 and end >= 0:
        card = card[:start] + section + card[end + len(f"<!-- {name}:END -->"):]
    else:
        card += "\n" + section + "\n"
    path.write_text(card)


def _rel(value: object) -> str:
    """An argument as recorded in train_info.json: a path under the repository relative to it (no machine paths)."""
    if isinstance(value, Path) and value.resolve().is_relative_to(ROOT):
        return str(value.resolve().relative_to(ROOT))
    return str(value)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=ROOT / "models" / "arith-prm")
    ap.add_argument("--generator", type=Path, default=ROOT / "models" / "arith-llama")
    ap.add_argument("--samples", type=Path, default=None, help="the generator's labelled samples (JSONL)")
    ap.add_argument("--init", choices=["arith-llama", "scratch"], default="arith-llama")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--minutes", type=float, default=25.0, help="wall-clock training budget")
    ap.add_argument("--steps", type=int, default=0, help="exact number of steps instead of --minutes")
    ap.add_argument("--lr", type=float, default=1.5e-3)
    ap.add_argument("--distill-weight", type=float, default=1.0,
                    help="weight of the surprise-distillation loss (see Distiller)")
    ap.add_argument("--freeze-generator", action="store_true",
                    help="train only the layers above the generator's (and the final norm and head)")
    ap.add_argument("--lm-weight", type=float, default=0.3)
    ap.add_argument("--dense-weight", type=float, default=1.0, help="weight of the per-character loss")
    ap.add_argument("--first-wrong-weight", type=float, default=10.0,
                    help="class weight of the (rare) first wrong character in the per-character loss")
    ap.add_argument("--own-share", type=float, default=0.35, help="share of examples from --samples")
    ap.add_argument("--p-right", type=float, default=0.35, help="share of right paths among synthetic ones")
    ap.add_argument("--batch-tokens", type=int, default=5000)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    t_start = time.monotonic()
    torch.manual_seed(args.seed)
    rng = random.Random(args.seed)
    enc = Encoder(args.generator)
    tok = build_tokenizer(enc, args.generator)

    if args.init == "arith-llama" and args.layers < 4:
        raise SystemExit("--init arith-llama needs --layers >= 4 (the generator has 4)")
    m = PRM(prm_config(len(enc.vocab), layers=args.layers))
    copied = init_from_generator(m, args.generator, enc.map["\n"]) if args.init == "arith-llama" else []
    if args.freeze_generator:
        if not copied:
            raise SystemExit("--freeze-generator needs --init arith-llama")
        frozen = {k for k in copied if k != "model.norm.weight"}
        for name, prm in m.named_parameters():
            if name in frozen or any(name.startswith(k.rsplit(".", 1)[0] + ".") for k in frozen
                                     if ".self_attn." in k and name.endswith(".bias")):
                prm.requires_grad_(False)
    n_params = sum(p.numel() for p in m.parameters())
    n_train = sum(p.numel() for p in m.parameters() if p.requires_grad)
    print(f"params {n_params:,}; copied {len(copied)} tensors from {args.generator.name if copied else '-'}",
          flush=True)

    eval_problems = make_set(EVAL_N, seed=EVAL_SEED)
    exclude = {p.question for p in eval_problems}
    own = load_own(args.samples, exclude)
    print("own samples by level:", {lv: len(v) for lv, v in sorted(own.items())}, flush=True)
    stream = Stream(enc, rng, own, args.own_share, args.p_right, exclude)
    monitor = make_set(20, seed=EVAL_SEED)  # a slice of the held-out problems, synthetic corruptions

    print(f"trainable params {n_train:,}", flush=True)
    dense_class_w = torch.tensor([args.first_wrong_weight, 1.0])
    distill = Distiller(args.generator, m.config.hidden_size, enc) if args.distill_weight > 0 else None
    extra = list(distill.head.parameters()) if distill else []
    opt = torch.optim.AdamW([p for p in m.parameters() if p.requires_grad] + extra, lr=args.lr, weight_decay=0.01,
                            betas=(0.9, 0.98))
    levels = sorted(LEVELS)
    weights = [LEVEL_WEIGHTS.get(lv, 1.0) for lv in levels]
    budget_s = args.minutes * 60
    t0 = time.monotonic()
    step = tokens = 0
    hist: list[tuple[float, ...]] = []
    log: list[dict] = []
    m.train()
    while True:
        elapsed = time.monotonic() - t0
        progress = step / args.steps if args.steps else elapsed / budget_s
        if progress >= 1:
            break
        lr = lr_at(progress, args.lr)
        for g in opt.param_groups:
            g["lr"] = lr
        x, c, d, y, n_tok = stream.batch(rng.choices(levels, weights)[0], args.batch_tokens)
        h = m.hidden(x)
        distill_loss = distill.loss(x, h, (c != -100) | (d != -100) | (y != -100)) if distill else torch.tensor(0.0)
        tag_pos = c != -100
        cls_loss = F.cross_entropy(m.score(h[tag_pos]), c[tag_pos])
        dense_pos = d != -100
        dense_loss = (F.cross_entropy(m.score(h[dense_pos]), d[dense_pos], weight=dense_class_w)
                      if args.dense_weight > 0 else torch.tensor(0.0))
        lm_pos = torch.zeros_like(y, dtype=torch.bool)
        lm_pos[:, :-1] = y[:, 1:] != -100  # hidden state at t predicts token t+1
        loss = cls_loss
        lm_loss = torch.tensor(0.0)
        if args.lm_weight > 0 and lm_pos.any():
            lm_loss = F.cross_entropy(F.linear(h[lm_pos], m.model.embed_tokens.weight), y[:, 1:][lm_pos[:, :-1]])
            loss = loss + args.lm_weight * lm_loss
        if args.dense_weight > 0:
            loss = loss + args.dense_weight * dense_loss
        if distill:
            loss = loss + args.distill_weight * distill_loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)
        opt.step()
        step += 1
        tokens += int(n_tok)
        hist.append((cls_loss.item(), lm_loss.item(), dense_loss.item(), distill_loss.item()))
        if step % 100 == 0:
            recent = hist[-100:]
            row = {"step": step, "min": round(elapsed / 60, 2), "lr": lr, "tok_s": round(tokens / max(elapsed, 1e-9)),
                   **{name: sum(r[j] for r in recent) / len(recent) for j, name in enumerate(("cls_loss", "lm_loss", "dense_loss", "distill_loss"))}}
            if step % 500 == 0:
                row |= quick_eval(m, enc, monitor, seed=step)
            log.append(row)
            print(json.dumps(row), flush=True)
    train_s = time.monotonic() - t0
    final = quick_eval(m, enc, eval_problems, seed=99)
    print("held-out synthetic (torch):", final, flush=True)
    save(m, tok, args.out)
    check_tokenizer(args.out, enc)
    size = (args.out / "model.safetensors").stat().st_size
    info = {
        "params": n_params, "trainable_params": n_train, "size_bytes": size, "init": args.init, "layers": args.layers, "steps": step,
        "tokens": tokens, "train_minutes": round(train_s / 60, 2),
        "script_minutes": round((time.monotonic() - t_start) / 60, 2),
        "final_cls_loss": sum(r[0] for r in hist[-50:]) / max(1, len(hist[-50:])),
        "heldout_synthetic_torch": final, "args": {k: _rel(v) for k, v in vars(args).items()},
        "own_samples": {lv: len(v) for lv, v in sorted(own.items())}, "log": log,
        "torch": torch.__version__, "threads": torch.get_num_threads(),
    }
    (args.out / "train_info.json").write_text(json.dumps(info, indent=2) + "\n")
    update_card(args.out / "README.md", "TRAIN", train_summary(info))
    print(f"saved {args.out} ({size / 1e6:.2f} MB, {n_params:,} params) after {train_s / 60:.1f} min", flush=True)


if __name__ == "__main__":
    main()
