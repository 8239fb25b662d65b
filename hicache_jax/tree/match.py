"""Match results and the boundary rule: page alignment, the `input_len - 1` cap, the SWA window.

A prefix boundary b (in pages) is usable on a tier only if the FULL value of pages 0..b-1
is there and, for models with a sliding window, the last `window_pages` pages before b
carry SWA data there (a gap resets the count), or no page since the root lacks it:

    pages      0  1  2  3  4  5
    swa        T  T  F  T  T  F        window_pages = 2
    valid b    0  1  2  .  .  5  .     b=3: page 2 lacks SWA; b=4: run of 1 < 2; b=5: run of 2
"""
from __future__ import annotations

import array
import dataclasses
from collections.abc import Iterable, Mapping

import numpy as np

from hicache_jax.tree.node import NodeId


@dataclasses.dataclass(frozen=True, eq=False)
class MatchResult:
    """What `match_prefix` found. Lengths are tokens, page-aligned.

    `device_pages`: anchor device pages of the device-usable prefix (i32[device_len/page]).
    `swa_pages`: SWA device pages of that prefix's trailing window, oldest first
    (i32[min(window_pages, device_len/page)]; empty without an SWA pool). They name the
    logical pages `device_len/page - len(swa_pages) ...`.
    `device_node`/`host_node`: the last node of the device prefix / of the whole match
    (the root, id 0, when empty); a `load_back` of this match brings `host_len` more tokens.
    `pending_len`: tokens of the prompt that the tree holds, right where the walk stopped,
    in nodes whose host copy is still being written (write-back demotions, or backups
    evicted from the device before their ack); once those backups (`pending_writes`, their
    ack ids) land, a new match may reach up to that much further.
    `window_pages`: per window allocator, its device pages of the trailing window
    (`swa_pages` is the SWA pool's entry).
    """

    device_len: int
    host_len: int
    device_pages: np.ndarray
    swa_pages: np.ndarray
    device_node: NodeId
    host_node: NodeId
    pending_len: int = 0
    window_pages: Mapping[str, np.ndarray] = dataclasses.field(default_factory=dict)
    pending_writes: frozenset[int] = frozenset()

    @property
    def total_len(self) -> int:
        return self.device_len + self.host_len


def best_boundary(present_desc: Iterable[bool], limit: int, window_pages: int) -> int:
    """Largest b <= limit (pages) whose trailing window is SWA-complete.

    `present_desc` yields the SWA presence of pages limit-1, limit-2, ..., 0: a scan from
    the top that stops at the first full window, so the usual case costs `window_pages`
    steps, whatever the prefix length.
    """
    b, run = limit, 0
    for i, present in zip(range(limit - 1, -1, -1), present_desc):
        if present:
            run += 1
            if run >= window_pages:
                return b
        else:
            b, run = i, 0       # a gap: the next candidate ends just below it
    return b                    # ran into the root: no gap below b


def cap_tokens(input_len: int, page_size: int) -> int:
    """At most input_len - 1 tokens, page-aligned: one token is always recomputed for logits."""
    return max(0, (input_len - 1) // page_size * page_size)


def as_tokens(tokens) -> np.ndarray:
    """Token ids as i32[n]; anything else raises ValueError naming what was given.

    An i32 array passes through untouched. A Python list of ints (what many serving loops
    hold) goes through `array.array`, which converts a list faster than `np.asarray` does.
    """
    if isinstance(tokens, np.ndarray):
        if tokens.dtype == np.int32 and tokens.ndim == 1:    # the hot path: nothing to convert
            return tokens
        arr = tokens
    elif isinstance(tokens, list) and tokens and type(tokens[0]) is int:
        try:
            arr = np.frombuffer(array.array("q", tokens), np.int64)
        except (TypeError, OverflowError):                  # not all ints, or out of int64
            arr = np.asarray(tokens, dtype=object)
    else:
        arr = np.asarray(tokens)
    if arr.ndim != 1 or not (np.issubdtype(arr.dtype, np.integer) or arr.size == 0) or arr.dtype == np.bool_:
        raise ValueError(f"tokens must be a 1-D sequence of integers, got {arr.dtype} of shape {arr.shape}")
    if arr.size and (arr.min() < 0 or arr.max() > np.iinfo(np.int32).max):
        raise ValueError(f"token ids must be in 0..2**31-1, got min {arr.min()} max {arr.max()}")
    return arr.astype(np.int32)
