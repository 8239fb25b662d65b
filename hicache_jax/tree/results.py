"""Named results and reasons the tree core hands to its caller, and the ids it hands out."""
from __future__ import annotations

import dataclasses
import enum
from collections import Counter
from typing import NewType

import numpy as np

from hicache_jax.plan import Direction, TransferPlan
from hicache_jax.tree.node import NodeId
from hicache_jax.tree.state import Tier

AckId = NewType("AckId", int)     # one merged backup transfer
LoadId = NewType("LoadId", int)   # one load-back


@dataclasses.dataclass(frozen=True)
class TransferId:
    """A transfer the tree has committed: a backup batch (by ack id) or a load-back."""

    direction: Direction
    number: int

    def __str__(self) -> str:           # "backup:3", "load:7": how StepReport names it
        return f"{self.direction.value}:{self.number}"


class DropReason(enum.StrEnum):
    """Why device KV tokens were destroyed without a host copy."""

    WRITE_THROUGH_UNBACKED_EVICTION = "write_through_unbacked_eviction"
    HOST_PRESSURE = "host_pressure"      # a write-back backup found no host space
    BACKUP_FAILED = "backup_failed"      # the device->host transfer raised after demotion


class Refusal(enum.StrEnum):
    """Why a load-back did not start (the request recomputes instead)."""

    EMPTY = "empty"                      # nothing to move
    BELOW_THRESHOLD = "below_threshold"  # fewer FULL tokens than max(1, load_back_threshold), no window transfer
    OWNED = "owned"                      # another in-flight load-back owns a node of it
    PENDING = "pending"                  # its host copy is still being written
    STALE = "stale"                      # the tree changed since the match
    NO_DEVICE_SPACE = "no_device_space"  # device pages could not be found, even after eviction
    NOT_WORTH_IT = "not_worth_it"        # the cost model says recomputing is faster
    FAILED = "failed"                    # the transfer raised at start


@dataclasses.dataclass(frozen=True)
class LockId:
    value: int


@dataclasses.dataclass
class TreeStats:
    """What the tree core counts (the cache turns it into metrics)."""

    dropped: Counter = dataclasses.field(default_factory=Counter)    # (allocator, DropReason) -> tokens
    evicted: Counter = dataclasses.field(default_factory=Counter)    # Tier -> anchor tokens evicted from it
    refusals: Counter = dataclasses.field(default_factory=Counter)   # Refusal -> load-backs not started
    tombstoned: Counter = dataclasses.field(default_factory=Counter)  # window allocator -> device pages freed
    loads_started: int = 0
    loads_failed: int = 0
    backups_failed: int = 0
    backups_without_room: int = 0     # commits the host had no room for

    def evicted_tokens(self, tier: Tier) -> int:
        return self.evicted[tier]


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

    ack_id: AckId
    plan: TransferPlan
    tokens: int   # FULL tokens covered

    @property
    def transfer(self) -> TransferId:
        return TransferId(Direction.BACKUP, self.ack_id)


@dataclasses.dataclass(frozen=True, eq=False)
class LoadJob:
    """A started load-back. `device_pages`: anchor device pages of the whole matched prefix
    (i32[total_len / page]); `window_pages`: per window allocator, its device pages of the
    prefix's trailing window; `lock`: the caller's pin on that prefix, held until the
    caller unlocks it."""

    load_id: LoadId
    plan: TransferPlan
    node: NodeId
    total_len: int
    loaded_tokens: int   # FULL tokens moved
    device_pages: np.ndarray
    window_pages: dict[str, np.ndarray]
    lock: LockId

    @property
    def transfer(self) -> TransferId:
        return TransferId(Direction.LOAD, self.load_id)


@dataclasses.dataclass(frozen=True)
class EvictResult:
    device_pages: int    # anchor device pages freed
    swa_pages: int       # window-allocator device pages freed (all window allocators)
    dropped_tokens: int  # device tokens destroyed without a host copy (by this call)
