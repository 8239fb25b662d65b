"""How the pages of several sources pack into one contiguous staging row.

A *source* is an array `[num_layers, num_pages, *page_shape]` (a pool, or one layer of a
pool). Packing page `p` gives one row of *segments*, each a range of layers of one source
(`(source, first layer, number of layers)`), each layer's page flattened. By default
segment i is source i, all its layers:

    row:  | src0 layer0 page p | src0 layer1 page p | ... | src1 layer0 page p | ... |
          ^ segment 0 (row_offset 0)                       ^ segment 1 (row_offset L0*E0)

Given ranges, the segments follow them in order; a source may be in several segments or
in none. `layers=[(1, 2, 2), (0, 0, 1)]`:

    row:  | src1 layer2 page p | src1 layer3 page p | src0 layer0 page p |
          ^ segment 0 (row_offset 0)                  ^ segment 1 (row_offset 2*E1)

The kernels copy a row in *blocks* of `block_elems` elements per segment. How a page of E
elements is cut depends on the kernel:

- power-of-two blocks (Triton needs power-of-two shapes): ceil(E / B) blocks of
  B = min(max_block, largest power of two <= E), the last one shifted back to end exactly
  at the page end. Overlapping blocks copy the same bytes twice, harmless for a copy, and
  no block reads or writes outside its page (no masks needed):

    page of E = 10 elems, B = 4:   [0 1 2 3][4 5 6 7]
                                           [6 7 8 9]   <- last block starts at E - B

- granular blocks (bulk DMA engines move multiples of 16 B between 16 B aligned
  addresses): the fewest blocks of at most max_block, of equal size B rounded up to the
  granule, the last one shorter (`last_elems`) so that no two copies write the same bytes:

    page of E = 10, B = 4:         [0 1 2 3][4 5 6 7][8 9]

  A 37,440 B page under a 32 KiB cap moves as 2 x 18,720 B (power-of-two: 2 x 32 KiB).

A row may be padded at its end to a multiple of `align_bytes` (zeros on gather, ignored on
scatter), so that every row of a contiguous run starts at an aligned address: a DMA
to or from pinned host memory whose host address is only 64-byte aligned ran at 0.82 of
the link on the H200, the same copy 256-byte aligned at 0.92 (BENCHMARKS.md).
"""
from __future__ import annotations

import dataclasses
import math
import operator
from collections.abc import Iterable, Sequence

BLOCK_BYTES = 4096  # a layout's default block cap (the backends pass their own: backends.DEFAULT_BLOCK_BYTES)


@dataclasses.dataclass(frozen=True)
class PackSegment:
    """One part of a row: the pages of layers `first_layer .. first_layer + num_layers - 1`
    of source `source`, `page_elems` elements each."""

    num_layers: int
    page_elems: int
    row_offset: int        # elements before this segment in the row
    block_elems: int       # power of two, <= page_elems
    blocks_per_page: int   # ceil(page_elems / block_elems)
    first_block: int       # index of this segment's first block in the row
    last_elems: int = 0    # elements of a page's last block (0: block_elems)
    source: int = dataclasses.field(kw_only=True)        # index of the source in the sources
    first_layer: int = dataclasses.field(default=0, kw_only=True)  # source layer of the segment's layer 0

    def __post_init__(self):
        if self.last_elems == 0:
            object.__setattr__(self, "last_elems", self.block_elems)

    @property
    def num_blocks(self) -> int:
        return self.num_layers * self.blocks_per_page

    def locate(self, block, where):
        """(layer in this segment, element offset in the page) of this segment's `block`-th
        block; the source layer is `first_layer` + that layer.

        `where` is `jnp.where` in kernels (traced block ids) or any select function.
        """
        layer = block // self.blocks_per_page
        b = block % self.blocks_per_page
        last_start = self.page_elems - self.last_elems
        return layer, where(b == self.blocks_per_page - 1, last_start, b * self.block_elems)


@dataclasses.dataclass(frozen=True)
class PackLayout:
    """Segments of a packed row, in row order; `row_elems` includes the end padding."""

    segments: tuple[PackSegment, ...]
    row_elems: int
    num_blocks: int
    data_elems: int = -1   # elements before the padding (default: the whole row)

    def __post_init__(self):
        if self.data_elems < 0:
            object.__setattr__(self, "data_elems", self.row_elems)


def source_dims(shape: Sequence[int]) -> tuple[int, int, int]:
    """(num_layers, num_pages, page_elems) of a source array shape `[L, P, *page_shape]`."""
    if len(shape) < 3:
        raise ValueError(f"a source must be [num_layers, num_pages, *page_shape], got shape {tuple(shape)}")
    return int(shape[0]), int(shape[1]), math.prod(shape[2:])


def padded_elems(elems: int, itemsize: int, align_bytes: int) -> int:
    """`elems` rounded up so that `elems * itemsize` is a multiple of `align_bytes` (a power of two)."""
    if align_bytes < 1 or align_bytes & (align_bytes - 1):
        raise ValueError(f"align_bytes must be a power of two, got {align_bytes}")
    step = max(1, align_bytes // itemsize)
    return -(-elems // step) * step


def pack_layout(dims: Sequence[tuple[int, int]], itemsize: int, block_bytes: int = BLOCK_BYTES,
               align_bytes: int = 1, granule_bytes: int | None = None,
               layers: Iterable[tuple[int, int, int]] | None = None) -> PackLayout:
    """Layout of a row over sources of `(num_layers, page_elems)`, elements of `itemsize`
    bytes, padded to a multiple of `align_bytes`; blocks are powers of two, or multiples
    of `granule_bytes` when given (then every page must be a multiple of it too).
    `layers`: the segments `(source, first layer, number of layers)` in row order (see
    `layer_ranges`); None: every source whole, in order."""
    if block_bytes < itemsize or block_bytes & (block_bytes - 1):
        raise ValueError(f"block_bytes must be a power of two >= the item size {itemsize}, got {block_bytes}")
    max_block = block_bytes // itemsize
    for num_layers, page_elems in dims:
        if num_layers <= 0 or page_elems <= 0:
            raise ValueError(f"a source needs layers and page elements, got {num_layers} x {page_elems}")
    segments, offset, first = [], 0, 0
    for source, first_layer, num_layers in layer_ranges([d[0] for d in dims], layers):
        page_elems = dims[source][1]
        if granule_bytes is None:
            block = min(max_block, 1 << (page_elems.bit_length() - 1))
            per_page, last = -(-page_elems // block), block
        else:
            block = _granular_block(page_elems, itemsize, max_block, granule_bytes)
            per_page = -(-page_elems // block)
            last = page_elems - (per_page - 1) * block
        seg = PackSegment(num_layers, page_elems, offset, block, per_page, first, last,
                      source=source, first_layer=first_layer)
        segments.append(seg)
        offset += num_layers * page_elems
        first += seg.num_blocks
    return PackLayout(tuple(segments), padded_elems(offset, itemsize, align_bytes), first, offset)


def layer_ranges(num_layers: Sequence[int], layers: Iterable[tuple[int, int, int]] | None = None, *,
                 disjoint: bool = False) -> tuple[tuple[int, int, int], ...]:
    """The segments `(source, first layer, number of layers)` of a row over sources of
    `num_layers[s]` layers: `layers` checked, or `(s, 0, num_layers[s])` for every source
    when None. ValueError naming the entry unless it names a source, n >= 1 layers and
    first >= 0 with first + n <= the source's layers; with `disjoint` (a scatter), also if
    a layer of a source is in two segments."""
    if layers is None:
        return tuple((s, 0, int(n)) for s, n in enumerate(num_layers))
    ranges, covered = [], {}
    for entry in layers:
        try:
            source, first, n = (operator.index(v) for v in entry)
        except (TypeError, ValueError):
            raise ValueError(f"layers entry {entry!r} is not (source, first layer, number of layers)") from None
        if not 0 <= source < len(num_layers):
            raise ValueError(f"layers entry {entry!r}: source {source} outside 0..{len(num_layers) - 1}")
        if n < 1:
            raise ValueError(f"layers entry {entry!r}: number of layers {n} < 1")
        if first < 0 or first + n > num_layers[source]:
            raise ValueError(f"layers entry {entry!r}: layers {first}..{first + n - 1} outside "
                             f"0..{num_layers[source] - 1} of source {source}")
        if disjoint:
            seen = covered.setdefault(source, set())
            twice = seen.intersection(range(first, first + n))
            if twice:
                raise ValueError(f"layers entry {entry!r}: layers {sorted(twice)[:8]} of source {source} are in an "
                                 f"earlier segment too: a scatter writes each layer once")
            seen.update(range(first, first + n))
        ranges.append((source, first, n))
    if not ranges:
        raise ValueError("layers names no segment: a row needs at least one")
    return tuple(ranges)


def _granular_block(page_elems: int, itemsize: int, max_block: int, granule_bytes: int) -> int:
    """Elements per block when blocks must be multiples of `granule_bytes`: as many blocks
    as `max_block` elements need, of equal size rounded up to the granule."""
    granule = max(1, granule_bytes // itemsize)
    if (page_elems * itemsize) % granule_bytes or (max_block * itemsize) % granule_bytes:
        raise ValueError(f"pages of {page_elems * itemsize} B and blocks of {max_block * itemsize} B must be "
                         f"multiples of {granule_bytes} B for this kernel")
    blocks = -(-page_elems // max_block)
    return -(-(-(-page_elems // blocks)) // granule) * granule
