"""Layer groups: the model's layers cut into `n` consecutive ranges, for loads a step overlaps.

With `layer_groups = n`, the host tier keeps each page's bytes as `n` parts, part g holding
the layers of group g of every pool (`RowFormat.parts`), so a model step can move group
g's part inside its jit while it computes the groups before it (`transfer/landing.py`).

    model layers   0 1 2 3 | 4 5 6 7 | 8 9 10        groups of 11 layers, n = 3
    pool slots     a pool's slots are its owning layers (`PoolSpec.layers`), so a group is
                   a run of consecutive slots of each pool (possibly none)

A layer may read storage another layer owns (V4: `kv_source`, `index_keys`), always an
earlier one; `needed_group(layer)` is the last group a layer reads, the group that must
have landed before it runs.
"""
from __future__ import annotations

from hicache_jax.layout.pool import PoolLayout, PoolSpec


def num_model_layers(layout: PoolLayout) -> int:
    return max(layout.model.num_hidden_layers, 1 + max((max(p.layers, default=-1) for p in layout.pools), default=-1))


def check_groups(layout: PoolLayout, groups: int) -> int:
    """`groups`, or ValueError when it is not an int in 1 .. the model's layers."""
    layers = num_model_layers(layout)
    if isinstance(groups, bool) or not isinstance(groups, int) or not 1 <= groups <= layers:
        raise ValueError(f"layer_groups must be an int in 1..{layers} (the model's layers), got {groups!r}")
    return groups


def bounds(layout: PoolLayout, groups: int) -> tuple[int, ...]:
    """The `groups + 1` model-layer bounds: group g is layers `bounds[g] .. bounds[g+1]-1`."""
    layers = num_model_layers(layout)
    check_groups(layout, groups)
    return tuple(g * layers // groups for g in range(groups + 1))


def slots(pool: PoolSpec, lo: int, hi: int) -> tuple[int, int]:
    """(first slot, slots) of `pool` owned by model layers `lo .. hi-1`."""
    inside = [i for i, layer in enumerate(pool.layers) if lo <= layer < hi]
    return (inside[0], len(inside)) if inside else (0, 0)


def group_of(layout: PoolLayout, groups: int, layer: int) -> int:
    b = bounds(layout, groups)
    for g in range(groups):
        if b[g] <= layer < b[g + 1]:
            return g
    raise ValueError(f"layer {layer} is outside the model's {b[-1]} layers")


def needed_groups(layout: PoolLayout, groups: int) -> tuple[int, ...]:
    """Per model layer, the last group whose storage it reads (its own, or an earlier layer's)."""
    b = bounds(layout, groups)
    group = [g for g in range(groups) for _ in range(b[g], b[g + 1])]
    need = list(group)
    for info in layout.layers:
        for source in (info.kv_source, info.index_source, info.index_keys):
            if source is not None and 0 <= info.layer < len(need):
                need[info.layer] = max(need[info.layer], group[source])
    return tuple(need)
