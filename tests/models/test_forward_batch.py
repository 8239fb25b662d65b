"""`forward_batch`: a sequence computed in a batch gets the same bits as computed alone.

Three sequences of different lengths run together, each step one chunk per sequence
(prefill chunks beside decode steps that grow `valid` by one), on garbage pools through
page tables that interleave their pages. The same sequences then run alone: in a batch of
one (the same program, count = 1, in the last slot) and through `forward_chunk`. Every
step's logits and every page a sequence wrote must be equal bit for bit, for the tiny V4,
V4.1 and GQA models and Gemma 3's architecture (random small config, 64-token chunks).
"""
import jax
import numpy as np
import pytest

import hicache_jax as hc
from conftest import CONFIGS
from examples.gemma.model import GemmaModel
from examples.tiny_models import SlotBatch, make_model

MAX_PAGES, POOL_PAGES, B = 4, 13, 4
LENGTHS = (300, 520, 70)      # prompt tokens of the three sequences (decode runs on after)
DECODE = 3                    # tokens decoded per sequence, by growing valid
TRASH = (12, 0)               # (anchor, SWA) page no sequence's table names (`tables`)


@pytest.fixture(scope="module", params=["tiny_v4", "tiny_v41", "tiny_gqa", "tiny_gemma3"])
def model(request):
    layout = hc.build_layout(hc.load_model_config(CONFIGS / f"{request.param}.json"))
    if request.param == "tiny_gemma3":
        return GemmaModel.random(layout, seed=0, max_pages=MAX_PAGES, chunk_size=64)
    return make_model(layout, seed=0, max_pages=MAX_PAGES)


def garbage(model, seed=3):
    rng = np.random.default_rng(seed)
    out = {}
    for name, (shape, dtype) in model.pool_shapes(POOL_PAGES, POOL_PAGES).items():
        dt = np.dtype(jax.numpy.dtype(dtype))
        raw = rng.integers(0, 256, int(np.prod(shape)) * dt.itemsize, dtype=np.uint8)
        out[name] = jax.numpy.asarray(raw.view(dt).reshape(shape))
    return out


def schedule(model, seq_len: int):
    """(start, valid) of each call: prefill chunk by chunk, then decode one position at a time."""
    C = model.chunk_size
    calls = [(q * C, min(seq_len, (q + 1) * C) - q * C) for q in range(-(-seq_len // C))]
    for n in range(seq_len + 1, seq_len + DECODE + 1):
        q = (n - 1) // C
        calls.append((q * C, n - q * C))
    return calls


def tables(k: int):
    """Sequence k's anchor and SWA tables: pages interleaved with the other sequences'."""
    anchor = np.array([k + 3 * j for j in range(MAX_PAGES)], np.int32)
    return anchor, (anchor + 1) % POOL_PAGES


def streams(model):
    rng = np.random.default_rng(7)
    return [rng.integers(1, model.vocab_size, n + DECODE).astype(np.int32) for n in LENGTHS]


def chunk_tokens(model, stream, start, valid, pad_seed):
    t = np.random.default_rng(pad_seed).integers(0, model.vocab_size, model.chunk_size).astype(np.int32)
    t[:valid] = stream[start:start + valid]
    return t


def run_batch(model, pools, members, steps, every_slot=False):
    """Run `steps` batched steps of the sequences `members` (ids), packed into the first
    slots in an order that rotates every step. Returns (pools, {id: [logits per call]}).
    `every_slot`: the step that computes every slot, the spare ones on the TRASH pages."""
    seqs = streams(model)
    calls = {k: schedule(model, LENGTHS[k]) for k in members}
    out = {k: [] for k in members}
    C, M = model.chunk_size, model.max_pages
    for step in range(steps):
        live = [k for k in members if step < len(calls[k])]
        if not live:
            break
        r = step % len(live)
        slot_of = {k: i for i, k in enumerate(live[r:] + live[:r])}     # a sequence changes slots
        tokens = np.zeros((B, C), np.int32)
        start, valid = np.zeros(B, np.int32), np.ones(B, np.int32)
        anchor, swa = (np.full((B, M), t, np.int32) for t in (TRASH if every_slot else (0, 0)))
        for k in live:
            i, (s, v) = slot_of[k], calls[k][step]
            tokens[i] = chunk_tokens(model, seqs[k], s, v, pad_seed=100 * k + step)
            start[i], valid[i] = s, v
            anchor[i], swa[i] = tables(k)
        pools, logits = model.forward_batch(pools, SlotBatch(np.int32(len(live)), tokens, start, valid, anchor, swa,
                                                             np.ones(B, bool)), every_slot=every_slot)
        logits = np.asarray(logits)
        assert not logits[len(live):].any(), "a slot past count got logits"
        for k in live:
            out[k].append(logits[slot_of[k]])
    return pools, out


def run_alone_chunks(model, pools, k):
    seqs, anchor_swa = streams(model), tables(k)
    out = []
    for step, (s, v) in enumerate(schedule(model, LENGTHS[k])):
        pools, lg = model.forward_chunk(pools, *anchor_swa, chunk_tokens(model, seqs[k], s, v, 100 * k + step), s, v)
        out.append(np.asarray(lg))
    return pools, out


def written(model, pools, k):
    """The bytes of every page sequence k wrote, per pool (the runs start from the same garbage)."""
    anchor, swa = (t[: -(-(LENGTHS[k] + DECODE) // model.page_size)] for t in tables(k))
    host = {n: np.asarray(a) for n, a in pools.items()}
    return {spec.name: host[spec.name][:, anchor if spec.allocator == model.layout.anchor.name else swa]
            .view(np.uint8).tobytes() for spec in model.layout.byte_pools}


def bits(rows):
    return [r.view(np.uint32) for r in rows]


def test_a_slot_in_a_batch_equals_the_sequence_alone(model):
    steps = max(len(schedule(model, n)) for n in LENGTHS)
    batch_pools, batched = run_batch(model, garbage(model), [0, 1, 2], steps)
    for k in range(3):
        # alone in the same program: a batch of one (slot 0, the only one computed)
        alone_pools, alone = run_batch(model, garbage(model), [k], steps)
        chunk_pools, chunks = run_alone_chunks(model, garbage(model), k)
        for step, (x, y, z) in enumerate(zip(bits(batched[k]), bits(alone[k]), bits(chunks), strict=True)):
            assert np.array_equal(x, y), (k, step, "batch vs batch of one")
            assert np.array_equal(x, z), (k, step, "batch vs forward_chunk")
        mine = written(model, batch_pools, k)
        assert mine == written(model, alone_pools, k) == written(model, chunk_pools, k), k


def test_computing_every_slot_gives_the_same_bits_and_writes_only_the_trash_page(model):
    """forward_batch(every_slot=True), the step a loop that schedules ahead runs: every
    sequence's logits at every step and every pool page but the trash pages equal the traced
    step's bit for bit; the spare slots' logits are zero (run_batch); the trash pages were
    written (the spare slots did run)."""
    steps = max(len(schedule(model, n)) for n in LENGTHS)
    start = garbage(model)
    before = {n: np.asarray(a).copy() for n, a in start.items()}
    traced_pools, traced = run_batch(model, garbage(model), [0, 1, 2], steps)
    every_pools, every = run_batch(model, start, [0, 1, 2], steps, every_slot=True)
    for k in range(3):
        assert all(np.array_equal(x, y) for x, y in zip(bits(traced[k]), bits(every[k]), strict=True)), k
    trash_written = False
    for spec in model.layout.byte_pools:
        trash = TRASH[0] if spec.allocator == model.layout.anchor.name else TRASH[1]
        a, b = (np.delete(np.asarray(p[spec.name]), trash, axis=1) for p in (traced_pools, every_pools))
        assert a.view(np.uint8).tobytes() == b.view(np.uint8).tobytes(), spec.name
        trash_written |= not np.array_equal(np.asarray(every_pools[spec.name])[:, trash], before[spec.name][:, trash])
    assert trash_written


def test_slots_past_count_cost_nothing_and_write_nothing(model):
    pools = garbage(model)
    before = {n: np.asarray(a).copy() for n, a in pools.items()}
    C, M = model.chunk_size, model.max_pages
    slots = SlotBatch(np.int32(0), np.ones((B, C), np.int32), np.zeros(B, np.int32), np.full(B, C, np.int32),
                      np.zeros((B, M), np.int32), np.zeros((B, M), np.int32), np.ones(B, bool))
    pools, logits = model.forward_batch(pools, slots)
    assert not np.asarray(logits).any()
    for n, a in pools.items():
        assert np.asarray(a).view(np.uint8).tobytes() == before[n].view(np.uint8).tobytes(), n


def test_bad_slots_are_refused_naming_the_field(model):
    C, M = model.chunk_size, model.max_pages
    good = SlotBatch(np.int32(1), np.zeros((B, C), np.int32), np.zeros(B, np.int32), np.ones(B, np.int32),
                     np.zeros((B, M), np.int32), np.zeros((B, M), np.int32), np.ones(B, bool))
    pools = garbage(model)
    with pytest.raises(ValueError, match="count must be in 0..4"):
        model.forward_batch(pools, good._replace(count=np.int32(5)))
    with pytest.raises(ValueError, match="anchor_pages"):
        model.forward_batch(pools, good._replace(anchor_pages=np.zeros((B, M + 1), np.int32)))
    with pytest.raises(ValueError, match="slot 0: valid"):
        model.forward_batch(pools, good._replace(valid=np.zeros(B, np.int32)))
    with pytest.raises(ValueError, match="SlotBatch"):
        model.forward_batch(pools, tuple(good))
