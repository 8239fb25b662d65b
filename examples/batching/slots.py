"""The batched step's inputs and outputs: sequences packed into slots, greedy tokens out.

`pack` puts the running sequences, oldest first, into slots 0 .. n - 1 of a `SlotBatch`
of fixed shape (max_batch slots, the model's chunk and page table), so every step runs
the one program compiled at warm-up. Slots past n are not computed, or, for a step that
computes every slot (`forward_batch(every_slot=True)`), computed on the `trash` pages.

`pick` (jitted once) takes the step's logits f32[B, vocab] to what the loop fetches:
the greedy tokens, a digest of each row, and the full rows of the slots named in
`rows` (the `--check` sample's): a few KB per step instead of B x vocab floats. The
digest is sum_j bits(row[j]) * (2j + 1) mod 2^32 over the row's f32 bit patterns:
integer sums do not depend on the order of the reduction, and any single changed value
changes it (the multipliers are odd), so two runs' rows with equal digests at every
token agree with near certainty; the sample's rows are compared in full.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from examples.batching.sequence import Sequence
from examples.tiny_models.base import SlotBatch


def pack(batch: list[Sequence], max_batch: int, chunk_size: int, max_pages: int,
         trash: tuple[int, int] = (0, 0)) -> SlotBatch:
    """The `SlotBatch` of one step: sequence i of `batch` in slot i (module docstring);
    `trash`: (anchor page, SWA page) every table of a slot past the batch names."""
    if len(batch) > max_batch:
        raise AssertionError(f"bug: {len(batch)} sequences scheduled for {max_batch} slots")
    B, C, M = max_batch, chunk_size, max_pages
    tokens = np.zeros((B, C), np.int32)
    start, valid = np.zeros(B, np.int32), np.ones(B, np.int32)
    anchor, swa = np.full((B, M), trash[0], np.int32), np.full((B, M), trash[1], np.int32)
    logits = np.zeros(B, np.bool_)
    for i, seq in enumerate(batch):
        s, e = seq.next_chunk(C)
        tokens[i, : e - s] = seq.ids(s, e)
        start[i], valid[i] = s, e - s
        pages = seq.placement.anchor
        anchor[i, : len(pages)] = pages
        for q, page in seq.placement.swa.items():
            swa[i, q] = page
        logits[i] = e == seq.known          # only a chunk that reaches the last token yields one
    return SlotBatch(np.int32(len(batch)), tokens, start, valid, anchor, swa, logits)


@functools.partial(jax.jit)
def pick(logits, rows):
    """(tokens i32[B], digests u32[B], sample f32[K, vocab]) of logits f32[B, vocab]; rows i32[K]."""
    tokens = jnp.argmax(logits, axis=-1).astype(jnp.int32)
    weights = 2 * jnp.arange(logits.shape[-1], dtype=jnp.uint32) + 1
    digests = jnp.sum(jax.lax.bitcast_convert_type(logits, jnp.uint32) * weights, axis=-1, dtype=jnp.uint32)
    return tokens, digests, jnp.take(logits, rows, axis=0)
