"""Random inserts, matches, locks, evictions, backups with delayed/reordered/failed acks and
load-backs, against a reference model of what each tier holds.

The reference: every page's content is a label naming its token prefix. Simulated device
and host memories receive labels exactly when the data plane would move bytes (a backup
copies at dispatch, a load copies at dispatch, a failed transfer leaves garbage). After
every step the tree's invariants hold and every page the tree calls valid holds the right
label, so a half-restored or wrongly restored prefix can never be matched.

The machine knows the layout's allocators only as the tree's components: the same rules
and checks run on a layout with two independent window allocators (an SWA pool and a
draft model's SWA pool).
"""
import dataclasses

import numpy as np
from hypothesis import settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

import hicache_jax as hc
from hicache_jax.layout import PoolName
from hicache_jax.tree import LoadJob, Tier, TreeCore
from hicache_jax.tree.node import ABSENT
from hicache_jax.tree.state import DEVICE_VALID, HOST_DURABLE
from helpers import P, core, dev, device_allocs, host, host_allocs, layout, query, seq

GARBAGE = ("garbage",)
blocks = st.lists(st.integers(0, 3), min_size=1, max_size=5)


class TreeMachine(RuleBasedStateMachine):
    layout_name = "tiny_v4"

    @initialize(policy=st.sampled_from(["write_through", "write_through_selective", "write_back"]),
                dev=st.integers(4, 12), host=st.integers(4, 24), swa_dev=st.integers(3, 8), swa_host=st.integers(2, 12),
                threshold=st.sampled_from([0, 10, 512]))
    def setup(self, policy, dev, host, swa_dev, swa_host, threshold):
        self.c = self.make_core(dev=dev, host=host, swa_dev=swa_dev, swa_host=swa_host,
                                write_policy=policy, load_back_threshold=threshold)
        self.windows = [w.name for w in self.c.components.windows]   # window allocators
        self.mem = {"device": {}, "host": {}}   # (allocator, page) -> label
        self.backups, self.loads, self.locks = [], [], []
        self.unread = []    # dispatched backups whose device reads the tree has not been told of

    def make_core(self, **kw) -> TreeCore:
        return core(self.layout_name, **kw)

    def need(self, anchor: int, window: int) -> dict[str, int]:
        return {"kv": anchor, **dict.fromkeys(self.windows, window)}

    # -- the simulated data plane ---------------------------------------------------------
    def dispatch(self, plan, src, dst):
        for b in plan.batches:   # the tree's plans skip make_plan's checks: every page once, in range
            for tier, pages in ((Tier.DEVICE, b.device_pages), (Tier.HOST, b.host_pages)):
                cap = self.c.ledger.allocators(tier)[b.allocator].capacity
                assert len(set(pages.tolist())) == pages.size and all(0 <= p < cap for p in pages.tolist()), b
            assert b.host_pages.tolist() == sorted(b.host_pages.tolist()), b
            for d, h in zip(b.device_pages.tolist(), b.host_pages.tolist()):
                s, t = ((b.allocator, d), (b.allocator, h)) if src == "device" else ((b.allocator, h), (b.allocator, d))
                self.mem[dst][t] = self.mem[src].get(s, GARBAGE)

    def spoil(self, plan, tier):
        for b in plan.batches:
            for p in (b.host_pages if tier == "host" else b.device_pages).tolist():
                self.mem[tier][(b.allocator, p)] = GARBAGE

    def flush(self):
        batch = self.c.take_backup_batch()
        if batch is not None:
            self.dispatch(batch.plan, "device", "host")
            self.backups.append(batch)
            self.unread.append(batch)

    def flush_if_needed(self):
        if self.c.needs_flush:      # demoted pages must be read before anything reuses them
            self.flush()

    # -- rules ---------------------------------------------------------------------------
    @rule(b=blocks, load=st.booleans(), swa_pick=st.integers(0, 15))
    def request(self, b, load, swa_pick):
        c, tokens = self.c, seq(*b)
        ahead = c.anchor_pages_ahead(query(tokens))      # acquire_many's look ahead, before the match
        m = c.match_prefix(query(tokens))
        assert m.device_len % P == 0 and m.host_len % P == 0 and m.total_len <= len(tokens)
        assert len(m.device_pages) == m.device_len // P
        table, usable = list(m.device_pages.tolist()), m.device_len
        pin = c.lock(m.device_node)          # the serving-loop contract: pin what you use
        if load and m.host_len:
            job = c.start_load(m)
            self.flush_if_needed()
            if isinstance(job, LoadJob):
                # the anchor pages it loads lead the look ahead's (windows may only stop it sooner)
                loaded = job.plan.batch(c.components.anchor.name)
                if loaded is not None and loaded.num_pages:
                    assert ahead is not None and sorted(ahead[:loaded.num_pages].tolist()) == loaded.host_pages.tolist()
                self.dispatch(job.plan, "host", "device")
                self.loads.append(job)
                table, usable = list(job.device_pages.tolist()), job.length
                c.unlock(pin)
                pin = job.lock                  # the load's pin for its caller
        try:
            self.compute_and_insert(b, tokens, table, usable, swa_pick)
        finally:
            c.unlock(pin)

    def compute_and_insert(self, b, tokens, table, usable, swa_pick):
        c = self.c
        n_new = (len(tokens) - usable) // P
        need = self.need(n_new, n_new)
        got = c.alloc_device(need) if n_new else {k: np.zeros(0, np.int32) for k in need}
        self.flush_if_needed()
        if got is None:
            return
        first = usable // P
        for i, p in enumerate(got["kv"].tolist()):
            self.mem["device"][("kv", p)] = label("kv", b, first + i)
        given = {}
        for k, w in enumerate(self.windows):
            given[w] = {}
            for i, p in enumerate(got[w].tolist()):
                self.mem["device"][(w, p)] = label(w, b, first + i)
                if i == n_new - 1 or (swa_pick >> ((i + k) % 4)) & 1:
                    given[w][first + i] = p
            c.free_device(w, [p for p in got[w].tolist() if p not in given[w].values()])
        r = c.insert(tokens, table + got["kv"].tolist(), given or None)
        if r.cached_len == len(tokens) and not self.loads:
            assert c.match_prefix(query(tokens)).device_len == len(tokens)   # just inserted: all on device

    @rule(n=st.integers(1, 6), swa=st.integers(0, 3))
    def evict_device(self, n, swa):
        self.c.evict_device(self.need(n, swa))
        self.flush_if_needed()

    @rule(n=st.integers(1, 6), swa=st.integers(0, 3))
    def evict_host(self, n, swa):
        self.c.evict_host(self.need(n, swa))

    @rule()
    def step_flush(self):
        self.flush()

    @precondition(lambda self: self.unread)
    @rule(i=st.integers(0, 7))
    def read_backup(self, i):
        """The data plane dispatched the batch's every piece (the copy above read the device
        pages then): its pages may be evicted and written again before the ack."""
        self.c.backup_read(self.unread.pop(i % len(self.unread)).ack_id)

    @precondition(lambda self: self.backups)
    @rule(i=st.integers(0, 7), ok=st.integers(0, 4))
    def complete_backup(self, i, ok):
        batch = self.backups.pop(i % len(self.backups))   # any order: acks are reordered
        if batch in self.unread:
            self.unread.remove(batch)
        if ok:
            self.c.ack_backup(batch.ack_id)
        else:
            self.spoil(batch.plan, "host")
            self.c.fail_backup(batch.ack_id)

    @precondition(lambda self: self.loads)
    @rule(i=st.integers(0, 7), ok=st.integers(0, 4))
    def complete_load(self, i, ok):
        job = self.loads.pop(i % len(self.loads))
        if ok:
            self.c.finish_load(job.load_id)
        else:
            self.spoil(job.plan, "device")
            self.c.fail_load(job.load_id)

    @rule(b=blocks)
    def lock(self, b):
        m = self.c.match_prefix(query(seq(*b)))
        if m.device_len:
            self.locks.append(self.c.lock(m.device_node))

    @precondition(lambda self: self.locks)
    @rule(i=st.integers(0, 7))
    def unlock(self, i):
        self.c.unlock(self.locks.pop(i % len(self.locks)))

    # -- checks --------------------------------------------------------------------------
    @invariant()
    def consistent(self):
        c = self.c
        c.check_invariants()
        for node in c.tree.nodes():
            prefix = prefix_blocks(node)
            first = len(prefix) - len(node.tokens) // P
            for i in range(len(node.tokens) // P):
                want = prefix[: first + i + 1]
                if node.state in DEVICE_VALID:
                    assert self.mem["device"].get(("kv", int(dev(node)[i]))) == ("kv", want), node
                    for k, w in enumerate(self.windows, start=1):
                        page = node.pages[Tier.DEVICE][k][i]
                        if page != ABSENT and node.load_id is None:
                            assert self.mem["device"].get((w, int(page))) == (w, want), node
                if node.state in HOST_DURABLE and node.write_id is None:
                    assert self.mem["host"].get(("kv", int(host(node)[i]))) == ("kv", want), node
                    for k, w in enumerate(self.windows, start=1):
                        page = node.pages[Tier.HOST][k][i]
                        if page != ABSENT:
                            assert self.mem["host"].get((w, int(page))) == (w, want), node

    def teardown(self):
        """Drain everything in flight, evict both tiers: every page must come back."""
        if not hasattr(self, "c"):
            return
        c = self.c
        self.flush()
        for batch in self.backups:
            c.ack_backup(batch.ack_id)
        for job in self.loads:
            c.finish_load(job.load_id)
        for lock in self.locks:
            c.unlock(lock)
        for _ in range(64):   # a pending write-back pins its parent until acked: repeat
            c.evict_device(self.need(10 ** 6, 10 ** 6))
            while (batch := c.take_backup_batch()) is not None:
                c.ack_backup(batch.ack_id)
            c.evict_host(self.need(10 ** 6, 10 ** 6))
            if c.tree.num_nodes == 0:
                break
        c.check_invariants()
        assert c.tree.num_nodes == 0
        for alloc in list(device_allocs(c)) + list(host_allocs(c)):
            assert alloc.num_free == alloc.capacity, alloc


def label(kind, b, i):
    return (kind, tuple(b[: i + 1]))


def prefix_blocks(node):
    chain = list(node.path_to_root())[::-1]
    toks = np.concatenate([n.tokens for n in chain])
    return tuple(int(t) - 1000 for t in toks[::P])


class V41Machine(TreeMachine):
    layout_name = "tiny_v41"


class GQAMachine(TreeMachine):
    layout_name = "tiny_gqa"


def two_window_layout():
    """tiny_v4 plus a second independent window allocator: a draft model's SWA pool, whose
    state the tree tracks as its own component (same window, its own pages)."""
    lay = layout("tiny_v4")
    draft = dataclasses.replace(lay.pool("swa"), name=str(PoolName.DRAFT_SWA))
    return hc.PoolLayout(lay.model, (*lay.pools, draft), lay.layers)


class TwoWindowMachine(TreeMachine):
    def make_core(self, dev, host, swa_dev, swa_host, **kw) -> TreeCore:
        device = {"kv": dev, "swa": swa_dev, "draft_swa": max(2, swa_dev - 1)}
        return TreeCore(two_window_layout(), device_pages=device,
                        host_pages={"kv": host, "swa": swa_host, "draft_swa": swa_host + 1}, **kw)


TestTreeV4 = TreeMachine.TestCase
TestTreeV41 = V41Machine.TestCase
TestTreeGQA = GQAMachine.TestCase
TestTreeTwoWindows = TwoWindowMachine.TestCase
for _case in (TestTreeV4, TestTreeV41, TestTreeGQA, TestTreeTwoWindows):
    _case.settings = settings(_case.settings, stateful_step_count=40, report_multiple_bugs=False)
del _case
