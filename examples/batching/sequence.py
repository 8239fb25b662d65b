"""`Sequence`: one request's state in the batched loop, from arrival to its last token.

Positions are computed chunk by chunk, prefill and decode alike (the paged-model contract,
examples/tiny_models/base.py): the next chunk starts at the chunk holding position
`computed` and ends at the last known token, at most one chunk further:

    known tokens   prompt ................................ generated
    positions      0 ........ computed ........ end                        end = min(known, start + C)
    next chunk                [start = computed // C * C, end)             logits of end - 1 if end == known

Prefill: `computed` is a chunk boundary (0, or a cached prefix's length, which is whole
pages) and the chunk is up to C new positions. Decode: every known token but the last
was computed (`computed` = known - 1), and the chunk holding it is recomputed with `valid`
one larger. A chunk that reaches the last known token yields the next token.

A loop that queues the next step before fetching this one's tokens knows a token is coming
before it knows its value: `expect_token` counts it as known at once (a placeholder), and
`set_token` fills it in. Until then nothing may read it: it is past every computed
position, so the pages given to the cache never hold it, and the next chunk is packed
after it is filled.

Placement (pages, lock, prefix) belongs to one admission: preemption drops it
(`unplace`), and the sequence is placed again, from whatever prefix the cache then has,
when it is admitted again. What it generated stays.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from examples.batching.workload import Job

TIERS = ("device", "host", "storage")       # where a prefix's tokens were found
PENDING = -1                                # a token expected and not fetched yet (`expect_token`)


@dataclasses.dataclass
class Placement:
    """Where a placed sequence's state lives: its pages, its prefix, its lock."""

    anchor: list[int]                  # logical page -> anchor device page (prefix pages, then its own)
    swa: dict[int, int]                # logical page -> SWA device page (the prefix's window, then its own)
    own_swa: list[int]                 # SWA pages it allocated (freed at the end unless kept)
    cached_pages: int                  # pages of the prefix it started from (the tree's)
    lock: object | None                # the prefix's lock (None: no cache)


class Sequence:
    """A request: its tokens, its timings, and (while admitted) its placement."""

    def __init__(self, job: Job):
        self.job = job
        self.tokens: list[int] = []          # generated
        self.digests: list[int] = []         # u32 digest of the logits behind each generated token
        self.logits: list[np.ndarray] = []   # f32[vocab] behind each token (sampled requests only)
        self.token_times: list[float] = []   # replay clock at each generated token
        self.computed = 0
        self.placement: Placement | None = None
        self.admissions = 0                  # 1 + times preempted and admitted again
        self.hits = dict.fromkeys(TIERS, 0)          # prompt tokens found in the cache at the first admission
        self.resume_hits = dict.fromkeys(TIERS, 0)   # tokens found when it came back after a preemption
        self.computed_tokens = 0             # positions this request computed (prefill, recompute)

    # -- tokens --------------------------------------------------------------------------------
    @property
    def known(self) -> int:
        """Tokens known: prompt and generated."""
        return len(self.job.prompt) + len(self.tokens)

    def token_ids(self) -> np.ndarray:
        """i32[known]: the prompt, then the generated tokens."""
        return np.concatenate([self.job.prompt, np.asarray(self.tokens, np.int32)]).astype(np.int32)

    @property
    def pending(self) -> bool:
        """A token is expected and not fetched yet (module docstring)."""
        return bool(self.tokens) and self.tokens[-1] == PENDING

    def ids(self, start: int, end: int) -> np.ndarray:
        """i32[end - start]: the known tokens start .. end - 1."""
        if self.pending and end == self.known:
            raise AssertionError(f"bug: request {self.job.index}'s last token read before it was fetched")
        n = len(self.job.prompt)
        if end <= n:
            return self.job.prompt[start:end]
        return np.concatenate([self.job.prompt[start:n], np.asarray(self.tokens[max(0, start - n):end - n], np.int32)])

    @property
    def finished(self) -> bool:
        return len(self.tokens) >= self.job.gen

    def next_chunk(self, chunk_size: int) -> tuple[int, int]:
        """(start, end) of the positions the next step computes (module docstring)."""
        start = self.computed // chunk_size * chunk_size
        return start, min(self.known, start + chunk_size)

    def pages_for_next_chunk(self, chunk_size: int, page_size: int) -> int:
        """Device pages (anchor, and as many SWA) the next chunk needs beyond those placed."""
        _, end = self.next_chunk(chunk_size)
        return max(0, -(-end // page_size) - len(self.placement.anchor))

    def advance(self, chunk_size: int) -> bool:
        """Record that the next chunk was computed; True when it yields a token (`add_token`)."""
        start, end = self.next_chunk(chunk_size)
        self.computed_tokens += end - max(start, self.computed)
        self.computed = end
        return end == self.known

    def expect_token(self) -> None:
        """The chunk just queued yields a token: it counts as known now (module docstring)."""
        if self.pending:
            raise AssertionError(f"bug: request {self.job.index} expects a token while one is pending")
        self.tokens.append(PENDING)
        self.digests.append(0)

    def set_token(self, token: int, digest: int, logits: np.ndarray | None) -> None:
        """The expected token's value, the digest of its logits and (sampled requests) the logits."""
        if not self.pending:
            raise AssertionError(f"bug: request {self.job.index} got a token it did not expect")
        self.tokens[-1], self.digests[-1] = int(token), int(digest)
        if logits is not None:
            self.logits.append(logits)

    # -- placement -------------------------------------------------------------------------------
    def place(self, placement: Placement, prefix_len: int) -> None:
        """Admitted: positions below `prefix_len` (whole pages) come from the cache."""
        if self.placement is not None:
            raise AssertionError(f"bug: request {self.job.index} placed twice")
        self.placement, self.computed = placement, prefix_len
        self.admissions += 1

    def unplace(self) -> Placement:
        """Preempted or finished: the placement, now the caller's to release."""
        placement, self.placement = self.placement, None
        if placement is None:
            raise AssertionError(f"bug: request {self.job.index} released without a placement")
        return placement
