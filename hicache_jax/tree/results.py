"""Named results and reasons the tree core hands to its caller, and the ids it hands out."""
from __future__ import annotations

import dataclasses
import enum
from collections import Counter
from typing import NewType

import numpy as np

from hicache_jax.plan import Direction, TransferPlan
from hicache_jax.tree.node import NodeId

AckId = NewType("AckId", int)     # one merged backup transfer
LoadId = NewType("LoadId", int)   # one load-back
PrefetchId = NewType("PrefetchId", int)   # one storage -> host prefetch


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
    NO_HOST_TIER = "no_host_tier"        # the cache has no host tier (host_pages=0)


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


class PrefetchOutcome(enum.StrEnum):
    """How a storage -> host prefetch ended (or why it did not start)."""

    LANDED = "landed"                    # every page fetched and attached to the tree
    PARTIAL = "partial"                  # fewer pages than asked arrived; the usable part was attached
    USELESS = "useless"                  # nothing usable arrived, or the tree already had it
    FAILED = "failed"                    # the read failed (counted by the storage tier too)
    NO_HOST_SPACE = "no_host_space"      # refused: the host tier (or the prefetch share of it) is full
    UNBACKED_PREFIX = "unbacked_prefix"  # refused: the prefix it extends has no host copy (write-through)
    STALE = "stale"                      # refused: the tree changed since the lookup


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
    prefetches: Counter = dataclasses.field(default_factory=Counter)  # PrefetchOutcome -> prefetches
    loads_started: int = 0
    loads_failed: int = 0
    backups_failed: int = 0
    backups_without_room: int = 0     # commits the host had no room for


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
    (i32[length / page]); `window_pages`: per window allocator, its device pages of the
    prefix's trailing window; `lock`: the caller's pin on that prefix, held until the
    caller unlocks it."""

    load_id: LoadId
    plan: TransferPlan
    node: NodeId
    length: int
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


@dataclasses.dataclass(frozen=True, eq=False)
class PrefetchJob:
    """A started prefetch: fetch the prompt's pages `start .. start + pages` from storage
    into the reserved host pages, per allocator, in order: `host_pages[a][i]` receives
    logical page `logical_pages[a][i]` (the anchor: every page; a window allocator: the
    trailing window of the stop `start + pages`). End it with `finish_prefetch`."""

    prefetch_id: PrefetchId
    start: int
    pages: int
    host_pages: dict[str, np.ndarray]
    logical_pages: dict[str, np.ndarray]

    @property
    def transfer(self) -> TransferId:
        return TransferId(Direction.PREFETCH, self.prefetch_id)


@dataclasses.dataclass(frozen=True, eq=False)
class HostCopy:
    """A node's durable host copy, as the storage tier needs it: `tokens` from the root to
    the node's end (whole pages), and per allocator the logical pages of the node it holds
    and their host pages."""

    tokens: np.ndarray
    logical_pages: dict[str, np.ndarray]
    host_pages: dict[str, np.ndarray]
