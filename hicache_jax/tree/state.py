"""Per-node residency as one state machine: an enum of states and one transition table.

A node's FULL value (its anchor pages, and with them every kv-sidecar row) lives on the
device tier, the host tier, or both; transfers between them are explicit states, so "is it
backed up", "may I reclaim its host slots", "may I match it" are read off the state
instead of a set of flags.

    DEVICE --commit_backup--> BACKING_UP --ack--> SYNCED --evict_device--> HOST --evict_host--> GONE
      |  ^                          |                  ^  |                  |  ^
      |  +------backup_failed-------+                  |  +--drop_host--> DEVICE (closure repair)
      |                             | evict_device     |                  |  |
      drop --> GONE                 v (write-back)     load_done   start_load  load_failed
                              HOST_PENDING --ack--> HOST   ^              v  |
                                    |                      +---------- LOADING
                                    drop (its backup failed: data lost) --> GONE
    HOST --adopt_device--> SYNCED   (a request recomputed the pages of a host-only node)
"""
from __future__ import annotations

import enum


class Tier(enum.IntEnum):
    """Levels of memory that own pages, fastest first; a node's pages are indexed by tier."""

    DEVICE = 0     # L1: accelerator memory
    HOST = 1       # L2: pinned host memory


# The same tiers as plain ints, to index `node.pages` on hot paths: indexing with an IntEnum
# member costs about twice what an int does.
DEVICE, HOST = int(Tier.DEVICE), int(Tier.HOST)


class Residency(enum.Enum):
    DEVICE = "device"              # device pages only; not backed up
    BACKING_UP = "backing_up"      # device pages + host pages; the host copy is still in flight
    SYNCED = "synced"              # device pages + a durable host copy
    HOST = "host"                  # a durable host copy only
    HOST_PENDING = "host_pending"  # host pages only, copy in flight (write-back demotion)
    LOADING = "loading"            # durable host copy + device pages being filled
    GONE = "gone"                  # removed from the tree

    __hash__ = object.__hash__     # members are singletons: identity hashing, in C (hot path)


class Event(enum.Enum):
    COMMIT_BACKUP = "commit_backup"
    ACK = "ack"
    BACKUP_FAILED = "backup_failed"
    EVICT_DEVICE = "evict_device"
    START_LOAD = "start_load"
    LOAD_DONE = "load_done"
    LOAD_FAILED = "load_failed"
    EVICT_HOST = "evict_host"
    ADOPT_DEVICE = "adopt_device"
    DROP_HOST = "drop_host"
    DROP = "drop"


R, E = Residency, Event
TRANSITIONS: dict[tuple[Residency, Event], Residency] = {
    (R.DEVICE, E.COMMIT_BACKUP): R.BACKING_UP,
    (R.DEVICE, E.DROP): R.GONE,                  # unbacked data destroyed: counted as dropped
    (R.BACKING_UP, E.ACK): R.SYNCED,
    (R.BACKING_UP, E.BACKUP_FAILED): R.DEVICE,
    (R.BACKING_UP, E.EVICT_DEVICE): R.HOST_PENDING,
    (R.SYNCED, E.EVICT_DEVICE): R.HOST,
    (R.SYNCED, E.DROP_HOST): R.DEVICE,           # an ancestor's backup failed: keep the closure
    (R.HOST, E.START_LOAD): R.LOADING,
    (R.HOST, E.EVICT_HOST): R.GONE,
    (R.HOST, E.ADOPT_DEVICE): R.SYNCED,
    (R.HOST, E.DROP): R.GONE,
    (R.HOST_PENDING, E.ACK): R.HOST,
    (R.HOST_PENDING, E.DROP): R.GONE,
    (R.LOADING, E.LOAD_DONE): R.SYNCED,
    (R.LOADING, E.LOAD_FAILED): R.HOST,
}

# Which tier's pages a state holds. LOADING holds device pages that are not valid yet.
HOLDS_DEVICE = frozenset({R.DEVICE, R.BACKING_UP, R.SYNCED, R.LOADING})
DEVICE_VALID = frozenset({R.DEVICE, R.BACKING_UP, R.SYNCED})
HOLDS_HOST = frozenset({R.BACKING_UP, R.SYNCED, R.HOST, R.HOST_PENDING, R.LOADING})
HOST_DURABLE = frozenset({R.SYNCED, R.HOST, R.LOADING})
WRITE_PENDING = frozenset({R.BACKING_UP, R.HOST_PENDING})
HOLDS = {Tier.DEVICE: HOLDS_DEVICE, Tier.HOST: HOLDS_HOST}   # states holding pages on each tier


class TreeStateError(RuntimeError):
    """Broken internal state of the tree core: always a bug, never a caller mistake."""


def transition(state: Residency, event: Event) -> Residency:
    try:
        return TRANSITIONS[(state, event)]
    except KeyError:
        raise TreeStateError(f"bug: illegal transition: event {event.value!r} in state {state.value!r}") from None
