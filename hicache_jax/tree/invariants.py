"""`check_invariants(core)`: recompute every law of the tree core from scratch.

Raises `TreeStateError` naming the first violation. O(nodes + pages): for tests and debug
runs, never on a hot path.
"""
from __future__ import annotations

from collections import Counter

import numpy as np

from hicache_jax.tree.node import ABSENT
from hicache_jax.tree.policy import WritePolicy
from hicache_jax.tree.state import (DEVICE_VALID, HOLDS_DEVICE, HOLDS_HOST, WRITE_PENDING, Residency,
                                    TreeStateError)


def _fail(msg: str) -> None:
    raise TreeStateError(f"invariant violated: {msg}")


def check_invariants(core) -> None:
    page = core.page_size
    nodes = list(core.tree.nodes())
    if len(nodes) != core.tree.num_nodes or len(core._by_id) != len(nodes) + 1:
        _fail(f"node count: walk {len(nodes)}, counter {core.tree.num_nodes}, by_id {len(core._by_id) - 1}")
    expected_lock = Counter()
    for holder in core._locks.values():
        for n in holder.path_to_root():
            expected_lock[n.id] += 1

    # pages by (tier, allocator, category)
    owned: dict[tuple[str, str], dict[str, list]] = {}

    def own(tier, allocator, category, pages):
        owned.setdefault((tier, allocator), {}).setdefault(category, []).extend(np.asarray(pages).tolist())

    in_flight_loads = {n for rec in core._loads.values() for n in rec.nodes}
    for n in nodes:
        _check_structure(core, n, page)
        st = n.state
        if st is Residency.GONE:
            _fail(f"{n} is GONE but still in the tree")
        if (n.device is not None) != (st in HOLDS_DEVICE):
            _fail(f"{n}: device pages {'present' if n.device is not None else 'missing'} in state {st.value}")
        if (n.host is not None) != (st in HOLDS_HOST):
            _fail(f"{n}: host pages {'present' if n.host is not None else 'missing'} in state {st.value}")
        k = len(n.tokens) // page
        for arr, what in ((n.device, "device"), (n.host, "host"), (n.swa_device, "swa_device"), (n.swa_host, "swa_host")):
            if arr is not None and len(arr) != k:
                _fail(f"{n}: {what} has {len(arr)} entries for {k} pages")
        if core.swa is None and (n.swa_device is not None or n.swa_host is not None):
            _fail(f"{n}: SWA pages in a layout without an SWA pool")
        if n.swa_device is not None and n.device is None:
            _fail(f"{n}: SWA device pages without FULL device pages")
        if n.swa_host is not None and n.host is None:
            _fail(f"{n}: SWA host pages without FULL host pages")
        parent = n.parent
        if st in HOLDS_DEVICE and parent.parent is not None and parent.state not in HOLDS_DEVICE:
            _fail(f"device coverage is not a prefix: {n} holds device pages, its parent {parent} does not")
        if (n.write_id is not None) != (st in WRITE_PENDING):
            _fail(f"{n}: write id {n.write_id} in state {st.value}")
        if n.write_id is not None and (n.write_id not in core._writes or n not in core._writes[n.write_id].nodes):
            _fail(f"{n}: write id {n.write_id} not recorded")
        if st is Residency.LOADING and n.load_id is None:
            _fail(f"{n} is LOADING without an owner")
        if (n.load_id is not None) != (n in in_flight_loads):
            _fail(f"{n}: load id {n.load_id} does not match the in-flight loads")
        if (core.policy is not WritePolicy.WRITE_BACK and st in HOLDS_HOST and n.load_id is None
                and parent.parent is not None and parent.state not in HOLDS_HOST):
            _fail(f"write-through closure: {n} is backed up, its parent {parent} is not")
        if n.lock_ref != expected_lock[n.id]:
            _fail(f"{n}: lock count {n.lock_ref}, locks held below it {expected_lock[n.id]}")
        # page ownership
        if n.device is not None:
            own("device", core.anchor, "in_flight" if st is Residency.LOADING else "cached", n.device)
        if n.host is not None:
            own("host", core.anchor, "in_flight" if st in WRITE_PENDING else "cached", n.host)
        if n.swa_device is not None:
            present = n.swa_device[n.swa_device != ABSENT]
            loading = np.isin(present, list(core._loads[n.load_id].swa_assigned)) if n.load_id else np.zeros(present.size, bool)
            own("device", core.swa, "in_flight", present[loading])
            own("device", core.swa, "cached", present[~loading])
        if n.swa_host is not None:
            own("host", core.swa, "in_flight" if st in WRITE_PENDING else "cached", n.swa_host[n.swa_host != ABSENT])
    for write in core._writes.values():
        for allocator, pages in write.zombie_host.items():
            own("host", allocator, "in_flight", pages)
    for allocator, held in core._held.items():
        own("device", allocator, "held", sorted(held))
    for tier, allocs in (("device", core.device), ("host", core.host)):
        for alloc in allocs:
            cats = owned.get((tier, alloc.name), {})
            free = alloc.free_pages().tolist()
            everything = free + [p for pages in cats.values() for p in pages]
            counts = {c: len(v) for c, v in cats.items()}
            if len(everything) != alloc.capacity or len(set(everything)) != alloc.capacity:
                dup = [p for p, c in Counter(everything).items() if c > 1][:8]
                _fail(f"{tier} {alloc.name}: free {len(free)} + {counts} != capacity {alloc.capacity}"
                      + (f"; pages owned twice: {dup}" if dup else ""))
    _check_lru(core, nodes)


def _check_structure(core, n, page: int) -> None:
    if len(n.tokens) == 0 or len(n.tokens) % page:
        _fail(f"{n}: {len(n.tokens)} tokens, not a positive multiple of page {page}")
    parent = n.parent
    if parent.children.get(core.tree.key(n.tokens)) is not n:
        _fail(f"{n} is not its parent's child under its first page")
    if core._by_id.get(n.id) is not n:
        _fail(f"{n} is not registered under its id")
    if n.state in DEVICE_VALID and parent.parent is not None and parent.state not in DEVICE_VALID \
            and parent.state is not Residency.LOADING:
        _fail(f"{n} valid on device under {parent}")


def _check_lru(core, nodes) -> None:
    # every candidate has an entry, stamped no later than its last access (lru.py re-files)
    dev = {n.id: s for s, n in sorted(core.device_lru.entries(), key=lambda e: e[0])}
    host = {n.id: s for s, n in sorted(core.host_lru.entries(), key=lambda e: e[0])}
    swa = {n.id: s for s, n in sorted(core.swa_lru.entries(), key=lambda e: e[0])}
    for n in nodes:
        for heap, candidate, what in ((swa, core.swa is not None and core._swa_evictable(n), "SWA"),
                                      (dev, core._device_evictable(n), "device"),
                                      (host, core._host_evictable(n), "host")):
            if candidate and heap.get(n.id, n.last_access + 1) > n.last_access:
                _fail(f"{n} is a {what} eviction candidate missing from the {what} LRU")
