"""`Matcher`: the longest usable prefix of a prompt, on device and on either tier.

Walk the tree along the prompt (capped: one token is always recomputed). The anchor's
coverage is the run of nodes holding it (on device: a valid device copy; on either tier:
a durable host copy too). Each window component then moves the boundary down to the
largest one whose trailing window it covers (`best_boundary`); with several window
components the boundary must satisfy all of them. The node a boundary falls in is split
so boundaries are node ends, and every matched node's LRU stamp is refreshed.
"""
from __future__ import annotations

import numpy as np

from hicache_jax.tree.components import Component, Components
from hicache_jax.tree.lru import LogicalClock
from hicache_jax.tree.match import MatchResult, as_tokens, best_boundary, cap_tokens
from hicache_jax.tree.node import ABSENT, Node
from hicache_jax.tree.radix import RadixTree
from hicache_jax.tree.state import DEVICE, DEVICE_VALID, HOST, HOST_DURABLE, Residency, TreeStateError

_EMPTY = np.zeros((0,), np.int32)
_REACHABLE = frozenset({Residency.HOST, Residency.LOADING}) | DEVICE_VALID


class Matcher:
    def __init__(self, tree: RadixTree, components: Components, clock: LogicalClock):
        self._tree, self._components, self._clock = tree, components, clock
        self._windows = components.windows
        self._page = tree.page_size

    def match(self, tokens, touch: bool = True) -> MatchResult:
        """Longest usable prefix of `tokens` on device, and how much more the host has.
        Splits the node a boundary falls in; never allocates or frees. `touch=False`: the
        matched nodes keep their LRU stamps (a look ahead, not a use)."""
        tokens = as_tokens(tokens)
        page = self._page
        path = [(n, m) for n, m in self._tree.walk(tokens[:cap_tokens(len(tokens), page)]) if m]
        dev_cov = any_cov = pending = 0
        writes = set()
        for i, (node, matched) in enumerate(path):
            valid = node.state in DEVICE_VALID
            if not (valid or node.state in _REACHABLE):
                for n, m in path[i:]:       # host copies still being written, right where it stops
                    if n.state is not Residency.HOST_PENDING:
                        break
                    pending += m // page * page
                    writes.add(n.write_id)
                del path[i:]
                break
            if valid and dev_cov == any_cov:
                dev_cov += matched // page
            any_cov += matched // page
        if self._windows:
            dev_b = self._boundary(path, dev_cov, host=False)
            all_b = dev_b if dev_b == any_cov else max(dev_b, self._boundary(path, any_cov, host=True))
        else:
            dev_b, all_b = dev_cov, any_cov
        chain = self._cut(path, [dev_b * page, all_b * page])
        dev_chain = chain[:_count_until(chain, dev_b * page)]
        if touch:
            now = self._clock.tick()
            for n in chain:         # LRU heaps re-file touched nodes lazily (see lru.py)
                n.last_access = now
        root = self._tree.root
        dev_pages, windows = self.device_tables(dev_chain)
        first = windows[self._windows[0].name] if self._windows else _EMPTY
        return MatchResult(dev_b * page, (all_b - dev_b) * page, dev_pages, first,
                           (dev_chain[-1] if dev_chain else root).id, (chain[-1] if chain else root).id, pending,
                           windows, frozenset(writes))

    def loads_along(self, tokens) -> set[int]:
        """Ids of the loads in flight that own a node along the usable part of `tokens`'
        path: a match of `tokens` would change once they land. Changes nothing."""
        tokens = as_tokens(tokens)
        path = self._tree.walk(tokens[:cap_tokens(len(tokens), self._page)])
        return {n.load_id for n, m in path if m and n.load_id is not None}

    def anchor_pages_ahead(self, tokens: np.ndarray) -> np.ndarray | None:
        """The anchor's host pages a load of `tokens`' match would most likely move: those of
        the host-only nodes along its path after its device-valid ones (None: none). A look
        ahead for early copies, cheaper than `match`: no window boundary, no split, no LRU
        touch; a load its windows cut shorter copies what it does not use."""
        page, pages = self._page, []
        for node, matched in self._tree.walk(tokens[:cap_tokens(len(tokens), page)]):
            if not pages and node.state in DEVICE_VALID:
                continue
            if node.state is not Residency.HOST or node.load_id is not None or matched < page:
                break
            host = node.pages[HOST][0]
            pages.append(host if matched == len(node.tokens) else host[:matched // page])
        if not pages:
            return None
        return pages[0] if len(pages) == 1 else np.concatenate(pages)

    def _boundary(self, path: list[tuple[Node, int]], limit: int, host: bool) -> int:
        """Largest boundary <= limit (pages) whose trailing window every window component covers."""
        b, settled, windows = limit, 0, self._windows
        while settled < len(windows):       # until each has accepted the current boundary
            for c in windows:
                nb = best_boundary(self._present_desc(path, b, c, host), b, c.window_pages)
                settled = 1 if nb < b else settled + 1
                b = nb
                if settled >= len(windows):
                    break
        return b

    def _present_desc(self, path: list[tuple[Node, int]], limit: int, c: Component, host: bool):
        """Presence of `c`'s pages limit-1 ... 0 along `path`, on device (or on either tier)."""
        page, start, k = self._page, sum(m for _, m in path) // self._page, c.index
        for node, matched in reversed(path):
            start -= matched // page
            dev = node.pages[DEVICE][k] if node.state in DEVICE_VALID and node.load_id is None else None
            hst = node.pages[HOST][k] if host and node.state in HOST_DURABLE else None
            for i in range(matched // page - 1, -1, -1):
                if start + i < limit:
                    yield bool((dev is not None and dev[i] != ABSENT) or (hst is not None and hst[i] != ABSENT))

    def _cut(self, path: list[tuple[Node, int]], cuts: list[int]) -> list[Node]:
        """Nodes from the root to the deepest cut, split so every cut (tokens, ascending) ends a node."""
        chain, pos = [], 0
        cuts = [c for c in cuts if c > 0]
        for node, _ in path:
            if not cuts:
                break
            end = pos + len(node.tokens)
            while cuts and cuts[0] < end:           # a cut inside this node: split its head off
                chain.append(self._tree.split(node, cuts[0] - pos))
                pos = cuts.pop(0)
                while cuts and cuts[0] == pos:
                    cuts.pop(0)
            if cuts:
                chain.append(node)
                pos = end
                while cuts and cuts[0] == pos:
                    cuts.pop(0)
        return chain

    def device_tables(self, chain: list[Node]) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """(anchor device pages of `chain`, per window component its device pages of the
        trailing window, oldest first)."""
        if not chain:
            return _EMPTY, {c.name: _EMPTY for c in self._windows} if self._windows else {}
        # a copy either way: callers get these arrays and must not reach the nodes' own
        dev = chain[0].pages[DEVICE][0].astype(np.int32) if len(chain) == 1 else \
            np.concatenate([n.pages[DEVICE][0] for n in chain]).astype(np.int32, copy=False)
        windows = {}
        for c in self._windows:
            want = min(c.window_pages, dev.size)
            got, need = [], want                     # walking back from the end
            for n in reversed(chain):
                got[:0] = n.pages[DEVICE][c.index][-need:].tolist()
                need = want - len(got)
                if need <= 0:
                    break
            got = got[-want:] if want else []
            if ABSENT in got:
                raise TreeStateError(f"bug: matched window of {chain[-1]} lacks {c.name} device pages: {got}")
            windows[c.name] = np.asarray(got, np.int32) if got else _EMPTY
        return dev, windows


def _count_until(chain: list[Node], length: int) -> int:
    """How many leading nodes of `chain` make up `length` tokens."""
    total = i = 0
    while total < length:
        total += len(chain[i].tokens)
        i += 1
    return i
