"""Per-node residency laws: what each state holds, on which tier, and device coverage.

The other laws live with the collaborator that guarantees them (`RadixTree.check`,
`PageLedger.check`, `LockTable.check`, `TransferBook.check`, `EvictionCandidates.check`,
`WritePath.check`); `TreeCore.check_invariants` runs them all. O(nodes + pages): for tests
and debug runs, never on a hot path.
"""
from __future__ import annotations

from hicache_jax.tree.components import Components
from hicache_jax.tree.node import Node
from hicache_jax.tree.state import DEVICE_VALID, HOLDS, HOLDS_DEVICE, Residency, Tier, TreeStateError


def _fail(msg: str) -> None:
    raise TreeStateError(f"invariant violated: {msg}")


def check_nodes(components: Components, nodes: list[Node]) -> None:
    for n in nodes:
        st, parent = n.state, n.parent
        if st is Residency.GONE:
            _fail(f"{n} is GONE but still in the tree")
        for tier in Tier:
            row = n.pages[tier]
            holds = st in HOLDS[tier]
            if (row[0] is not None) != holds:
                _fail(f"{n}: {tier.name.lower()} pages {'present' if row[0] is not None else 'missing'} "
                      f"in state {st.value}")
            for c in components:
                arr = row[c.index]
                if (arr is not None) != holds:
                    _fail(f"{n}: {c.name} {tier.name.lower()} pages must be present exactly when the anchor's are")
                if arr is not None and row[0] is not None and len(arr) != len(row[0]):
                    _fail(f"{n}: {c.name} {tier.name.lower()} pages: {len(arr)} entries for {len(row[0])} pages")
        if parent.parent is None:
            continue
        if st in HOLDS_DEVICE and parent.state not in HOLDS_DEVICE:
            _fail(f"device coverage is not a prefix: {n} holds device pages, its parent {parent} does not")
        if st in DEVICE_VALID and parent.state not in DEVICE_VALID and parent.state is not Residency.LOADING:
            _fail(f"{n} valid on device under {parent}")
