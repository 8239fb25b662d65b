"""`Landing`: a load-back whose bytes the model's own step moves, layer group by layer group.

A blocking load-back moves a prefix before the model's first step can start. A *deferred*
one (`HiCache.load_back(match, deferred=True)`) dispatches nothing for one whole anchor
block it would move (the largest of a landing size, `TransferEngine.landing_sizes`; the
rest moves at once); it returns a `Landing` instead: a pytree of that pinned block (one
array per layer group, `RowFormat.parts`) and the device pages it goes to. The
serving loop passes it into its jitted step, which lands each group just before the
first layer that reads it:

    @partial(jax.jit, donate_argnums=0, compiler_options=step_compiler_options())
    def step(pools, x, landing):
        schedule = landing.schedule()
        for layer in range(num_layers):
            pools, x = schedule.before_layer(layer, pools, x)
            x, pools = model_layer(layer, x, pools)
        return schedule.finish(pools), x

Inside the jit, `before_layer` moves a group's blocks with `jax.device_put(block, Device)`
(a whole pinned array: a DMA on a copy engine, beside the compute) and scatters them into
the group's layers of the pools. The copies run `lead` groups ahead: group g + lead starts
once the activations `x` of group g - 1 exist (`lax.optimization_barrier`), which keeps
XLA's scheduler from bunching every copy before the first layer (BENCHMARKS.md, "Layer-wise
overlap"). The bytes land exactly as a blocking load writes them.

Compile the step with `compiler_options=step_compiler_options()` (and every program whose
logits are compared with it, e.g. the same step without a landing): on NVIDIA GPUs, XLA's
Triton GEMM fusions tile and fuse a matmul differently depending on the ops around it, so a
step carrying a landing rounded its logits differently from the same step without one
(2026-12-05, H200: every landed byte right, the logits off in the last bits); with cuBLAS
GEMMs the two agree bit for bit (BENCHMARKS.md, "Landing arithmetic on the H200").

After the step, `HiCache.set_device_pools(pools, landed=landing)` tells the cache; the
load completes when that step has run. A landing never passed to a step is landed by
`wait`, `drain` or any call that waits for transfers (`TransferEngine.land`). A landing
belongs to one load: once its load has completed or failed (`step()` says which), its
device pages may hold other data, and it must not be passed to a step again.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence

import jax

_DEVICE = jax.memory.Space.Device

# XLA options that keep a step's arithmetic independent of the landing it carries, per platform
_EXACT_OPTIONS: dict[str, dict[str, object]] = {"gpu": {"xla_gpu_enable_triton_gemm": False}}


def step_compiler_options(platform: str | None = None) -> dict[str, object]:
    """`jax.jit(..., compiler_options=...)` for a step that lands a deferred load, and for
    every program whose bits are compared with it (module docstring). `platform`: "gpu",
    "cpu", "tpu"; default the platform of jax's first device."""
    if platform is None:
        platform = jax.devices()[0].platform
    if not isinstance(platform, str):
        raise ValueError(f"platform must be a str such as 'gpu', got {platform!r}")
    return dict(_EXACT_OPTIONS.get(platform, {}))


@jax.tree_util.register_pytree_node_class
class Landing:
    """The deferred part of one load-back: per whole host block it moves, the block (a
    tuple of one array per stored part) and the device pages of its rows (i32, on the device).

    Static (part of a step's compiled signature): the chunks' allocator programs and pool
    names, and per model layer the last group it reads.
    """

    def __init__(self, blocks: Sequence[tuple[jax.Array, ...]], pages: Sequence[jax.Array],
                 static: tuple):
        self.blocks, self.pages, self._static = tuple(blocks), tuple(pages), static

    @classmethod
    def create(cls, chunks, needed: Sequence[int], groups: int) -> "Landing":
        """`chunks`: `(programs, pool names, block, device pages)` per deferred block."""
        progs = tuple(c[0] for c in chunks)
        names = tuple(tuple(c[1]) for c in chunks)
        return cls([c[2] for c in chunks], [c[3] for c in chunks], (progs, names, tuple(needed), groups))

    # -- pytree ------------------------------------------------------------------------------
    def tree_flatten(self):
        return (self.blocks, self.pages), self._static

    @classmethod
    def tree_unflatten(cls, static, children):
        return cls(children[0], children[1], static)

    # -- what a step needs to know -------------------------------------------------------------
    @property
    def groups(self) -> int:
        """Layer groups (`HiCacheConfig.layer_groups`)."""
        return self._static[3]

    @property
    def layers(self) -> int:
        """The model's layers (`before_layer` takes 0 .. layers-1)."""
        return len(self._static[2])

    @property
    def nbytes(self) -> int:
        """Bytes this landing moves."""
        return sum(a.nbytes for block in self.blocks for a in block)

    def needed_group(self, layer: int) -> int:
        """The last layer group that model layer `layer` reads."""
        needed = self._static[2]
        if not 0 <= layer < len(needed):
            raise ValueError(f"layer {layer} is outside the model's {len(needed)} layers")
        return needed[layer]

    def schedule(self, lead: int = 1) -> "LandingSchedule":
        """The helper a jitted step lands this load with (module docstring); `lead`: groups
        whose copies run ahead of the group being computed."""
        if isinstance(lead, bool) or not isinstance(lead, int) or lead < 0:
            raise ValueError(f"lead must be an int >= 0, got {lead!r}")
        return LandingSchedule(self, lead)

    def land_part(self, pools: dict, group: int, moved: Sequence) -> dict:
        """`pools` with every chunk's part of `group` (moved to the device: `moved`) scattered in."""
        progs, names, _, _ = self._static
        for chunk, (p, ns) in enumerate(zip(progs, names)):
            part = _part_of(p, group)
            if part is None:
                continue
            new = p.scatter_part(tuple(pools[n] for n in ns), moved[chunk], self.pages[chunk], part)
            pools.update(zip(ns, new))
        return pools

    def move_part(self, group: int, blocks=None) -> list:
        """Group `group`'s pinned arrays of every chunk, moved to the device (inside a jit)."""
        progs = self._static[0]
        blocks = self.blocks if blocks is None else blocks
        out = []
        for p, block in zip(progs, blocks):
            part = _part_of(p, group)
            out.append(None if part is None else jax.device_put(block[part], _DEVICE))
        return out


class LandingSchedule:
    """Lands a `Landing` inside one trace of a jitted step (see the module docstring)."""

    def __init__(self, landing: Landing, lead: int):
        self._landing, self._lead = landing, lead
        self._moved: dict[int, list] = {}
        self._landed = 0       # groups 0 .. _landed-1 are in the pools

    def before_layer(self, layer: int, pools: Mapping, x):
        """`(pools, x)` with every group `layer` reads landed; starts the copies `lead`
        groups ahead, each after the compute that produced `x`. Call it before every layer,
        in order, with the activations the layer starts from.

        `x` comes back as it went in: the copies and writes are ordered after it through
        barriers whose copy of `x` is dropped, so the model's own arithmetic is traced
        exactly as in a step with no landing. (Passing `x` on through a barrier splits the
        model's fusions at every group boundary; on a GPU that changed the rounding of
        the step's logits against the same step without a landing.)"""
        pools = dict(pools)
        groups = self._landing.groups
        if not self._moved:                      # first call: the first copies go at once
            for g in range(min(groups, self._lead + 1)):
                self._moved[g] = self._landing.move_part(g)
        while self._landed <= self._landing.needed_group(layer):
            g = self._landed
            ahead = g + self._lead
            if g and ahead < groups and ahead not in self._moved:
                _, blocks = jax.lax.optimization_barrier((x, self._landing.blocks))
                self._moved[ahead] = self._landing.move_part(ahead, blocks)
            if g:   # the layers before read the pools: order this group's writes after them
                _, pools = jax.lax.optimization_barrier((x, pools))
            pools = self._land(g, pools)
        return pools, x

    def finish(self, pools: Mapping) -> dict:
        """`pools` with every group landed (those no layer asked for yet)."""
        pools = dict(pools)
        while self._landed < self._landing.groups:
            pools = self._land(self._landed, pools)
        return pools

    def _land(self, group: int, pools: dict) -> dict:
        moved = self._moved.pop(group, None)
        if moved is None:
            moved = self._landing.move_part(group)
        pools = self._landing.land_part(pools, group, moved)
        self._landed = group + 1
        return pools


def _part_of(progs, group: int) -> int | None:
    """Index of `progs`' stored part holding layer group `group` (None: it has none)."""
    for i, part in enumerate(progs.fmt.parts):
        if part.group == group:
            return i
    return None
