"""Probes: a running thought asked for the answer it has got to (Dynasor-CoT's probes, Certaindex's
consistency), so a trace that has settled stops early and votes with that answer.

A :class:`TraceProbe` follows one streamed one-sample trace of a chat request. Every ``every``
thought tokens it starts one probe (never two at once for a trace; a probe still running when the
next is due makes that one wait): the query's request continued from the thought so far closed by
the policy's ``suffix`` (``</think>``: the assistant's unfinished turn, vLLM's
``continue_final_message``, so the prompt and the thought ride the prefix cache), greedy, at most
``max_tokens`` tokens, while the trace keeps decoding. The probe's text (vLLM puts a continuation
that never closes a thought in ``reasoning``; whichever field has it) is keyed by the query's answer
kind like any sample's.

* **A trace settles** when its last ``agree`` probed keys are one answer: it is stopped at its next
  chunk and joins its query with that probe's text as its content (``finish_reason: "probe"``; it
  votes, its thought is what it had written).
* **A query settles** (probes combined with any allocator): a trace whose last ``agree - 1`` probed
  keys agree offers its answer as a provisional vote. When the allocator would call the query
  finished on its finished samples plus the provisional votes (:meth:`~allocators.Allocator.finished`),
  every offering trace is stopped with its answer, and the strategy cancels the rest once they join.

Probes are ordinary calls of the run (:meth:`app.run.Run.generate`): they hold their ``max_tokens``
in the token budget while they run and are billed, prompt and completion, as any call; a probe the
budget cannot pay for is not made. The run waits for nothing a probe does: a trace that finishes
first simply wins.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from app.backends.base import Progress
from app.protocol import ProbeSpec

__all__ = ["PROBE_DROPS", "THINK_END", "ProbeReading", "TraceProbe"]

THINK_END = "</think>"

PROBE_DROPS = frozenset({"n", "seed", "logprobs", "top_logprobs", "thinking_token_budget", "stream",
                         "stream_options"})
"""A query's parameters a probe does not take (it is one greedy, unmonitored, unbudgeted continuation)."""
"""Where a thought ends: the probe's answer text is what its suffix has after this, then what it generated."""


@dataclass(frozen=True, slots=True)
class ProbeReading:
    """What one probe read: the answer key (``None``: no answer could be extracted) and the text the
    trace would answer with."""

    key: str | None
    text: str


Reader = Callable[[str], Awaitable[ProbeReading | None]]
"""Runs one probe on a thought (``None``: the probe was not made, e.g. the budget could not pay)."""


@dataclass(slots=True)
class TraceProbe:
    """The probes of one trace (see the module doc). ``progress`` is its stream's progress: the probe
    reads the thought from it (``on_thought``) and stops the trace through it (``verdict``);
    ``read`` runs one probe; ``settled`` is called after each reading (the query's consensus check)."""

    spec: ProbeSpec
    progress: Progress
    read: Reader
    settled: Callable[[TraceProbe], None]
    readings: list[ProbeReading] = field(default_factory=list)
    thought: list[str] = field(default_factory=list)
    tokens: int = 0
    next_at: int = 0
    task: asyncio.Task[None] | None = None
    made: int = 0
    """Probes made (each billed)."""

    def __post_init__(self) -> None:
        self.next_at = self.spec.every
        self.progress.on_thought = self.feed

    @property
    def active(self) -> bool:
        """The trace is still running and not yet told to stop."""
        return self.progress.verdict is None and not self.progress.done

    def feed(self, piece: str, tokens: int) -> None:
        """A piece of the trace's thought arrived (``tokens``: the thought's tokens so far); start a
        probe when one is due and none is running. A restarted stream (a retry elsewhere) starts the
        thought over."""
        if tokens < self.tokens:
            self.thought.clear()
            self.readings.clear()
            self.next_at = self.spec.every
        self.thought.append(piece)
        self.tokens = tokens
        if tokens >= self.next_at and (self.task is None or self.task.done()) and self.active:
            self.next_at = tokens + self.spec.every
            self.task = asyncio.create_task(self._probe("".join(self.thought)))

    async def _probe(self, thought: str) -> None:
        reading = await self.read(thought)
        if reading is None:
            return
        self.made += 1
        if not self.active:
            return
        self.readings.append(reading)
        if self.agreeing(self.spec.agree) is not None:
            self.stop(reading.text)
        else:
            self.settled(self)

    def agreeing(self, k: int) -> ProbeReading | None:
        """The last reading when the last ``k`` readings have one answer (``None`` otherwise)."""
        last = self.readings[-k:]
        if k < 1 or len(last) < k or last[-1].key is None or any(r.key != last[-1].key for r in last):
            return None
        return last[-1]

    def offer(self) -> ProbeReading | None:
        """The trace's provisional vote: its last reading once its last ``agree - 1`` readings agree."""
        return self.agreeing(max(1, self.spec.agree - 1)) if self.active else None

    def stop(self, text: str) -> None:
        """Stop the trace at its next chunk, answering ``text``."""
        if self.active:
            self.progress.verdict = text

    async def close(self) -> None:
        """Cancel a probe still running (its call bills what it held)."""
        task = self.task
        if task is not None and not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
