"""A radix-tree node: a page-aligned run of tokens and where its pages live on each tier."""
from __future__ import annotations

from typing import NewType

import numpy as np

from hicache_jax.tree.state import Event, Residency, Tier, transition

NodeId = NewType("NodeId", int)
ABSENT = -1  # inside the tree only: "no page of this window component here" in a per-page array
_TIERS = range(len(Tier))


class Node:
    """One node.

    `pages[tier][component]`: i32[num_pages] page ids of each component (see
    components.py) on each tier, or None. The anchor's (component 0) are present exactly
    when the state holds that tier; a window component's array is present alongside it and
    holds `ABSENT` for the pages outside every window. Only the `PageLedger` changes them.
    `lock_ref` counts path locks held on this node or any descendant.
    """

    __slots__ = ("id", "parent", "children", "tokens", "state", "pages", "lock_ref", "hit_count", "last_access",
                 "write_id", "load_id")

    def __init__(self, node_id: int, parent: Node | None, tokens: np.ndarray, state: Residency, num_components: int):
        self.id = NodeId(node_id)
        self.parent = parent
        self.children: dict[bytes, Node] = {}
        self.tokens = tokens            # i32[num_pages * page_size]
        self.state = state
        self.pages: tuple[list[np.ndarray | None], ...] = tuple([None] * num_components for _ in _TIERS)
        self.lock_ref = 0
        self.hit_count = 0
        self.last_access = 0
        self.write_id: int | None = None  # the pending backup (ack id) that writes its host copy
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

    def present(self, tier: Tier, component: int) -> int:
        """Pages of `component` this node holds on `tier`."""
        arr = self.pages[tier][component]
        return 0 if arr is None else int(arr.size if component == 0 else np.count_nonzero(arr != ABSENT))
