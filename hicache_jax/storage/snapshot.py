"""Whole-cache snapshots with orbax-checkpoint: the host tier's buffers plus JSON metadata.

For planned restarts and migrations: save the host buffers and the tree metadata that
says what they hold, start a new process, restore both, and serve warm. Unlike L3 this is
one directory per snapshot, read back whole, not per-page objects.

    save_snapshot("/ckpt/step1", {"kv": kv_rows, "swa": swa_rows}, {"tree": ...})
    snap = load_snapshot("/ckpt/step1")                       # numpy arrays
    snap = load_snapshot("/ckpt/step1", shardings={"kv": pinned_sharding, ...})   # jax arrays there

Buffers may be numpy arrays or jax arrays (pinned-host ones included: orbax reads them
through their sharding and restores to any sharding asked for, on CPU as on GPU). A
restore yields new arrays: a host tier adopts them in place of its buffers (or copies
them in). orbax writes into a temporary directory and renames it when complete, so a
crash mid-save leaves no half snapshot under `directory`.
"""
from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp

FORMAT = 1


@dataclasses.dataclass(frozen=True)
class Snapshot:
    buffers: Mapping[str, Any]        # name -> np.ndarray, or jax.Array where a sharding was given
    metadata: Mapping[str, Any]


def save_snapshot(directory: str | os.PathLike[str], buffers: Mapping[str, Any], metadata: Mapping[str, Any],
                  overwrite: bool = False) -> None:
    """Write `buffers` (name -> array) and JSON-able `metadata` to a new `directory`."""
    path = os.path.abspath(os.fspath(directory))
    if os.path.exists(path) and not overwrite:
        raise ValueError(f"snapshot directory {path} exists; pass overwrite=True to replace it")
    if not buffers or not all(isinstance(k, str) for k in buffers):
        raise ValueError(f"buffers must be a non-empty mapping of str names to arrays, got keys {list(buffers)}")
    for name, array in buffers.items():
        if not isinstance(array, (np.ndarray, jax.Array)):
            raise ValueError(f"buffer {name!r} must be a numpy or jax array, got {type(array).__name__}")
    described = {name: {"shape": list(a.shape), "dtype": str(a.dtype)} for name, a in buffers.items()}
    meta = {"format": FORMAT, "buffers": described, "metadata": metadata}
    try:
        json.dumps(meta)
    except TypeError as e:
        raise ValueError(f"snapshot metadata must be JSON-serialisable: {e}") from None
    stored = {name: a for name, a in buffers.items() if a.size}   # orbax refuses empty arrays: the metadata says them
    items = {"meta": ocp.args.JsonSave(meta)}
    if stored:
        items["buffers"] = ocp.args.PyTreeSave(stored)
    with ocp.Checkpointer(ocp.CompositeCheckpointHandler()) as ckptr:
        ckptr.save(path, args=ocp.args.Composite(**items), force=overwrite)


def load_snapshot(directory: str | os.PathLike[str],
                  shardings: Mapping[str, jax.sharding.Sharding] | None = None) -> Snapshot:
    """Read a snapshot; buffers named in `shardings` come back as jax arrays placed there."""
    path = os.path.abspath(os.fspath(directory))
    if not os.path.isdir(path):
        raise ValueError(f"no snapshot at {path}")
    with ocp.Checkpointer(ocp.CompositeCheckpointHandler()) as ckptr:
        meta = ckptr.restore(path, args=ocp.args.Composite(meta=ocp.args.JsonRestore())).meta
        if not isinstance(meta, dict) or meta.get("format") != FORMAT:
            raise ValueError(f"{path} is not a hicache snapshot of format {FORMAT}")
        shardings = dict(shardings or {})
        unknown = sorted(set(shardings) - set(meta["buffers"]))
        if unknown:
            raise ValueError(f"shardings name buffers {unknown} the snapshot lacks (it has {sorted(meta['buffers'])})")
        target, restore_args, empty = {}, {}, {}
        for name, d in meta["buffers"].items():
            shape = tuple(d["shape"])
            if not np.prod(shape):
                empty[name] = np.empty(shape, d["dtype"])
                if name in shardings:
                    empty[name] = jax.device_put(empty[name], shardings[name])
            elif name in shardings:
                target[name] = jax.ShapeDtypeStruct(shape, d["dtype"], sharding=shardings[name])
                restore_args[name] = ocp.ArrayRestoreArgs(sharding=shardings[name])
            else:
                target[name] = np.empty(shape, d["dtype"])
                restore_args[name] = ocp.RestoreArgs(restore_type=np.ndarray)
        restored = ckptr.restore(path, args=ocp.args.Composite(
            buffers=ocp.args.PyTreeRestore(target, restore_args=restore_args))).buffers if target else {}
    return Snapshot({**dict(restored), **empty}, meta["metadata"])
