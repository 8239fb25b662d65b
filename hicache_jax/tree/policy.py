"""Write policies and the named results the tree core hands to its caller."""
from __future__ import annotations

import dataclasses
import enum

import numpy as np

from hicache_jax.plan import TransferPlan
from hicache_jax.tree.node import NodeId


class WritePolicy(enum.StrEnum):
    WRITE_THROUGH = "write_through"                      # back up on the first hit
    WRITE_THROUGH_SELECTIVE = "write_through_selective"  # back up on the second hit
    WRITE_BACK = "write_back"                            # back up only when evicted from device

    @property
    def default_threshold(self) -> int | None:
        return {"write_through": 1, "write_through_selective": 2, "write_back": None}[self.value]


class DropReason(enum.StrEnum):
    """Why device KV tokens were destroyed without a host copy."""

    WRITE_THROUGH_UNBACKED_EVICTION = "write_through_unbacked_eviction"
    HOST_PRESSURE = "host_pressure"      # a write-back backup found no host space
    BACKUP_FAILED = "backup_failed"      # the device->host transfer raised after demotion


class Refusal(enum.StrEnum):
    """Why a load-back did not start (the request recomputes instead)."""

    EMPTY = "empty"                      # nothing to move
    BELOW_THRESHOLD = "below_threshold"  # fewer FULL tokens than max(1, load_back_threshold), no SWA transfer
    OWNED = "owned"                      # another in-flight load-back owns a node of it
    PENDING = "pending"                  # its host copy is still being written
    STALE = "stale"                      # the tree changed since the match
    NO_DEVICE_SPACE = "no_device_space"  # device pages could not be found, even after eviction
    NOT_WORTH_IT = "not_worth_it"        # the cost model says recomputing is faster
    FAILED = "failed"                    # the transfer raised at start


@dataclasses.dataclass(frozen=True)
class LockId:
    value: int


@dataclasses.dataclass(frozen=True, eq=False)
class InsertResult:
    """`node`: the deepest node now holding the inserted prefix on device.

    `cached_len`: tokens of the request's prefix now in the tree on device (may stop short
    of the request when a node on the path is in flight); `new_len`: of those, tokens that
    were not in the tree before.
    """

    node: NodeId
    cached_len: int
    new_len: int


@dataclasses.dataclass(frozen=True, eq=False)
class BackupBatch:
    """Merged backups to dispatch as one transfer; acknowledge with `ack_id`."""

    ack_id: int
    plan: TransferPlan
    tokens: int   # FULL tokens covered


@dataclasses.dataclass(frozen=True, eq=False)
class LoadJob:
    """A started load-back. `device_pages`: anchor device pages of the whole matched prefix
    (i32[total_len / page]); `swa_pages`: SWA device pages of its trailing window; `lock`:
    the caller's pin on that prefix, held until the caller unlocks it."""

    load_id: int
    plan: TransferPlan
    node: NodeId
    total_len: int
    loaded_tokens: int   # FULL tokens moved
    device_pages: np.ndarray
    swa_pages: np.ndarray
    lock: LockId


@dataclasses.dataclass(frozen=True)
class EvictResult:
    device_pages: int    # anchor device pages freed
    swa_pages: int       # SWA device pages freed
    dropped_tokens: int  # device tokens destroyed without a host copy (by this call)
