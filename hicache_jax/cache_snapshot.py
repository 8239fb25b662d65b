"""Whole-cache snapshots: the host tier's cached pages and the tree above them, for a
planned restart or a migration (orbax-checkpoint underneath, see `storage/snapshot.py`).

Saved: every node whose host copy is durable and reachable through host copies from the
root (device copies do not survive a restart), as its tokens, its parent, and per
allocator the rows of its pages, gathered into one array per allocator (no free rows).
Restored into an empty cache of the same layout: each node, parents first, gets fresh
host pages, its rows are written there, and it joins the tree host-only; a node the host
tier has no room for is left out with everything below it.
"""
from __future__ import annotations

import os

import numpy as np

from hicache_jax.storage.keys import layout_fingerprint


def save(cache, directory: str | os.PathLike[str], overwrite: bool = False) -> int:
    """Write `cache`'s host-resident prefixes to `directory`; returns the nodes saved."""
    from hicache_jax.storage.snapshot import save_snapshot
    cache.drain()
    core, page = cache._core, cache.layout.page_size
    ids = core.host_copies()
    index = {nid: i for i, nid in enumerate(ids)}
    tokens, nodes = [], []
    rows: dict[str, list[np.ndarray]] = {}
    used: dict[str, int] = {}
    for nid in ids:
        node, copy = core.node(nid), core.host_copy(nid)
        first = len(copy.tokens) // page - len(node.tokens) // page
        entry = {"parent": index.get(node.parent.id, -1), "tokens": len(node.tokens), "pages": {}}
        for allocator, host_pages in copy.host_pages.items():
            if host_pages.size == 0 or allocator not in cache._engine.host.formats:
                continue
            rows.setdefault(allocator, []).append(cache._engine.read_host_rows(allocator, host_pages))
            at = used.get(allocator, 0)
            entry["pages"][allocator] = {"logical": (copy.logical_pages[allocator] - first).tolist(), "row": at}
            used[allocator] = at + host_pages.size
        tokens.append(node.tokens)
        nodes.append(entry)
    buffers = {f"rows/{a}": np.concatenate(parts) for a, parts in rows.items()}
    buffers["tokens"] = np.concatenate(tokens) if tokens else np.zeros(0, np.int32)
    meta = {"fingerprint": layout_fingerprint(cache.layout, cache.config.storage.model_id), "nodes": nodes}
    save_snapshot(directory, buffers, meta, overwrite=overwrite)
    return len(nodes)


def restore(cache, directory: str | os.PathLike[str]) -> int:
    """Bring a snapshot back into `cache`, which must be empty; returns the nodes restored."""
    from hicache_jax.storage.snapshot import load_snapshot
    core, page = cache._core, cache.layout.page_size
    if core.tree.num_nodes:
        raise ValueError("restore_snapshot needs an empty cache (this one already holds prefixes)")
    snap = load_snapshot(directory)
    want = layout_fingerprint(cache.layout, cache.config.storage.model_id)
    if snap.metadata.get("fingerprint") != want:
        raise ValueError(f"snapshot {os.fspath(directory)} is of another layout or model "
                         f"(fingerprint {snap.metadata.get('fingerprint')}, this cache {want})")
    tokens, prefixes, restored, offset = snap.buffers["tokens"], [], 0, 0
    for entry in snap.metadata["nodes"]:
        own = tokens[offset:offset + entry["tokens"]]
        offset += entry["tokens"]
        parent = entry["parent"]
        prefix = None if parent >= 0 and prefixes[parent] is None else np.concatenate(
            ([] if parent < 0 else [prefixes[parent]]) + [own]).astype(np.int32)
        prefixes.append(prefix)
        if prefix is None:
            continue                    # its parent was left out
        start = len(prefix) // page - len(own) // page
        got = core.take_host({a: len(p["logical"]) for a, p in entry["pages"].items()})
        if got is None:
            prefixes[-1] = None
            continue
        for allocator, p in entry["pages"].items():
            old = snap.buffers[f"rows/{allocator}"][p["row"]:p["row"] + len(p["logical"])]
            if len(old):
                cache._engine.write_host_rows(allocator, got[allocator], old)
        logical = {a: start + np.asarray(p["logical"], np.int64) for a, p in entry["pages"].items()}
        first, end = core.attach_host(prefix, start, got, logical)
        if end - first != len(own) // page:
            prefixes[-1] = None
            continue
        restored += 1
    return restored

