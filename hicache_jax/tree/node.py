"""A radix-tree node: a page-aligned run of tokens and where its pages live on each tier."""
from __future__ import annotations

from typing import NewType

import numpy as np

from hicache_jax.tree.state import Event, Residency, transition

NodeId = NewType("NodeId", int)
ABSENT = -1  # inside the tree only: "no SWA page here" in a per-page SWA array


class Node:
    """One node. Arrays are per page of the node (`num_pages` entries).

    `device`/`host`: anchor pages of the FULL value on each tier (None when the state holds
    none). `swa_device`/`swa_host`: SWA pages per page, `ABSENT` where that page carries no
    SWA data (outside a sliding window); None for models without an SWA pool.
    `lock_ref` counts path locks held on this node or any descendant.
    """

    __slots__ = ("id", "parent", "children", "tokens", "state", "device", "host", "swa_device", "swa_host",
                 "lock_ref", "hit_count", "last_access", "write_id", "load_id")

    def __init__(self, node_id: int, parent: Node | None, tokens: np.ndarray, state: Residency):
        self.id = NodeId(node_id)
        self.parent = parent
        self.children: dict[bytes, Node] = {}
        self.tokens = tokens            # i32[num_pages * page_size]
        self.state = state
        self.device: np.ndarray | None = None
        self.host: np.ndarray | None = None
        self.swa_device: np.ndarray | None = None
        self.swa_host: np.ndarray | None = None
        self.lock_ref = 0
        self.hit_count = 0
        self.last_access = 0
        self.write_id: int | None = None  # pending backup ack id
        self.load_id: int | None = None   # the load-back that owns this node while in flight

    def __repr__(self) -> str:
        return f"Node({self.id}, {self.state.value}, {len(self.tokens)} tokens, lock={self.lock_ref})"

    def apply(self, event: Event) -> None:
        self.state = transition(self.state, event)

    def path_to_root(self):
        """This node, its parent, ... up to (excluding) the root."""
        node = self
        while node.parent is not None:
            yield node
            node = node.parent
