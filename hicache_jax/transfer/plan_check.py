"""Validate a `TransferPlan` against an engine's layout and tier sizes, before anything moves.

This runs on every `start`, so it is vectorised numpy (tens of microseconds per batch).
"""
from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from hicache_jax.layout import PoolLayout
from hicache_jax.plan import Direction, PageBatch, TransferPlan


def check_plan(plan: TransferPlan, layout: PoolLayout, device_pages: Mapping[str, int],
               host_pages: Mapping[str, int]) -> None:
    """Raise ValueError naming the values unless `plan` fits this engine.

    Checks: the plan type and direction, one batch per allocator of this layout, the pools
    each batch names, page arrays (1-D integers, equal lengths, unique, in range of the
    tier sizes) and that `host_runs` tile the batch exactly. Allocators that carry no
    byte-holding pool are accepted and move nothing.
    """
    if not isinstance(plan, TransferPlan):
        raise ValueError(f"start() takes a TransferPlan, got {type(plan).__name__}")
    if not isinstance(plan.direction, Direction):
        raise ValueError(f"plan direction must be a Direction, got {plan.direction!r}")
    seen = set()
    for batch in plan.batches:
        if not isinstance(batch.allocator, str):
            raise ValueError(f"plan batch allocator must be a name (str), got {batch.allocator!r}")
        if batch.allocator in seen:
            raise ValueError(f"plan has two batches for allocator {batch.allocator!r}")
        seen.add(batch.allocator)
        _check_batch(batch, layout, device_pages, host_pages)


def _check_batch(batch: PageBatch, layout: PoolLayout, device_pages: Mapping[str, int],
                 host_pages: Mapping[str, int]) -> None:
    a = batch.allocator
    expected = layout.moving_names.get(a)
    if expected is None:
        raise ValueError(f"plan batch names {a!r}, not an allocator of this layout")
    if tuple(batch.pools) != expected:
        raise ValueError(f"plan batch {a!r} moves pools {list(batch.pools)}, the layout moves {list(expected)}")
    dev = _pages(batch.device_pages, a, "device")
    host = _pages(batch.host_pages, a, "host")
    if dev.shape != host.shape:
        raise ValueError(f"plan batch {a!r}: {dev.size} device pages but {host.size} host pages")
    if not expected or dev.size == 0:
        if batch.host_runs and dev.size == 0:
            raise ValueError(f"plan batch {a!r} has host runs but no pages")
        return
    _unique_in_range(dev, device_pages[a], a, "device")
    _unique_in_range(host, host_pages[a], a, "host")
    _check_runs(batch, host)


def _check_runs(batch: PageBatch, host: np.ndarray) -> None:
    """`host_runs` tile 0..n-1 in order and each names consecutive host pages."""
    if len(batch.host_runs) == 1:          # the common case, without building arrays
        run = batch.host_runs[0]
        if run.offset == 0 and run.length == host.size and host[0] == run.host_start and (
                host.size == 1 or (np.diff(host) == 1).all()):
            return
    runs = np.array([(r.offset, r.host_start, r.length) for r in batch.host_runs], np.int64).reshape(-1, 3)
    offsets, starts, lengths = runs[:, 0], runs[:, 1], runs[:, 2]
    tiled = (lengths > 0).all() and offsets[0] == 0 and (offsets[1:] == offsets[:-1] + lengths[:-1]).all() \
        and offsets[-1] + lengths[-1] == host.size if len(runs) else False
    if not tiled:
        raise ValueError(f"plan batch {batch.allocator!r}: host runs {list(batch.host_runs)} do not tile its "
                         f"{host.size} entries in order")
    # expected host page of every entry: its run's start plus its position in the run
    expected = np.repeat(starts - offsets, lengths) + np.arange(host.size)
    bad = np.flatnonzero(expected != host)
    if bad.size:
        raise ValueError(f"plan batch {batch.allocator!r}: host runs say entry {int(bad[0])} is host page "
                         f"{int(expected[bad[0]])}, host_pages say {int(host[bad[0]])}")


def _pages(values, allocator: str, tier: str) -> np.ndarray:
    arr = np.asarray(values)
    if arr.ndim != 1 or (arr.size and arr.dtype.kind not in "iu"):
        raise ValueError(f"{allocator} {tier} pages must be a 1-D integer array, got {arr.dtype}{list(arr.shape)}")
    return arr if arr.dtype == np.int32 else arr.astype(np.int64)


def _unique_in_range(arr: np.ndarray, capacity: int, allocator: str, tier: str) -> None:
    if 0 < arr.size <= 64:   # a small load: Python sets and ints beat numpy's reductions here
        pages = arr.tolist()
        if min(pages) >= 0 and max(pages) < capacity and len(set(pages)) == len(pages):
            return
    if arr.min() < 0 or arr.max() >= capacity:
        bad = arr[(arr < 0) | (arr >= capacity)]
        raise ValueError(f"{allocator} {tier} pages {bad[:8].tolist()} outside 0..{capacity - 1}")
    if arr.size > 1:
        s = np.sort(arr)
        dup = s[1:][s[1:] == s[:-1]]
        if dup.size:
            raise ValueError(f"{allocator} {tier} pages repeat: {np.unique(dup)[:8].tolist()}")
