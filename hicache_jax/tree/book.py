"""`TransferBook`: every transfer the tree has committed and not yet seen end.

Backups are committed node by node and *queued*; `take_queue` closes the queued copies
into one batch under one ack id (so one step's backups move as one transfer). A node
being written carries that ack id (`node.write_id`) until the batch is acknowledged or
failed; a load-back owns the nodes it fills (`node.load_id`). Records follow a node split:
the new head joins its node's transfers, and a queued copy is split between the two.
A node that leaves a write it is part of (dropped, or its closure repaired) either loses
its queued copy, or, once dispatched, leaves its host pages *retired* until the write
ends, because the copy may still land there.

This book is the one registry of transfers in flight: each record may carry what the data
plane moving it holds (`attach`: the engine's handles, a storage read), an opaque object
the tree never looks into, and which ends with the record.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from hicache_jax.plan import Direction
from hicache_jax.tree.node import Node
from hicache_jax.tree.results import AckId, LoadId, LockId, PrefetchId, TransferId
from hicache_jax.tree.state import WRITE_PENDING, Residency, Tier, TreeStateError


@dataclasses.dataclass(frozen=True)
class Copy:
    """One queued node copy: per component, the device and host page of each page of the
    node (ABSENT where a window component has none), captured at commit."""

    device: tuple[np.ndarray, ...]   # per component: i32[num_pages]
    host: tuple[np.ndarray, ...]

    def split(self, k: int) -> tuple["Copy", "Copy"]:
        return (Copy(tuple(a[:k] for a in self.device), tuple(a[:k] for a in self.host)),
                Copy(tuple(a[k:] for a in self.device), tuple(a[k:] for a in self.host)))


@dataclasses.dataclass
class WriteRecord:
    nodes: set[Node]                 # nodes stamped with this ack id (split halves included)
    locks: list[LockId]              # one device lock per committed node, released once the copy has read
    read: bool = False               # every copy is dispatched: later device work comes after its reads
    retired: dict[str, list[int]] = dataclasses.field(default_factory=dict)   # host pages freed at the end
    carrier: object = None           # what the data plane holds while it moves (`attach`)


@dataclasses.dataclass
class LoadRecord:
    lock: LockId                     # the load's own pin on its path, released when it ends
    filled_windows: dict[int, set[int]]   # window component -> device pages this load fills
    nodes: set[Node] = dataclasses.field(default_factory=set)       # nodes it owns (split halves included)
    drop_host: set[Node] = dataclasses.field(default_factory=set)   # closure repair when it ends
    carrier: object = None


@dataclasses.dataclass
class PrefetchRecord:
    lock: LockId                     # pins the node it will extend
    tokens: np.ndarray               # the prompt's whole pages
    start: int                       # first page fetched
    pages: int                       # pages asked for
    reserved: dict[str, np.ndarray]  # allocator -> host pages reserved (in fetch order)
    logical: dict[str, np.ndarray]   # allocator -> the logical page each reserved page receives
    carrier: object = None


class TransferBook:
    def __init__(self):
        self._open = AckId(1)
        self._writes: dict[AckId, WriteRecord] = {}
        self._queue: dict[Node, Copy] = {}
        self._loads: dict[LoadId, LoadRecord] = {}
        self._next_load = 1
        self._prefetches: dict[PrefetchId, PrefetchRecord] = {}
        self._next_prefetch = 1

    # -- writes ----------------------------------------------------------------------------
    def queue_write(self, node: Node, copy: Copy, lock: LockId | None) -> None:
        """Stamp `node` with the open batch's ack id and queue its copy."""
        node.write_id = self._open
        record = self._writes.setdefault(self._open, WriteRecord(set(), []))
        record.nodes.add(node)
        if lock is not None:
            record.locks.append(lock)
        self._queue[node] = copy

    def take_queue(self) -> tuple[AckId, list[tuple[Node, Copy]]] | None:
        """Close the queued copies into one batch, `(node, copy)` each (None when nothing is queued)."""
        if not self._queue:
            return None
        ack, copies = self._open, list(self._queue.items())
        self._queue.clear()
        self._open = AckId(self._open + 1)
        return ack, copies

    def discard_empty_open(self) -> list[LockId]:
        """The open batch lost every copy before dispatch: forget it; returns the locks it held."""
        record = self._writes.get(self._open)
        if record is None or record.nodes or self._queue:
            return []
        del self._writes[self._open]
        return record.locks

    def mark_read(self, ack: AckId) -> list[LockId]:
        """Batch `ack`'s copies have read their device pages: returns the locks it held for them."""
        if ack == self._open or ack not in self._writes:
            raise ValueError(f"no backup in flight with ack id {ack} (in flight: {self.pending_acks()})")
        record = self._writes[ack]
        record.read, locks, record.locks = True, record.locks, []
        return locks

    def copy_read(self, node: Node) -> bool:
        """`node`'s pending backup has read its device pages (`mark_read`)."""
        record = self._writes.get(node.write_id)
        return record is not None and record.read

    def end_write(self, ack: AckId) -> WriteRecord:
        if ack == self._open or ack not in self._writes:
            raise ValueError(f"no backup in flight with ack id {ack} (in flight: {self.pending_acks()})")
        record = self._writes.pop(ack)
        for node in record.nodes:
            node.write_id = None
        return record

    def leave_write(self, node: Node) -> dict[str, list[int]] | None:
        """`node` leaves its pending write. None if its copy was still queued (nothing will
        touch its host pages: free them); else the write's retired pages, where the caller
        puts the node's host pages, because the dispatched copy may still land there."""
        record = self._writes[node.write_id]
        record.nodes.discard(node)
        node.write_id = None
        return None if self._queue.pop(node, None) is not None else record.retired

    def pending_acks(self) -> list[AckId]:
        """Ack ids of dispatched batches not yet acknowledged or failed."""
        return sorted(a for a in self._writes if a != self._open)

    # -- loads -----------------------------------------------------------------------------
    def start_load(self, record: LoadRecord) -> LoadId:
        load_id = LoadId(self._next_load)
        self._next_load += 1
        self._loads[load_id] = record
        return load_id

    def own(self, node: Node, load_id: LoadId) -> None:
        if node.load_id not in (None, load_id):
            raise TreeStateError(f"bug: {node} claimed by load {load_id} while owned by load {node.load_id}")
        node.load_id = load_id
        self._loads[load_id].nodes.add(node)

    def load(self, load_id: LoadId) -> LoadRecord:
        return self._loads[load_id]

    def end_load(self, load_id: LoadId) -> LoadRecord:
        try:
            record = self._loads.pop(load_id)
        except KeyError:
            raise ValueError(f"no load-back in flight with id {load_id} (in flight: {sorted(self._loads)})") from None
        for n in record.nodes:
            n.load_id = None
        return record

    def filled_by_load(self, node: Node, component: int) -> np.ndarray:
        """Device pages of a window component that `node`'s load is filling."""
        return np.asarray(sorted(self._loads[node.load_id].filled_windows.get(component, ())), np.int32)

    def loads_in_flight(self) -> list[LoadId]:
        return sorted(self._loads)

    # -- prefetches (storage -> host) ---------------------------------------------------------
    def start_prefetch(self, record: PrefetchRecord) -> PrefetchId:
        pid = PrefetchId(self._next_prefetch)
        self._next_prefetch += 1
        self._prefetches[pid] = record
        return pid

    def end_prefetch(self, pid: PrefetchId) -> PrefetchRecord:
        try:
            return self._prefetches.pop(pid)
        except KeyError:
            raise ValueError(f"no prefetch in flight with id {pid} (in flight: {sorted(self._prefetches)})") from None

    def reserved(self, allocator: str) -> int:
        """Host pages of `allocator` reserved by prefetches in flight."""
        return sum(r.reserved[allocator].size for r in self._prefetches.values() if allocator in r.reserved)

    # -- everything ------------------------------------------------------------------------
    def _record(self, tid: TransferId) -> WriteRecord | LoadRecord | PrefetchRecord:
        match tid.direction:
            case Direction.BACKUP if tid.number != self._open:
                record = self._writes.get(AckId(tid.number))
            case Direction.LOAD:
                record = self._loads.get(LoadId(tid.number))
            case Direction.PREFETCH:
                record = self._prefetches.get(PrefetchId(tid.number))
            case _:
                record = None
        if record is None:
            raise ValueError(f"no transfer {tid} in flight")
        return record

    def attach(self, tid: TransferId, carrier: object) -> None:
        """Record what the data plane holds while it moves transfer `tid` (in flight)."""
        self._record(tid).carrier = carrier

    def carrier(self, tid: TransferId) -> object:
        """What `attach` recorded for `tid` (None: nothing yet); ValueError if it is not in flight."""
        return self._record(tid).carrier

    def in_flight(self) -> set[TransferId]:
        return ({TransferId(Direction.BACKUP, a) for a in self.pending_acks()}
                | {TransferId(Direction.LOAD, i) for i in self._loads}
                | {TransferId(Direction.PREFETCH, i) for i in self._prefetches})

    def is_in_flight(self, tid: TransferId) -> bool:
        """`tid in in_flight()`, without building the set (a load's wait asks once per request)."""
        if tid.direction is Direction.BACKUP:
            return tid.number != self._open and tid.number in self._writes
        return tid.number in (self._loads if tid.direction is Direction.LOAD else self._prefetches)

    def on_split(self, head: Node, node: Node, k: int) -> None:
        """`node` was split after `k` pages: the head joins its transfers and takes its share of a queued copy."""
        if head.write_id is not None:
            self._writes[head.write_id].nodes.add(head)
            copy = self._queue.pop(node, None)
            if copy is not None:
                self._queue[head], self._queue[node] = copy.split(k)
        if head.load_id is not None:
            self._loads[head.load_id].nodes.add(head)

    def retired(self) -> dict[tuple[Tier, str], list[int]]:
        """Host pages no node holds but a transfer in flight does: retired by writes, reserved
        by prefetches."""
        out: dict[tuple[Tier, str], list[int]] = {}
        for record in self._writes.values():
            for allocator, pages in record.retired.items():
                out.setdefault((Tier.HOST, allocator), []).extend(pages)
        for record in self._prefetches.values():
            for allocator, pages in record.reserved.items():
                out.setdefault((Tier.HOST, allocator), []).extend(pages.tolist())
        return out

    def check(self, nodes: list[Node]) -> None:
        loading = {n for r in self._loads.values() for n in r.nodes}
        for n in nodes:
            if (n.write_id is not None) != (n.state in WRITE_PENDING):
                _fail(f"{n}: write id {n.write_id} in state {n.state.value}")
            if n.write_id is not None and n not in self._writes.get(n.write_id, WriteRecord(set(), [])).nodes:
                _fail(f"{n}: write id {n.write_id} not recorded")
            if n.state is Residency.LOADING and n.load_id is None:
                _fail(f"{n} is LOADING without an owner")
            if (n.load_id is not None) != (n in loading):
                _fail(f"{n}: load id {n.load_id} does not match the loads in flight")
        for node in self._queue:
            if node.write_id != self._open:
                _fail(f"{node} has a queued copy but write id {node.write_id} (open batch {self._open})")
        flying = self.in_flight()
        for d, last in ((Direction.BACKUP, self._open), (Direction.LOAD, self._next_load),
                        (Direction.PREFETCH, self._next_prefetch)):
            for number in range(max(1, last - 64), last + 2):   # the newest ids, and two not issued
                tid = TransferId(d, number)
                if self.is_in_flight(tid) != (tid in flying):
                    _fail(f"{tid}: is_in_flight says {tid not in flying}, in_flight() says {tid in flying}")


def _fail(msg: str) -> None:
    raise TreeStateError(f"invariant violated: {msg}")
