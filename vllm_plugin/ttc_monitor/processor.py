"""The vLLM logits processor: DeepConf's online cut, inside the engine, per trace.

A request asking for a monitor (:mod:`ttc_monitor.args`) has, at every decoding step, the confidence of
the step's distribution measured from the raw logits this processor sees (``log_softmax`` of the
model's logits, before temperature, penalties and top-k/top-p: vLLM's ``raw_logprobs``, what its
returned log-probs are) and fed to the trace's :class:`~ttc_monitor.window.GroupConfidence`. At the
first step whose group confidence is under the request's threshold, every logit but the marker's is
set to ``-inf``: the marker is the step's token whatever the sampler, and since the request lists it in
``stop_token_ids`` the trace ends there (``finish_reason: stop``, ``stop_reason``: the marker's id).
Each child of an ``n=k`` request is its own engine request with its own state, so the traces of one
call are cut one by one while the call streams on; a request without monitor arguments is not touched.

One class serves both of vLLM's logits-processor interfaces, each as that runner calls it:

* the V1 model runner (the CPU build's; ``VLLM_USE_V2_MODEL_RUNNER=0`` on GPU): ``__init__(vllm_config,
  device, is_pin_memory)``, batch changes through :meth:`update_state`, ``apply(logits)`` with one row
  per batch index, a request's position from its output-token list;
* Model Runner V2 (the GPU default): ``__init__(vllm_config, req_states)``, :meth:`add_request` per
  request slot, ``apply(logits, ctx)`` with the rows mapped to slots by ``ctx.idx_mapping_np`` and a
  request's position from ``ctx.seq_lens_upper_bound_np``. Speculative decoding (several rows per
  request) is not monitored.

Per step the monitored rows cost one ``log_softmax`` and one ``topk`` over the vocabulary and one copy
of their confidences to the host.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from vllm.v1.sample.logits_processor.builtin import process_dict_updates
from vllm.v1.sample.logits_processor.interface import BatchUpdate
from vllm.v1.sample.logits_processor.interface import LogitsProcessor as V1LogitsProcessor

from ttc_monitor.args import MonitorArgs, parse
from ttc_monitor.window import GroupConfidence

try:  # Model Runner V2's interface (vLLM >= 0.32)
    from vllm.v1.worker.gpu.sample.logits_processor import LogitsProcessor as V2LogitsProcessor
except ImportError:  # pragma: no cover - an older vLLM: the V1 interface only
    class V2LogitsProcessor:  # type: ignore[no-redef]
        """Stands in for Model Runner V2's interface where vLLM has none."""

log = logging.getLogger("ttc_monitor")


class _Trace:
    """One monitored request: its arguments, its window, and (V1) its running output-token list."""

    __slots__ = ("args", "group", "output")

    def __init__(self, args: MonitorArgs, output: list[int] | None = None) -> None:
        self.args = args
        self.group = GroupConfidence(args.window)
        self.output = output


def token_confidences(logits: torch.Tensor, top_k: list[int]) -> list[float]:
    """``C_t`` of each row of ``logits``: ``-(1/k) * sum`` of its ``k`` largest log-probabilities
    (``k = top_k[row]``)."""
    logprobs = torch.log_softmax(logits.to(torch.float32), dim=-1)
    top = torch.topk(logprobs, min(max(top_k), logprobs.shape[-1]), dim=-1).values.cumsum(dim=-1)
    k = torch.tensor([min(t, top.shape[-1]) for t in top_k], device=logits.device, dtype=torch.int64)
    sums = top.gather(1, (k - 1).unsqueeze(1)).squeeze(1)
    return (-sums / k.to(sums.dtype)).tolist()


class ConfidenceMonitor(V1LogitsProcessor, V2LogitsProcessor):  # type: ignore[misc]
    """See the module doc."""

    def __init__(self, vllm_config: Any, *runner: Any) -> None:
        self.v2 = len(runner) == 1
        """Model Runner V2 built it (``(vllm_config, req_states)``); else the V1 runner
        (``(vllm_config, device, is_pin_memory)``)."""
        try:
            self.vocab: int | None = int(vllm_config.model_config.get_vocab_size())
        except (AttributeError, TypeError, ValueError):
            self.vocab = None
        self.traces: dict[int, _Trace] = {}
        """Monitored requests by batch index (V1) or request slot (V2)."""

    @classmethod
    def validate_params(cls, sampling_params: Any) -> None:
        """At admission: a request's monitor arguments are valid (else a 400 naming the argument)."""
        parse(sampling_params.extra_args, sampling_params.stop_token_ids or [])

    def _trace(self, params: Any, output: list[int] | None) -> _Trace | None:
        try:
            args = parse(getattr(params, "extra_args", None), getattr(params, "stop_token_ids", None) or [])
        except ValueError as exc:  # admission checked it; never fail the engine over one request
            log.warning("monitor arguments refused: %s", exc)
            return None
        if args is None or (self.vocab is not None and args.marker >= self.vocab):
            return None
        return _Trace(args, output)

    # -- the V1 model runner -----------------------------------------------------------------------

    def is_argmax_invariant(self) -> bool:
        """It forces tokens, so greedy decoding sees it too."""
        return False

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        process_dict_updates(self.traces, batch_update, lambda params, _prompt, output: self._trace(params, output))

    # -- Model Runner V2 ----------------------------------------------------------------------------

    def add_request(self, req_idx: int, sampling_params: Any) -> bool:
        trace = self._trace(sampling_params, None)
        if trace is None:
            self.traces.pop(req_idx, None)
            return False
        self.traces[req_idx] = trace
        return True

    # -- both ---------------------------------------------------------------------------------------

    def _rows(self, logits: torch.Tensor, ctx: Any) -> list[tuple[int, _Trace, int]]:
        """``(logits row, trace, position)`` of every monitored request in this step."""
        if ctx is None:
            return [(row, t, len(t.output or ())) for row, t in self.traces.items() if row < logits.shape[0]]
        slots = ctx.idx_mapping_np.tolist()
        if len(slots) != logits.shape[0]:  # speculative decoding: several rows a request
            return []
        lengths = ctx.seq_lens_upper_bound_np
        return [(row, self.traces[slot], int(lengths[row])) for row, slot in enumerate(slots) if slot in self.traces]

    def apply(self, logits: torch.Tensor, ctx: Any = None) -> torch.Tensor:
        if not self.traces:
            return logits
        rows = self._rows(logits, ctx)
        if not rows:
            return logits
        index = torch.tensor([r for r, _, _ in rows], device=logits.device, dtype=torch.int64)
        confidences = token_confidences(logits.index_select(0, index), [t.args.top_k for _, t, _ in rows])
        for (row, trace, pos), c in zip(rows, confidences, strict=True):
            if trace.group.below(c, trace.args.threshold, pos):
                marker = trace.args.marker
                logits[row].fill_(float("-inf"))
                logits[row, marker] = 0.0
        return logits
