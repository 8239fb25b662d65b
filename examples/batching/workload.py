"""The requests a replay serves: a Mooncake-format trace cut to the model's size.

    jobs = load_jobs("traces/conversation_trace.jsonl.gz", vocab=512, limit=48,
                     max_input_tokens=2048, max_output_tokens=16, time_scale=1.0)

Each trace request becomes a `Job`: its prompt as token ids from its hash ids
(`hicache_jax.trace.request_tokens`: equal hash ids give equal tokens, so prompts share
exactly the prefixes the trace says they share), cut to its first `max_input_tokens`
tokens; `gen` tokens to generate, its `output_length` cut to `max_output_tokens` and at
least 1 (the first token is what TTFT measures); and its arrival on the replay's clock,
the trace timestamp times `time_scale` (0.5: twice as fast). Cuts keep a prompt's head,
so a cut prompt still shares every block it shared before the cut.
"""
from __future__ import annotations

import dataclasses
import os

import numpy as np

from hicache_jax.trace import TraceRequest, read_trace, request_tokens


@dataclasses.dataclass(frozen=True, eq=False)
class Job:
    """One request of the replay."""

    index: int              # the request's position in the trace (0-based)
    arrival_s: float        # on the replay clock: timestamp (ms) x time_scale / 1000
    prompt: np.ndarray      # i32[prompt tokens]
    gen: int                # tokens to generate, >= 1

    @property
    def length(self) -> int:
        """Tokens of the whole request: prompt and generated."""
        return len(self.prompt) + self.gen

    def pages(self, page_size: int) -> int:
        """Device pages the request holds at its longest."""
        return -(-self.length // page_size)


def load_jobs(path: str | os.PathLike[str], vocab: int, limit: int | None = None,
              max_input_tokens: int | None = None, max_output_tokens: int | None = None,
              time_scale: float = 1.0, seed: int = 0) -> list[Job]:
    """The first `limit` requests of the trace at `path` as jobs, in arrival order.

    A malformed trace raises ValueError naming the file, line and field (`read_trace`)."""
    if not time_scale > 0:
        raise ValueError(f"time_scale must be > 0, got {time_scale!r}")
    return [job_of(r, vocab, max_input_tokens, max_output_tokens, time_scale, seed)
            for r in read_trace(path, limit=limit)]


def job_of(req: TraceRequest, vocab: int, max_input_tokens: int | None, max_output_tokens: int | None,
           time_scale: float, seed: int = 0) -> Job:
    prompt = request_tokens(req, vocab, max_tokens=max_input_tokens, seed=seed)
    gen = req.output_length if max_output_tokens is None else min(req.output_length, max_output_tokens)
    return Job(req.index, req.timestamp_ms * time_scale / 1000.0, prompt, max(1, gen))
