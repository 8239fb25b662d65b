"""The token radix tree as a structure: walk, split, add, remove. No policy lives here.

Nodes hold page-aligned runs; a child is keyed by the tokens of its first page, so one
dict lookup per node finds the only candidate, and a vectorised compare of the node's
tokens finds how many whole pages match:

    root ── [a b | c d] ── [e f]        walk([a b c d x y]) -> (node1, 4 tokens), (node2, 0)
                       └── [x y | z w]                      stops: node "x y z w" matches
                                                            1 page of 2 -> (node3, 2 tokens)
"""
from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np

from hicache_jax import validate
from hicache_jax.tree.node import Node, NodeId
from hicache_jax.tree.state import Residency, TreeStateError

_EMPTY = np.zeros((0,), np.int32)


class RadixTree:
    """Nodes by token prefix and by id. `on_split` hooks run after every split, so whoever
    keeps records of nodes (transfers in flight, eviction candidates) follows the new head."""

    def __init__(self, page_size: int, num_components: int):
        self.page_size = page_size
        self.num_components = num_components
        self._next_id = 1
        self.root = Node(0, None, _EMPTY, Residency.SYNCED, num_components)  # holds nothing; its state is never read
        self.num_nodes = 0  # excluding the root
        self._by_id: dict[int, Node] = {0: self.root}
        self.on_split: list[Callable[[Node, Node, int], None]] = []   # (head, node, head pages)

    def node(self, node_id: NodeId) -> Node:
        try:
            return self._by_id[validate.count("node id", node_id)]
        except KeyError:
            raise ValueError(f"node {node_id} is not in the tree (evicted or never existed)") from None

    def get(self, node_id: int) -> Node | None:
        return self._by_id.get(node_id)

    def key(self, tokens: np.ndarray, pos: int = 0) -> bytes:
        return tokens[pos:pos + self.page_size].tobytes()

    def walk(self, tokens: np.ndarray) -> list[tuple[Node, int]]:
        """Nodes along `tokens` from the root, each with how many of its tokens match.

        Every entry but the last matches its node completely. `len(tokens)` must be a
        multiple of page_size (callers truncate).
        """
        path: list[tuple[Node, int]] = []
        node, pos, n, page = self.root, 0, len(tokens), self.page_size
        while pos < n:
            child = node.children.get(tokens[pos:pos + page].tobytes())
            if child is None:
                break
            span = min(len(child.tokens), n - pos)
            # the key matched the first page; one compare settles the rest
            if _same(child.tokens[page:span], tokens[pos + page:pos + span]):
                matched = span
            else:
                diff = np.flatnonzero(child.tokens[:span] != tokens[pos:pos + span])
                matched = int(diff[0]) // page * page
            path.append((child, matched))
            if matched < len(child.tokens):
                break
            node, pos = child, pos + matched
        return path

    def split(self, node: Node, num_tokens: int) -> Node:
        """Split `node` after `num_tokens` (page-aligned, inside it); return the new parent.

        `node` keeps the suffix, so references to it (locks, owners) still name the
        deepest part; the new parent copies its state, ids, lock count and its share of
        every page array.
        """
        page = self.page_size
        if num_tokens <= 0 or num_tokens >= len(node.tokens) or num_tokens % page:
            raise AssertionError(f"bug: split of {node} at {num_tokens} tokens")
        k = num_tokens // page
        parent = node.parent
        head = Node(self._new_id(), parent, node.tokens[:num_tokens], node.state, self.num_components)
        for head_tier, tier in zip(head.pages, node.pages):
            for c, arr in enumerate(tier):
                if arr is not None:
                    head_tier[c], tier[c] = arr[:k].copy(), arr[k:].copy()
        head.lock_ref, head.hit_count, head.last_access = node.lock_ref, node.hit_count, node.last_access
        head.write_id, head.load_id = node.write_id, node.load_id
        parent.children[self.key(head.tokens)] = head
        node.tokens = node.tokens[num_tokens:]
        node.parent = head
        head.children[self.key(node.tokens)] = node
        self._register(head)
        for hook in self.on_split:
            hook(head, node, k)
        return head

    def add(self, parent: Node, tokens: np.ndarray, state: Residency) -> Node:
        key = self.key(tokens)
        if key in parent.children:
            raise AssertionError(f"bug: {parent} already has a child for this page")
        node = Node(self._new_id(), parent, tokens, state, self.num_components)
        parent.children[key] = node
        self._register(node)
        return node

    def remove(self, node: Node) -> None:
        if node.children or node.parent is None:
            raise AssertionError(f"bug: remove of {node} with children or of the root")
        del node.parent.children[self.key(node.tokens)]
        del self._by_id[node.id]
        self.num_nodes -= 1

    def _register(self, node: Node) -> None:
        self._by_id[node.id] = node
        self.num_nodes += 1

    def nodes(self) -> Iterator[Node]:
        """Every node but the root, parents before children."""
        stack = list(self.root.children.values())
        while stack:
            node = stack.pop()
            yield node
            stack.extend(node.children.values())

    def prefix_len(self, node: Node) -> int:
        """Tokens from the root to the end of `node`."""
        return sum(len(n.tokens) for n in node.path_to_root())

    def check(self) -> None:
        """Structure: every node registered, its parent's child under its first page, whole pages."""
        nodes = list(self.nodes())
        if len(nodes) != self.num_nodes or len(self._by_id) != len(nodes) + 1:
            raise TreeStateError(f"invariant violated: node count: walk {len(nodes)}, counter {self.num_nodes}, "
                                 f"by id {len(self._by_id) - 1}")
        for n in nodes:
            if len(n.tokens) == 0 or len(n.tokens) % self.page_size:
                raise TreeStateError(f"invariant violated: {n}: {len(n.tokens)} tokens, not whole pages of {self.page_size}")
            if n.parent.children.get(self.key(n.tokens)) is not n:
                raise TreeStateError(f"invariant violated: {n} is not its parent's child under its first page")
            if self._by_id.get(n.id) is not n:
                raise TreeStateError(f"invariant violated: {n} is not registered under its id")

    def _new_id(self) -> int:
        self._next_id += 1
        return self._next_id - 1


_COPY_COMPARE_MAX = 1 << 14   # tokens: below, two byte copies and a memcmp are the cheapest compare


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    """Equal token runs of equal length; long runs are compared in place (no copies)."""
    if a.size <= _COPY_COMPARE_MAX:
        return a.tobytes() == b.tobytes()
    return bool(np.array_equal(a, b))
