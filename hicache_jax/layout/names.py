"""Vocabulary of the layout: pool names, pool kinds, hit policies, placements.

All are `StrEnum`s, so `spec.kind == "anchor"` reads naturally and JSON/metric labels are
the plain strings.
"""
from __future__ import annotations

import enum


class PoolName(enum.StrEnum):
    """Every pool name the HiCache paths know (DeepSeek V4/V4.1, GQA, Gemma 3).

    Not all are registered on every path: see `UNREGISTERED` for the names that exist but
    never get storage here (ROCm unified-KV rope pools, the never-needed C128 state, and
    the DSpark draft pools that cannot be backed up).
    """

    KV = "kv"
    SWA = "swa"
    # DeepSeek V4 (ratios 4 and 128)
    C4 = "deepseek_v4_c4"
    C4_INDEXER = "deepseek_v4_c4_indexer"
    C4_ROPE = "deepseek_v4_c4_rope"
    C128 = "deepseek_v4_c128"
    C128_ROPE = "deepseek_v4_c128_rope"
    C4_STATE = "deepseek_v4_c4_state"
    C4_INDEXER_STATE = "deepseek_v4_c4_indexer_state"
    C128_STATE = "deepseek_v4_c128_state"
    # DeepSeek V4.1 (ratios 1 and 2)
    C1 = "deepseek_v4_c1"
    C1_INDEXER = "deepseek_v4_c1_indexer"
    C1_INDEXER_SCALE = "deepseek_v4_c1_indexer_scale"
    C2 = "deepseek_v4_c2"
    C2_INDEXER = "deepseek_v4_c2_indexer"
    C2_INDEXER_SCALE = "deepseek_v4_c2_indexer_scale"
    # DSpark speculative draft (V4.1): request-scoped, never backed up
    DRAFT = "draft"
    DRAFT_INDEXER = "draft_indexer"
    DRAFT_SWA = "draft_swa"
    # plain attention models: the K/V bytes ride on the anchor's slots
    GQA_KV = "gqa_kv"
    # Gemma 3 hybrid attention: full-attention layers' K/V ride on the anchor's slots,
    # sliding-window layers' K/V live in their own window-resident pool
    GEMMA3_GLOBAL_KV = "gemma3_global_kv"
    GEMMA3_SWA_KV = "gemma3_swa_kv"


# Names that exist but are never registered by `build_layout`, with the reason.
UNREGISTERED: dict[PoolName, str] = {
    PoolName.C4_ROPE: "ROCm unified-KV layout only",
    PoolName.C128_ROPE: "ROCm unified-KV layout only",
    PoolName.C128_STATE: "page_size % 128 == 0: it only ever holds an unfinished chunk, recomputed on load",
    PoolName.DRAFT: "DSpark draft KV is request-scoped and cannot be backed up",
    PoolName.DRAFT_INDEXER: "DSpark draft KV is request-scoped and cannot be backed up",
    PoolName.DRAFT_SWA: "DSpark draft KV is request-scoped and cannot be backed up",
}


class PoolKind(enum.StrEnum):
    ANCHOR = "anchor"            # owns page-aligned slots, holds no bytes
    INDEPENDENT = "independent"  # owns slots (own allocator) and bytes
    KV_SIDECAR = "kv_sidecar"    # bytes at rows derived from the anchor: row = slot // ratio
    SWA_STATE = "swa_state"      # bytes at the ring rows of an SWA page; no allocator at all


class HitPolicy(enum.StrEnum):
    ALL_PAGES = "all_pages"            # every page of a hit must be present
    TRAILING_PAGES = "trailing_pages"  # only the trailing window must be present


class Placement(enum.StrEnum):
    REPLICATED = "replicated"  # identical on every TP rank: one host copy per host
    TP = "tp"                  # sharded across TP ranks: each rank keeps its own shard
