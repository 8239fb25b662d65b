"""Shared pieces of the tiny-model tests: models, garbage pools, a recorded request, restores.

The recorded request runs `CALLS` (three full pages, then a prefill of 100 tokens on page
3 and three decode steps on it) through `forward_chunk_all` on pools full of random
garbage, through permuted page tables whose unused entries are random page ids. Every
call also checks that it wrote only the current page of every pool.
"""
from __future__ import annotations

import dataclasses
import functools
import pathlib
import sys

import jax.numpy as jnp
import numpy as np

import hicache_jax as hc

ROOT = pathlib.Path(__file__).resolve().parents[2]
CONFIGS = ROOT / "configs"
if str(ROOT) not in sys.path:  # `examples` is a namespace package at the repository root
    sys.path.insert(0, str(ROOT))

from examples.tiny_models import make_model  # noqa: E402

MAX_PAGES = 8
NUM_ANCHOR_PAGES = 12
NUM_SWA_PAGES = 10
PAGE = 256
CALLS = ((0, 256), (1, 256), (2, 256), (3, 100), (3, 101), (3, 102), (3, 103))  # (logical page, valid)
NUM_PAGES = 4

# name -> (config file, field overrides)
VARIANTS = {
    "tiny_v4": ("tiny_v4", {}),
    "tiny_v41": ("tiny_v41", {}),
    "tiny_gqa": ("tiny_gqa", {}),
    "tiny_v41_sm100": ("tiny_v41", {"kv_layout": "v41"}),   # V41 SWA + V41_FP4 compressed
    "tiny_v4_fp4_indexer": ("tiny_v4", {"indexer_dtype": "fp4"}),
}


@functools.cache
def model(name: str):
    file, overrides = VARIANTS[name]
    cfg = dataclasses.replace(hc.load_model_config(CONFIGS / f"{file}.json"), **overrides)
    return make_model(hc.build_layout(cfg), seed=0, max_pages=MAX_PAGES)


def host(pools) -> dict[str, np.ndarray]:
    return {k: np.array(v, copy=True) for k, v in pools.items()}


def device(pools: dict[str, np.ndarray]) -> dict:
    return {k: jnp.asarray(v) for k, v in pools.items()}


def garbage_pools(m, seed: int, fill: str = "random") -> dict[str, np.ndarray]:
    """Host pools of the model's shapes: random bytes (some decode to NaN) or all 0xFF (all NaN)."""
    rng = np.random.default_rng(seed)
    out = {}
    for name, (shape, dtype) in m.pool_shapes(NUM_ANCHOR_PAGES, NUM_SWA_PAGES).items():
        dt = np.dtype(jnp.dtype(dtype))
        n = int(np.prod(shape)) * dt.itemsize
        raw = rng.integers(0, 256, n, dtype=np.uint8) if fill == "random" else np.full(n, 0xFF, np.uint8)
        out[name] = raw.view(dt).reshape(shape)
    return out


def tables(seed: int, live: range):
    """(anchor, swa) i32[MAX_PAGES]: distinct ids for the logical pages in `live`, random ids elsewhere."""
    rng = np.random.default_rng(seed)
    anchor = rng.integers(0, NUM_ANCHOR_PAGES, MAX_PAGES)
    swa = rng.integers(0, NUM_SWA_PAGES, MAX_PAGES)
    anchor[: NUM_PAGES] = rng.permutation(NUM_ANCHOR_PAGES)[: NUM_PAGES]  # anchor pages stay live
    swa[list(live)] = rng.permutation(NUM_SWA_PAGES)[: len(live)]
    return anchor.astype(np.int32), swa.astype(np.int32)


def page_tokens(stream: np.ndarray, page: int, valid: int, pad_seed: int = 0) -> np.ndarray:
    """Tokens of `page` with the first `valid` from the stream and random padding after them."""
    t = np.random.default_rng(pad_seed).integers(0, 512, PAGE).astype(np.int32)
    t[:valid] = stream[page * PAGE: page * PAGE + valid]
    return t


def touched_pages(m, before: dict, after: dict) -> dict[str, set[int]]:
    """{pool: ids of pages whose bytes changed}."""
    out = {}
    for k in before:  # compare bytes: NaN garbage is not equal to itself
        diff = before[k].view(np.uint8) != after[k].view(np.uint8)
        out[k] = {int(p) for p in np.nonzero(diff.reshape(*diff.shape[:2], -1).any(axis=(0, 2)))[0]}
    return out


@dataclasses.dataclass
class Recorded:
    stream: np.ndarray
    anchor: np.ndarray
    swa: np.ndarray
    logits: list[np.ndarray]          # f32[PAGE, vocab] per call of CALLS
    pools_after: list[dict]           # host pools after each call


@functools.cache
def recorded(name: str) -> Recorded:
    m = model(name)
    stream = np.random.default_rng(11).integers(0, m.vocab_size, NUM_PAGES * PAGE).astype(np.int32)
    anchor, swa = tables(21, range(NUM_PAGES))
    pools = garbage_pools(m, seed=31)
    logits, after = [], []
    for i, (page, valid) in enumerate(CALLS):
        dev, lg = m.forward_chunk_all(device(pools), anchor, swa, page_tokens(stream, page, valid, pad_seed=i),
                                      page * PAGE, valid)
        new = host(dev)
        changed = touched_pages(m, pools, new)
        for spec in m.layout.byte_pools:
            allowed = {int(anchor[page])} if spec.allocator == "kv" else {int(swa[page])}
            assert changed[spec.name] <= allowed, (name, spec.name, i, changed[spec.name], allowed)
        pools = new
        logits.append(np.asarray(lg))
        after.append(pools)
    return Recorded(stream, anchor, swa, logits, after)


def restore(name: str, k: int, seed: int, fill: str = "random", corrupt: str | None = None):
    """(host pools, anchor, swa) holding only what a cache restores for a prefix of k pages.

    The first k anchor pages of every kv-indexed pool and SWA page k-1 of every SWA-indexed
    pool are copied from the recording to different page ids; everything else is garbage.
    `corrupt` names a pool whose copied pages get valid bytes of other pages instead.
    """
    m, rec = model(name), recorded(name)
    src = rec.pools_after[-1]
    pools = garbage_pools(m, seed=seed, fill=fill)
    anchor, swa = tables(seed + 1, range(k - 1, NUM_PAGES))
    for spec in m.layout.byte_pools:
        if spec.allocator == "kv":
            pairs = [(anchor[j], rec.anchor[j + (spec.name == corrupt)]) for j in range(k)]
        else:
            pairs = [(swa[k - 1], rec.swa[k - 1 + (spec.name == corrupt)])]
        for dst, s in pairs:
            pools[spec.name][:, dst] = src[spec.name][:, s]
    return pools, anchor, swa


def continue_from(name: str, pools: dict, anchor, swa, k: int, calls=None) -> list[np.ndarray]:
    """Logits f32[PAGE, vocab] of every recorded call on pages >= k, run on `pools`."""
    m, rec = model(name), recorded(name)
    out = []
    dev = device(pools)
    for i, (page, valid) in enumerate(CALLS):
        if page < k or (calls is not None and i not in calls):
            continue
        dev, lg = m.forward_chunk_all(dev, anchor, swa, page_tokens(rec.stream, page, valid, pad_seed=100 + i),
                                      page * PAGE, valid)
        out.append((i, np.asarray(lg)))
    return out
