"""Shared helpers for control-plane tests: layouts, token blocks, a tree core factory."""
import numpy as np

import hicache_jax as hc
from conftest import CONFIGS
from hicache_jax.tree import Tier, TreeCore

P = 256


def layout(name: str):
    return hc.build_layout(hc.load_model_config(CONFIGS / f"{name}.json"))


def core(name="tiny_v4", dev=8, host=16, swa_dev=8, swa_host=16, **kw) -> TreeCore:
    lay = layout(name)
    dpages, hpages = {"kv": dev}, {"kv": host}
    if lay.swa_pool is not None:     # "swa" (DeepSeek) or "gemma3_swa_kv": the layout names it
        dpages[lay.swa_pool.name], hpages[lay.swa_pool.name] = swa_dev, swa_host
    return TreeCore(lay, device_pages=dpages, host_pages=hpages, **kw)


def seq(*blocks: int) -> np.ndarray:
    """Tokens made of whole pages; page content depends only on its block id."""
    return np.concatenate([np.full(P, 1000 + b, np.int32) + np.arange(P, dtype=np.int32) for b in blocks])


def put(c: TreeCore, tokens: np.ndarray, swa_last: int = 1):
    """Allocate device pages for every page of `tokens` (SWA for the last `swa_last`) and insert."""
    n = len(tokens) // P
    need = {"kv": n}
    if swa_of(c) is not None:
        need[swa_of(c)] = min(swa_last, n)
    got = c.alloc_device(need)
    assert got is not None
    swa = {}
    if swa_of(c) is not None:
        swa = {n - len(got[swa_of(c)]) + i: int(p) for i, p in enumerate(got[swa_of(c)])}
    res = c.insert(tokens, got["kv"], {swa_of(c): swa} if swa else None)
    c.check_invariants()
    return res, got


def query(tokens: np.ndarray) -> np.ndarray:
    """A request whose prompt is `tokens` plus one more token (the cap keeps whole pages)."""
    return np.concatenate([tokens, np.asarray([7], np.int32)])


def swa_of(c: TreeCore) -> str | None:
    """The sliding-window allocator of `c`'s layout ("swa", "gemma3_swa_kv", ...), or None."""
    return c.components.windows[0].name if c.components.windows else None


def evict_device(c: TreeCore, pages: int, swa: int = 0):
    return c.evict_device({"kv": pages, **({swa_of(c): swa} if swa_of(c) else {})})


def evict_host(c: TreeCore, pages: int, swa: int = 0) -> int:
    return c.evict_host({"kv": pages, **({swa_of(c): swa} if swa_of(c) else {})})


def device_allocs(c: TreeCore):
    return c.ledger.allocators(Tier.DEVICE)


def host_allocs(c: TreeCore):
    return c.ledger.allocators(Tier.HOST)


# a node's pages: anchor and SWA, on device and host
def dev(node):
    return node.pages[Tier.DEVICE][0]


def host(node):
    return node.pages[Tier.HOST][0]


def swa_dev(node):
    return node.pages[Tier.DEVICE][1] if len(node.pages[Tier.DEVICE]) > 1 else None


def swa_host(node):
    return node.pages[Tier.HOST][1] if len(node.pages[Tier.HOST]) > 1 else None
