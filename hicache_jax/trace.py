"""Mooncake-format request traces: read them, and turn their block hash ids into token ids.

Pure Python + numpy; never imports jax. A trace is JSON lines (plain, or gzip when the name
ends in `.gz`), one request per line, in arrival order:

    {"timestamp": 0, "input_length": 6758, "output_length": 500, "hash_ids": [0, 1, ..., 13]}

`timestamp` is the arrival in milliseconds from the start, `hash_ids` one id per block of
`block_tokens` (512) prompt tokens, the last block partial. Equal ids at the same position
mean equal block content, so two prompts share their prefix up to the first differing id.

No token ids are in a trace. `request_tokens` makes them: block `h` becomes `block_tokens`
ids drawn from `h` alone by a counter-based generator (splitmix64 of `seed`, `h` and the
position in the block), the last block cut to `input_length`:

    hash_ids   [ 7        | 3        | 12   ]     input_length = 2 * 512 + 90
    tokens     [ g(7, 0..511) | g(3, 0..511) | g(12, 0..89) ]

so equal ids give equal prefixes wherever they occur, and different ids differ (up to a
collision of two 512-token random draws). Ids are bounded to `1 .. vocab - 1`.

    reqs = read_trace("traces/conversation_trace.jsonl.gz", limit=100)
    tokens = request_tokens(reqs[0], vocab=129280)      # i32[reqs[0].input_length]
"""
from __future__ import annotations

import dataclasses
import gzip
import json
import os
from collections.abc import Iterator

import numpy as np

BLOCK_TOKENS = 512      # tokens per hash id in Mooncake's trace release
_FIELDS = ("timestamp", "input_length", "output_length", "hash_ids")
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)


@dataclasses.dataclass(frozen=True)
class TraceRequest:
    """One request of a trace. `index`: its line (0-based) among the requests read."""

    index: int
    timestamp_ms: float          # arrival, milliseconds from the start of the trace
    input_length: int            # prompt tokens
    output_length: int           # generated tokens
    hash_ids: tuple[int, ...]    # one per block of the prompt, the last one partial

    def blocks(self, max_tokens: int | None = None, block_tokens: int = BLOCK_TOKENS) -> tuple[int, ...]:
        """The hash ids of the prompt's first `max_tokens` tokens (all when None)."""
        if max_tokens is None or max_tokens >= self.input_length:
            return self.hash_ids
        return self.hash_ids[: -(-max_tokens // block_tokens)]


def iter_trace(path: str | os.PathLike[str], limit: int | None = None,
               block_tokens: int = BLOCK_TOKENS) -> Iterator[TraceRequest]:
    """The requests of a trace file, validated one by one (see `read_trace`)."""
    if limit is not None and (not _is_int(limit) or limit < 0):
        raise ValueError(f"limit must be an int >= 0 or None, got {limit!r}")
    if not _is_int(block_tokens) or block_tokens < 1:
        raise ValueError(f"block_tokens must be an int >= 1, got {block_tokens!r}")
    path = os.fspath(path)
    opener = gzip.open if path.endswith(".gz") else open
    count, last = 0, 0.0
    with opener(path, "rt", encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if limit is not None and count >= limit:
                return
            if not line.strip():
                continue
            req = _parse(line, f"{path}:{lineno}", count, block_tokens)
            if req.timestamp_ms < last:
                raise ValueError(f"{path}:{lineno}: field 'timestamp' goes back in time "
                                 f"({req.timestamp_ms} after {last}): requests must be in arrival order")
            last = req.timestamp_ms
            count += 1
            yield req


def read_trace(path: str | os.PathLike[str], limit: int | None = None,
               block_tokens: int = BLOCK_TOKENS) -> list[TraceRequest]:
    """The first `limit` requests of a trace file (all when None).

    Each line must be a JSON object with a number `timestamp` >= 0 (not before the line
    above), an int `input_length` >= 1, an int `output_length` >= 0, and `hash_ids`, a list
    of ceil(input_length / block_tokens) ints >= 0. Anything else raises ValueError naming
    the file, the line and the field. Unknown fields are ignored.
    """
    return list(iter_trace(path, limit, block_tokens))


def request_tokens(req: TraceRequest, vocab: int, block_tokens: int = BLOCK_TOKENS,
                   max_tokens: int | None = None, seed: int = 0) -> np.ndarray:
    """The prompt of `req` as i32[min(input_length, max_tokens)] token ids in 1 .. vocab - 1.

    Block `h` always becomes the same `block_tokens` ids (a function of `h`, the position in
    the block and `seed` only), so prompts that share leading hash ids share their tokens.
    """
    if not isinstance(req, TraceRequest):
        raise ValueError(f"request_tokens takes a TraceRequest, got {type(req).__name__}")
    if not _is_int(vocab) or vocab < 2:
        raise ValueError(f"vocab must be an int >= 2, got {vocab!r}")
    if not _is_int(block_tokens) or block_tokens < 1:
        raise ValueError(f"block_tokens must be an int >= 1, got {block_tokens!r}")
    if max_tokens is not None and (not _is_int(max_tokens) or max_tokens < 1):
        raise ValueError(f"max_tokens must be an int >= 1 or None, got {max_tokens!r}")
    if not _is_int(seed) or seed < 0:
        raise ValueError(f"seed must be an int >= 0, got {seed!r}")
    n = req.input_length if max_tokens is None else min(req.input_length, max_tokens)
    ids = np.asarray(req.blocks(n, block_tokens), np.uint64)
    # counter of each token: (hash id, position in its block), then mixed with the seed
    counter = (ids[:, None] * np.uint64(block_tokens) + np.arange(block_tokens, dtype=np.uint64)).reshape(-1)[:n]
    z = _splitmix(counter ^ _splitmix(np.asarray([seed], np.uint64)))
    return (z % np.uint64(vocab - 1) + np.uint64(1)).astype(np.int32)


def _splitmix(z: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser, elementwise on uint64 (wrapping arithmetic)."""
    z = z + _GOLDEN
    z = (z ^ (z >> np.uint64(30))) * _MIX1
    z = (z ^ (z >> np.uint64(27))) * _MIX2
    return z ^ (z >> np.uint64(31))


def _parse(line: str, where: str, index: int, block_tokens: int) -> TraceRequest:
    try:
        rec = json.loads(line)
    except json.JSONDecodeError as e:
        raise ValueError(f"{where}: not valid JSON: {e}") from None
    if not isinstance(rec, dict):
        raise ValueError(f"{where}: a request must be a JSON object, got {type(rec).__name__}")
    missing = [f for f in _FIELDS if f not in rec]
    if missing:
        raise ValueError(f"{where}: field {missing[0]!r} is missing")
    ts, n_in, n_out, ids = (rec[f] for f in _FIELDS)
    if not (_is_int(ts) or isinstance(ts, float)) or not ts >= 0:
        raise ValueError(f"{where}: field 'timestamp' must be a number >= 0 (milliseconds), got {ts!r}")
    if not _is_int(n_in) or n_in < 1:
        raise ValueError(f"{where}: field 'input_length' must be an int >= 1, got {n_in!r}")
    if not _is_int(n_out) or n_out < 0:
        raise ValueError(f"{where}: field 'output_length' must be an int >= 0, got {n_out!r}")
    if not isinstance(ids, list) or not all(_is_int(h) and 0 <= h < 1 << 63 for h in ids):
        raise ValueError(f"{where}: field 'hash_ids' must be a list of ints in 0 .. 2**63 - 1, got {_short(ids)}")
    want = -(-n_in // block_tokens)
    if len(ids) != want:
        raise ValueError(f"{where}: field 'hash_ids' has {len(ids)} ids; input_length {n_in} needs {want} "
                         f"(one per {block_tokens}-token block)")
    return TraceRequest(index, float(ts), n_in, n_out, tuple(ids))


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


__all__ = ["BLOCK_TOKENS", "TraceRequest", "iter_trace", "read_trace", "request_tokens"]
