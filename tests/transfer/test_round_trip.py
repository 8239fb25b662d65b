"""Backup then load-back is bit-exact for every pool, and touches nothing outside the plan.

Runs every layout on one device and on CPU meshes (4 virtual devices: GQA sharded over
tp=4 and tp=2, V4/V4.1 replicated), through both paths: a host run of a whole power of
two pages (one program) and fragmented host runs (staging buffer + pieces), with a small
staging cap so plans span several chunks.
"""
import numpy as np
import pytest

import jax

import hicache_jax as hc
from hicache_jax.plan import make_plan
from hicache_jax.pools import Devices, RowFormat
from hicache_jax.config import TransferConfig
from hicache_jax.transfer import TransferEngine, host_compute_violations

from conftest import CONFIGS, tp_mesh

CASES = [  # (config, tp or None, kernels[, layer groups])
    ("tiny_v4", None, "reference"),
    ("tiny_v4", None, "reference", 3),
    ("tiny_v41", None, "triton_interpret", 2),
    ("tiny_gqa", 2, "reference", 2),
    ("tiny_v4", 4, "reference"),
    ("tiny_v41", None, "reference"),
    ("tiny_v41", 2, "reference"),
    ("tiny_gqa", None, "reference"),
    ("tiny_gqa", 4, "reference"),
    ("tiny_gqa", 2, "reference"),
    ("tiny_v4", None, "triton_interpret"),
    ("tiny_gqa", 2, "triton_interpret"),
]  # interpreted Mosaic GPU / TPU kernels: test_kernel_programs.py
DEVICE_PAGES, HOST_PAGES = 12, 32


def as_bytes(x):
    return np.ascontiguousarray(np.asarray(x)).view(np.uint8)


def random_bytes(rng, shape, dtype):
    """Random bits of any dtype (NaN patterns included: comparisons are on bytes)."""
    size = np.dtype(dtype).itemsize
    return rng.integers(0, 256, (*shape[:-1], shape[-1] * size), np.uint8).view(dtype)


class Harness:
    """An engine plus numpy mirrors of both tiers, to check every page after each transfer.
    A load shape of pieces gets its fused program from its first load on (`fuse_after=1`)."""

    def __init__(self, name, tp, kernels, groups=1, fuse_after=1, view_bytes=None):
        self.layout = hc.build_layout(hc.load_model_config(CONFIGS / f"{name}.json"))
        self.allocators = [p.name for p in self.layout.allocator_pools if self.layout.moving_with(p.name)]
        mesh = tp_mesh(tp) if tp else None
        # a small staging cap, so that plans span several chunks (2 SWA pages, 8 kv pages)
        devices = Devices.create(mesh)
        row = max(RowFormat.create(self.layout, a, devices.tp).rank_row_bytes for a in self.allocators)
        self.engine = TransferEngine(self.layout, {a: DEVICE_PAGES for a in self.allocators},
                                     {a: HOST_PAGES for a in self.allocators}, mesh=mesh,
                                     config=TransferConfig(max_staging_bytes=2 * row, kernels=kernels,
                                                           layer_groups=groups, fuse_after=fuse_after,
                                                           view_bytes=view_bytes))
        rng = np.random.default_rng(0)
        zeros = self.engine.init_device_pools()
        self.pools = {k: jax.device_put(random_bytes(rng, x.shape, x.dtype), x.sharding) for k, x in zeros.items()}
        self.device = {k: as_bytes(v).copy() for k, v in self.pools.items()}
        self.host = {}
        for a in self.allocators:
            for page in range(HOST_PAGES):
                content = {s.name: random_bytes(rng, (s.num_layers, *s.page_shape), self.pools[s.name].dtype)
                           for s in self.layout.moving_with(a)}
                self.engine.write_host_page(a, page, content)
                self.host[(a, page)] = {k: as_bytes(v) for k, v in content.items()}

    def run(self, direction, pages):
        plan = make_plan(self.layout, direction, pages)
        self.pools, handle = self.engine.start(plan, self.pools)
        handle.wait()
        assert handle.done() and handle.seconds is not None and handle.nbytes == plan.nbytes(self.layout)
        for batch in plan.batches:
            for d, h in zip(batch.device_pages, batch.host_pages):
                for pool in batch.pools:
                    if direction == "backup":
                        self.host[(batch.allocator, int(h))][pool] = self.device[pool][:, d].copy()
                    else:
                        self.device[pool][:, d] = self.host[(batch.allocator, int(h))][pool]
        self.check()

    def check(self):
        for pool, mirror in self.device.items():
            assert np.array_equal(as_bytes(self.pools[pool]), mirror), f"device pool {pool}"
        for (a, page), mirror in self.host.items():
            got = self.engine.read_host_page(a, page)
            for pool, arr in got.items():
                assert np.array_equal(as_bytes(arr), mirror[pool]), f"host page {page} of {a}: {pool}"


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c)))
def test_round_trip_is_exact_and_touches_nothing_else(case):
    t = Harness(*case)
    rng = np.random.default_rng(1)
    for i, direction in enumerate(("backup", "load", "backup", "load")):
        pages = {}
        for a in t.allocators:
            n = int(rng.integers(3, 9))
            dev = rng.permutation(DEVICE_PAGES)[:n]
            if i in (0, 3):  # whole power-of-two runs: the one-program path
                n = 1 << (n.bit_length() - 1)
                start = int(rng.integers(0, HOST_PAGES - n))
                host = np.arange(start, start + n)
                dev = dev[:n]
            else:                   # fragmented runs: staging path
                host = rng.permutation(HOST_PAGES)[:n]
            pages[a] = (dev, host)
        t.run(direction, pages)
    # every program this engine compiled keeps host memory to copies, and none writes it:
    # backups reach the host by `device_put` outside any program
    jaxprs = t.engine.program_jaxprs()
    assert jaxprs and all(not host_compute_violations(j) for j in jaxprs.values())
    for label, j in jaxprs.items():
        assert all(getattr(v.aval, "memory_space", None) != jax.memory.Space.Host for v in j.jaxpr.outvars), label


def test_one_page_of_every_pool_and_long_single_runs():
    t = Harness("tiny_v4", None, "reference")
    t.run("backup", {"kv": ([5], [31]), "swa": ([0], [0])})
    t.run("load", {"kv": ([2], [31]), "swa": ([11], [0])})
    # 12 pages from one run: a full chunk of 8 (one program) and a chunk of 4
    t.run("backup", {"kv": (np.arange(12)[::-1], np.arange(10, 22))})
    assert t.engine.chunk_pages("kv") == 8 and t.engine.chunk_pages("swa") == 2
    t.run("load", {"kv": (np.arange(12), np.arange(10, 22))})


@pytest.mark.parametrize("name, tp", [("tiny_v4", None), ("tiny_v4", 4)])
def test_a_backup_chunk_is_packed_and_cut_by_one_program_and_put_by_one_call(name, tp, monkeypatch):
    """A backup chunk of one host run of n pages (n not a power of two) is packed and cut
    into its binary pieces by one `pack_cut` call, and every piece of the backup goes to the
    host in one `jax.device_put`; so is a chunk of several runs whose pieces differ in size,
    and each further piece of a size already cut costs one `slice`. Each piece is its own
    host block, and every byte is where it belongs. Loaded back together, whole blocks of
    one size reach the staging rows by one `h2d_many` call."""
    t = Harness(name, tp, "reference")
    assert t.engine.chunk_pages("kv") == 8
    t.engine.warmup(8)                       # every one-element index kept: no put of its own
    labels, puts, starting = [], [], []      # what `start` runs (not the harness's reads)
    t.engine.on_program_call(lambda label, program, *args: (starting and labels.append(label.split("[")[0]))
                             or program(*args))
    real_put, real_start = jax.device_put, t.engine.start

    def put(x, *args, **kwargs):
        if starting:
            puts.append(len(jax.tree.leaves(x)))
        return real_put(x, *args, **kwargs)

    def start(*args, **kwargs):
        starting.append(True)
        try:
            return real_start(*args, **kwargs)
        finally:
            starting.clear()
    monkeypatch.setattr(jax, "device_put", put)
    monkeypatch.setattr(t.engine, "start", start)
    t.run("backup", {"kv": ([9, 2, 6, 0, 11, 4, 7], np.arange(20, 27))})       # 7 = 4 + 2 + 1 in a chunk of 8
    parts = len(t.engine.host.formats["kv"].parts)
    assert labels == ["kv:pack_cut"] and puts == [3 * parts], (labels, puts)
    table = t.engine.host.tables["kv"]
    assert [table.segments(20, 7)[i][1:] for i in range(3)] == [(0, 4), (0, 2), (0, 1)]
    labels.clear()
    puts.clear()
    t.run("backup", {"kv": ([1, 3, 5, 8, 10], [2, 3, 4, 9, 10])})             # runs of 3 (2 + 1) and 2
    assert labels == ["kv:pack_cut", "kv:slice"] and puts == [3 * parts], (labels, puts)
    labels.clear()
    t.run("backup", {"kv": ([0, 8, 11], [12, 14, 16])})                      # three runs of one page
    assert labels == ["kv:pack_cut", "kv:slice", "kv:slice"], labels
    labels.clear()
    t.run("load", {"kv": (np.arange(7), np.arange(20, 27))})                 # the pieces come back exact
    labels.clear()
    # blocks of two rows (2-3, 9-10) and of one (4, 12, 14, 16): one copy call per size
    # (and on a mesh, where kv is replicated, a `take` of the rows to broadcast)
    t.run("load", {"kv": ([0, 1, 2, 3, 4, 5, 6, 7], [2, 3, 4, 9, 10, 12, 14, 16])})
    assert sorted(l for l in labels if l != "kv:take") == ["kv:h2d_many", "kv:h2d_many", "kv:unpack"], labels
    t.check()


@pytest.mark.parametrize("name", ["tiny_v4", "tiny_v41"])
def test_a_plan_of_whole_runs_moves_as_one_program(name):
    """kv pages plus a window's SWA pages, each one whole host run: one program per plan
    (both directions), exact; a fragmented allocator, or more SWA pages than a window (a
    shape `warmup` does not compile as one program), sends the plan down the per-allocator path."""
    t = Harness(name, None, "reference")
    others = [a for a in t.allocators if a != "kv"]
    assert t.layout.window_pages() == 1
    whole = {"kv": ([7, 1, 4, 10], [12, 13, 14, 15]), **{a: ([3 + i], [20 + i]) for i, a in enumerate(others)}}
    t.run("backup", whole)
    t.run("load", {a: (np.array(d)[::-1], h) for a, (d, h) in whole.items()})
    # (a fused load of pieces, compiled in the background once seen, is not a whole plan's program)
    whole_plans = lambda: [k for k in t.engine.compiled_programs() if k.startswith("plan:") and "load_pieces" not in k]
    plans = whole_plans()
    assert sorted(p.split("[")[0] for p in plans) == ["plan:load_block", "plan:pack"]
    moving = ("pack", "pack_cut", "slice", "load_block", "unpack", "h2d")  # the harness reads rows with others
    assert not [k for k in t.engine.compiled_programs() if not k.startswith("plan:") and any(m in k for m in moving)]
    t.run("load", {**whole, "kv": ([0, 2, 5], [1, 7, 30])})       # fragmented kv: per allocator
    wide = {**whole, **{a: ([3 + i, 9 - i], [20 + 2 * i, 21 + 2 * i]) for i, a in enumerate(others)}}
    t.run("backup", wide)                                          # two SWA pages: per allocator
    t.run("load", wide)
    assert len(whole_plans()) == 2
    assert all(not host_compute_violations(j) for j in t.engine.program_jaxprs().values())


@pytest.mark.parametrize("name, tp, groups", [("tiny_v4", None, 1), ("tiny_gqa", 2, 1), ("tiny_v4", 4, 1),
                                              ("tiny_v41", None, 2)])
def test_host_blocks_follow_rewrites_and_never_outgrow_the_tier(name, tp, groups):
    """Host pages live in pinned blocks, one per backed-up host piece. Rewrite pages inside
    blocks (leaving dead rows), load whole blocks, parts of blocks and pages spread over
    many: every byte stays exact, loads of a whole block take one program, and the rows
    held never exceed the tier's pages (the sparsest blocks are compacted)."""
    t = Harness(name, tp, "reference", groups)
    rng = np.random.default_rng(tp or 7)
    backed = []  # (allocator, host run) written as one block
    for step in range(30):
        a = t.allocators[step % len(t.allocators)]
        chunk = t.engine.chunk_pages(a)
        kind = rng.integers(4)
        if kind == 0 or not backed:        # a whole run: one block
            n = 1 << int(rng.integers(0, chunk.bit_length()))
            start = int(rng.integers(0, HOST_PAGES - n + 1))
            host = np.arange(start, start + n)
            backed.append((a, host))
            t.run("backup", {a: (rng.permutation(DEVICE_PAGES)[:n], host)})
        elif kind == 1:                    # pages inside a block written again: dead rows in it
            _, run = backed[int(rng.integers(len(backed)))]
            host = rng.permutation(run)[:int(rng.integers(1, 3))] if rng.random() < 0.7 else rng.permutation(HOST_PAGES)[:3]
            t.run("backup", {a: (rng.permutation(DEVICE_PAGES)[:host.size], host)})
        elif kind == 2:                    # load a run backed up earlier (whole, or what is left of it)
            a, host = backed[int(rng.integers(len(backed)))]
            host = host[int(rng.integers(0, max(1, host.size // 2))):]
            if rng.random() < 0.5:
                host = host[:max(1, host.size - 1)]
            t.run("load", {a: (rng.permutation(DEVICE_PAGES)[:host.size], host)})
        else:                              # load pages from anywhere
            host = rng.permutation(HOST_PAGES)[:int(rng.integers(1, 9))]
            t.run("load", {a: (rng.permutation(DEVICE_PAGES)[:host.size], host)})
        for b, table in t.engine.host.tables.items():
            table.check_invariants()
            assert table.rows <= table.capacity, (step, b, table.rows)
    # every host page is mapped (the harness wrote them all): a page written again inside a
    # block leaves a dead row there, and the next write must compact it away
    a = t.allocators[0]
    n = t.engine.chunk_pages(a)
    table = t.engine.host.tables[a]
    t.run("backup", {a: (np.arange(n), np.arange(n))})
    before = table.compacted
    t.run("backup", {a: ([0], [n // 2])})
    t.run("backup", {a: ([1], [n + 1])})
    assert table.compacted > before and table.rows <= table.capacity
    table.check_invariants()
    # a whole block loads through the one-block program (replicated pools on a mesh always
    # broadcast staged rows)
    a, host = backed[-1]
    t.run("backup", {a: (np.arange(host.size), host)})
    before = {k for k in t.engine.compiled_programs() if "unpack" in k}
    t.run("load", {a: (np.arange(host.size)[::-1], host)})
    if not t.engine._programs[a].broadcast_load:
        assert any("load_block" in k for k in t.engine.compiled_programs())
        assert {k for k in t.engine.compiled_programs() if "unpack" in k} == before


@pytest.mark.parametrize("name, tp", [("tiny_v4", None), ("tiny_gqa", 2)])
def test_large_one_block_loads_start_their_copy_early(name, tp):
    """A load batch that is one whole host block at least `early_copy_bytes` large is copied
    to the device by a program of its own (no index to wait for) before the plan is
    checked; the load program unpacks that copy. Exact, in one program per plan on one
    device; a plan that fails its checks moves nothing."""
    t = Harness(name, tp, "reference")
    t.engine._early.early_bytes = 0
    a = t.allocators[0]
    n = t.engine.chunk_pages(a)        # a run of one whole chunk
    run = np.arange(n, 2 * n)
    t.run("backup", {a: (np.arange(n), run)})
    t.run("load", {a: (np.arange(n)[::-1], run)})
    assert any("load_block" in k and k.endswith(f"[{n}, 1]") for k in t.engine.compiled_programs())
    assert f"{a}:copy[{n}]" in t.engine.program_jaxprs()
    if tp is None and len(t.allocators) > 1:  # kv and a window page: one program, both from early copies
        other = t.allocators[1]
        t.run("backup", {a: (np.arange(n), run), other: ([1], [3])})
        t.run("load", {a: (np.arange(DEVICE_PAGES - n, DEVICE_PAGES), run), other: ([2], [3])})
        assert f"plan:load_block[('{a}', {n}, 1), ('{other}', 1, 1)]" in t.engine.compiled_programs()
    # `copy_early`: the pages the load will move, in any order, are copied ahead; the next
    # load's start takes the copies (or drops them)
    early = t.engine._early
    fetch = lambda pages: t.engine.copy_early(a, n, lambda: pages)
    assert not fetch(None) and not fetch(run[:-1]) and not fetch([[1]]) and not fetch(run + 10 ** 6)
    assert not fetch(run - 10 ** 6) and not fetch(np.r_[run[1:], run[1]]) and not fetch(run.astype(float))
    assert not t.engine.copy_early("nope", n, lambda: run) and not early._pending
    early.early_bytes = 10 ** 12                                  # too small a load: never asked for its pages
    assert not t.engine.copy_early(a, n, lambda: pytest.fail("pages of a small load"))
    early.early_bytes = 0
    assert fetch(run[::-1]) and len(early._pending) == 1
    t.run("load", {a: (np.arange(n), run)})
    assert not early._pending
    assert fetch(run)
    t.run("load", {a: (np.arange(1), run[:1])})                  # another load: the copy is dropped
    assert not early._pending
    before = {k: as_bytes(v).copy() for k, v in t.pools.items()}
    bad = make_plan(t.layout, "load", {a: (np.r_[np.arange(n - 1), DEVICE_PAGES], run)})
    with pytest.raises(ValueError, match="outside"):
        t.engine.start(bad, t.pools)
    for k, v in t.pools.items():
        assert not v.is_deleted() and np.array_equal(as_bytes(v), before[k])


def test_one_page_transfers_hand_their_programs_no_host_data(monkeypatch):
    """A one-page index, and a piece's (or a row read's) block row and staging row, are
    device arrays kept from their first use: one-page transfers, whole-block or pieces, and
    row reads call their programs with device arrays only; a longer plan copies one index
    for all its allocators."""
    t = Harness("tiny_v4", None, "reference")
    host_args, starting = [], []

    def recording(compiled):
        def call(*args):
            if starting:    # not the harness reading host pages back
                host_args.append([type(x).__name__ for x in jax.tree.leaves(args) if not isinstance(x, jax.Array)])
            return compiled(*args)
        return call

    def watched(method):
        def call(*args):
            starting.append(True)
            try:
                return method(*args)
            finally:
                starting.clear()
        return call
    for owner in [*t.engine._programs.values(), t.engine._plan_programs]:
        monkeypatch.setattr(owner, "compiled", (lambda f: lambda *key: recording(f(*key)))(owner.compiled))
    monkeypatch.setattr(t.engine, "start", watched(t.engine.start))
    t.run("backup", {"kv": ([7, 1, 4, 10], [12, 13, 14, 15])})  # one block of 4 rows
    assert host_args == [["ndarray"]]                            # its 4 pages' index
    host_args.clear()
    t.run("backup", {"kv": ([5], [31]), "swa": ([0], [0])})     # one plan program each way
    t.run("load", {"kv": ([2], [31]), "swa": ([11], [0])})
    t.run("load", {"kv": ([3], [13])})                          # a row inside the block: h2d + unpack
    assert len(host_args) == 4 and all(h == [] for h in host_args), host_args
    host_args.clear()
    t.run("load", {"kv": ([7, 1, 4, 10], [12, 13, 14, 15]), "swa": ([3], [20])})
    assert host_args == [["ndarray"]]                            # the kv pages; swa's page is kept
    host_args.clear()
    watched(t.engine.read_host_rows)("kv", [13, 14])             # two rows of one block: one read program
    assert host_args == [[]]                                     # a row read (L3, compaction) passes its row kept
    t.check()


def test_warmup_keeps_every_one_page_index_so_a_first_hit_hands_over_nothing(monkeypatch):
    """After `warmup`, a one-page load to a device page no transfer used before makes no
    `jax.device_put` (its index was kept ahead), and moves the right bytes."""
    t = Harness("tiny_v4", None, "reference")
    t.engine.warmup(1)
    assert len(t.engine._ints) == t.engine._ints.limit == DEVICE_PAGES
    puts = []
    real_put = jax.device_put
    monkeypatch.setattr(jax, "device_put", lambda *a, **k: puts.append(a) or real_put(*a, **k))
    t.run("load", {"kv": ([DEVICE_PAGES - 1], [3]), "swa": ([DEVICE_PAGES - 2], [1])})
    t.run("load", {"kv": ([0], [5])})
    assert puts == [] and len(t.engine._ints) == DEVICE_PAGES


def test_a_whole_load_moves_by_one_plan_program_read_straight_off_the_plan(monkeypatch):
    """A load of whole host blocks of every allocator (a prefix's load-back) runs one plan
    program without chunking its plan; any other load is chunked and still moves the right
    bytes, with or without an early copy of its blocks."""
    from hicache_jax.transfer import chunks
    t = Harness("tiny_v4", None, "reference")
    t.run("backup", {"kv": ([0, 1, 2, 3], [8, 9, 10, 11]), "swa": ([2], [5])})
    t.run("backup", {"kv": ([4, 5], [20, 21]), "swa": ([3], [6])})
    split, plans = chunks.split, []
    monkeypatch.setattr(chunks, "split", lambda *a: plans.append("chunked") or split(*a))
    compiled = t.engine._plan_programs.compiled
    monkeypatch.setattr(t.engine._plan_programs, "compiled",
                        lambda backup, runs: plans.append(runs) or compiled(backup, runs))
    t.run("load", {"kv": ([7, 1, 4, 10], [8, 9, 10, 11]), "swa": ([0], [5])})
    assert plans == [(("kv", 4, 0), ("swa", 1, 0))]                 # one program, no chunking
    plans.clear()
    t.engine._early.early_bytes = 1                                  # every block copied early
    t.run("load", {"kv": ([3, 2], [20, 21]), "swa": ([1], [6])})
    assert plans == [(("kv", 2, 1), ("swa", 1, 1))]                   # the blocks' device copies
    plans.clear()
    t.run("load", {"kv": ([0, 5, 6], [9, 10, 11]), "swa": ([2], [6])})   # 3 pages, not one block
    assert "chunked" in plans and not any(isinstance(p, tuple) for p in plans)
    t.check()
