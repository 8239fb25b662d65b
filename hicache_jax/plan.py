"""`TransferPlan`: which pages move between the tiers, the only thing the data plane is given.

Control plane: pure Python + numpy, never imports jax.

A plan moves pages of one or more *allocators* (the anchor `kv`, the independent `swa`).
Every pool that holds bytes and is addressed by that allocator moves with it, page for
page: kv-sidecar page p is anchor page p (rows `p * rows_per_page ...`, i.e. `slot //
ratio`), and swa-state page p holds the ring rows of SWA page p. Entries are sorted by host
page and contiguous host pages are coalesced into runs, because each host DMA costs
microseconds whatever its size:

    device_pages  [ 7  3  9  4 | 12 ]
    host_pages    [20 21 22 23 | 40 ]
    host_runs     (offset 0, host 20, 4 pages), (offset 4, host 40, 1 page)
"""
from __future__ import annotations

import dataclasses
import enum
import functools
from collections.abc import Iterable, Mapping, Sequence

import numpy as np

from hicache_jax.layout import PoolLayout, PoolSpec


class Direction(enum.StrEnum):
    BACKUP = "backup"      # device -> host
    LOAD = "load"          # host -> device
    PREFETCH = "prefetch"  # storage -> host (L3 -> L2; no TransferPlan: the storage tier moves it)


@dataclasses.dataclass(frozen=True)
class HostRun:
    """`length` plan entries from `offset` sit at host pages `host_start ...` in order."""

    offset: int
    host_start: int
    length: int


@dataclasses.dataclass(frozen=True, eq=False)
class PageBatch:
    """The pages of one allocator in a plan, with every pool that moves with them."""

    allocator: str
    pools: tuple[str, ...]        # byte-holding pools addressed by `allocator`, registration order
    device_pages: np.ndarray      # i32[n], unique, in [0, device page count)
    host_pages: np.ndarray        # i32[n], unique, ascending, in [0, host page count)
    host_runs: tuple[HostRun, ...]

    @functools.cached_property
    def num_pages(self) -> int:
        return int(self.device_pages.shape[0])


@dataclasses.dataclass(frozen=True, eq=False)
class TransferPlan:
    """A batch of page moves in one direction, per allocator (sorted by allocator name)."""

    direction: Direction
    batches: tuple[PageBatch, ...]

    @property
    def is_empty(self) -> bool:
        return all(b.num_pages == 0 for b in self.batches)

    def batch(self, allocator: str) -> PageBatch | None:
        return next((b for b in self.batches if b.allocator == allocator), None)

    def num_pages(self, allocator: str) -> int:
        b = self.batch(allocator)
        return b.num_pages if b else 0

    def pool_pages(self, pool: str) -> tuple[np.ndarray, np.ndarray] | None:
        """(device pages, host pages) of `pool` in this plan, or None if it does not move."""
        for b in self.batches:
            if pool in b.pools:
                return b.device_pages, b.host_pages
        return None

    def pool_bytes(self, layout: PoolLayout) -> dict[str, int]:
        """Bytes each moving pool contributes (all layers, all TP ranks)."""
        out = {}
        for b in self.batches:
            for name in b.pools:
                p = layout.pool(name)
                out[name] = b.num_pages * p.num_layers * p.page_bytes
        return out

    def nbytes(self, layout: PoolLayout) -> int:
        return sum(self.pool_bytes(layout).values())


def coalesce(host_pages: np.ndarray, run_starts: np.ndarray | None = None) -> tuple[HostRun, ...]:
    """Runs of consecutive host pages in an ascending array; a page of `run_starts` (if
    given) always starts a run of its own (a backup's node boundaries: each node's pages
    become host blocks of their own, so a later hit on one node moves whole blocks)."""
    if host_pages.size == 0:
        return ()
    cut = run_starts is not None and run_starts.size > 0
    if not cut and int(host_pages[-1]) - int(host_pages[0]) == host_pages.size - 1:   # one run
        return (HostRun(0, int(host_pages[0]), int(host_pages.size)),)
    gaps = np.diff(host_pages) != 1
    if cut:
        gaps |= np.isin(host_pages[1:], run_starts)
    breaks = np.flatnonzero(gaps) + 1
    starts = np.concatenate(([0], breaks))
    ends = np.concatenate((breaks, [host_pages.size]))
    return tuple(HostRun(int(s), int(host_pages[s]), int(e - s)) for s, e in zip(starts, ends))


def make_plan(
    layout: PoolLayout,
    direction: Direction | str,
    pages: Mapping[str, tuple[Iterable[int], Iterable[int]]],
    *,
    device_capacity: Mapping[str, int] | None = None,
    host_capacity: Mapping[str, int] | None = None,
    validate: bool = True,
    run_starts: Mapping[str, np.ndarray] | None = None,
) -> TransferPlan:
    """Build a validated plan from `{allocator: (device pages, host pages)}`.

    Raises ValueError (naming the values) for an unknown allocator, unequal lengths,
    negative, duplicate or out-of-capacity pages. Allocators that carry no byte-holding
    pool (a lone anchor) still appear: their pages are bookkeeping only. `validate=False`
    (the tree, whose ledger hands out each page once) takes i32 arrays as they are and
    leaves the page checks to the engine, which makes them before anything moves.
    `run_starts`: `{allocator: host pages}` where a host run must start (`coalesce`).
    """
    direction = direction if isinstance(direction, Direction) else Direction(direction)
    batches = []
    for allocator in sorted(pages):
        spec = _allocator_spec(layout, allocator)
        if validate:
            dev = _as_pages(pages[allocator][0], f"{allocator} device pages")
            host = _as_pages(pages[allocator][1], f"{allocator} host pages")
        else:
            dev, host = np.asarray(pages[allocator][0], np.int32), np.asarray(pages[allocator][1], np.int32)
        if dev.shape != host.shape:
            raise ValueError(f"{allocator}: {dev.size} device pages but {host.size} host pages")
        if host.size > 1:   # ascending host pages (one page needs no sort)
            order = np.argsort(host, kind="stable")
            dev, host = dev[order], host[order]
        if validate:
            _check_unique_in_range(np.sort(dev), f"{allocator} device pages", (device_capacity or {}).get(allocator))
            _check_unique_in_range(host, f"{allocator} host pages", (host_capacity or {}).get(allocator))
        pools = layout.moving_names[spec.name]
        batches.append(PageBatch(allocator, pools, dev, host, coalesce(host, (run_starts or {}).get(allocator))))
    return TransferPlan(direction, tuple(batches))


def split_plan(plan: TransferPlan, layout: PoolLayout, max_bytes: int) -> list[TransferPlan]:
    """`plan` cut into plans of at most `max_bytes` each (at least one page each), one
    allocator per piece, in plan order (host pages ascending); `[plan]` if it fits."""
    if max_bytes < 1:
        raise ValueError(f"max_bytes must be >= 1, got {max_bytes}")
    if plan.nbytes(layout) <= max_bytes:
        return [plan]
    pieces = []
    for b in plan.batches:
        if b.num_pages == 0:
            continue
        per_page = layout.page_bytes_of(b.allocator)
        step = max(1, max_bytes // per_page) if per_page else b.num_pages
        for lo in range(0, b.num_pages, step):
            dev, host = b.device_pages[lo:lo + step], b.host_pages[lo:lo + step]
            starts = np.array([r.host_start for r in b.host_runs], np.int64)    # the batch's run cuts stay
            pieces.append(TransferPlan(plan.direction, (PageBatch(b.allocator, b.pools, dev, host,
                                                                  coalesce(host, starts)),)))
    return pieces


def merge_plans(plans: Sequence[TransferPlan]) -> TransferPlan:
    """One plan moving every page of `plans` (of one direction): per allocator, their
    batches as one, its entries sorted by host page and coalesced again, as `make_plan`
    builds from the union. Several requests' load-backs so go to the engine as one start.

        plan A  kv: device [7 3]  host [20 21]        merged kv: device [7 3 9 4]
        plan B  kv: device [9 4]  host [22 40]                   host   [20 21 22 40]
                                                      runs (0, 20, 3), (3, 40, 1)

    Allocators stay sorted by name (one batch each); a lone plan comes back as it is. Each
    request keeps its own plan for its bookkeeping: the merged one only moves the bytes.
    Raises ValueError for no plans, mixed directions, or a page (device or host) that two
    plans both move: the merged plan would write it twice.
    """
    plans = list(plans)
    if not plans:
        raise ValueError("merge_plans needs at least one plan")
    direction = plans[0].direction
    if any(p.direction is not direction for p in plans):
        raise ValueError(f"merge_plans takes plans of one direction, got {sorted({p.direction.value for p in plans})}")
    if len(plans) == 1:
        return plans[0]
    parts: dict[str, list[PageBatch]] = {}
    for p in plans:
        for b in p.batches:
            parts.setdefault(b.allocator, []).append(b)
    batches = []
    for allocator in sorted(parts):
        group = parts[allocator]
        pools = group[0].pools
        if any(b.pools != pools for b in group):
            raise ValueError(f"merge_plans: batches of {allocator!r} move different pools: "
                             f"{sorted({b.pools for b in group})}")
        dev = np.concatenate([np.asarray(b.device_pages, np.int32) for b in group])
        host = np.concatenate([np.asarray(b.host_pages, np.int32) for b in group])
        order = np.argsort(host, kind="stable")
        dev, host = dev[order], host[order]
        for pages, tier in ((np.sort(dev), "device"), (host, "host")):
            if pages.size > 1 and (repeats := pages[1:][pages[1:] == pages[:-1]]).size:
                raise ValueError(f"merge_plans: {allocator} {tier} pages {np.unique(repeats).tolist()} "
                                 f"are in more than one plan")
        batches.append(PageBatch(allocator, pools, dev, host, coalesce(host)))
    return TransferPlan(direction, tuple(batches))


def _allocator_spec(layout: PoolLayout, allocator: str) -> PoolSpec:
    try:
        spec = layout.pool(allocator)
    except KeyError:
        raise ValueError(f"plan names allocator {allocator!r}, not a pool of this layout") from None
    if not spec.has_allocator:
        raise ValueError(f"plan names pool {allocator!r} ({spec.kind}), which has no allocator; "
                         f"its pages follow {spec.allocator!r}")
    return spec


def _as_pages(values: Iterable[int], what: str) -> np.ndarray:
    arr = values if isinstance(values, np.ndarray) else np.asarray(list(values))
    if arr.size == 0:
        return np.zeros((0,), np.int32)
    if arr.ndim != 1 or not np.issubdtype(arr.dtype, np.integer):
        raise ValueError(f"{what} must be a 1-D sequence of integers, got {arr.dtype} of shape {arr.shape}")
    if arr.min() < 0 or arr.max() > np.iinfo(np.int32).max:
        raise ValueError(f"{what} out of range: {arr.tolist()}")
    return arr.astype(np.int32)


def _check_unique_in_range(ascending: np.ndarray, what: str, capacity: int | None) -> None:
    """`ascending`: the pages, sorted (a sort is needed anyway; np.unique would sort again)."""
    if ascending.size > 1:
        repeats = ascending[1:][ascending[1:] == ascending[:-1]]
        if repeats.size:
            raise ValueError(f"{what} repeat: {np.unique(repeats).tolist()}")
    if capacity is not None and ascending.size and ascending[-1] >= capacity:
        raise ValueError(f"{what} {ascending[ascending >= capacity].tolist()} outside 0..{capacity - 1}")
