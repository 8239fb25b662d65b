"""Slot and page codecs of every byte format: exact bytes, precision, idempotence, page layout."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hicache_jax import codecs
from hicache_jax.layout import formats as F

# (format, worst error relative to the largest |value| of the slot's scale block)
FORMATS = {
    "v4": (F.v4(64, 64), 2.0 ** -4),            # fp8 nope (bf16 rope is finer)
    "v4_real": (F.v4(448, 64), 2.0 ** -4),
    "v41": (F.v41(128), 2.0 ** -4),
    "v41_fp4": (F.v41_fp4(128), 0.25),          # e2m1 half-step at the top: 1 of 6, plus scale rounding
    "indexer_fp8": (F.indexer_fp8(128), 2.0 ** -4),
    "indexer_fp4": (F.indexer_fp4(128), 0.25),
    "state_fp32": (F.state_fp32(512), 0.0),
}


def jitted(c):
    """(encode, decode) of codec c, each one compiled program (eager op-by-op is slow on CPU)."""
    return jax.jit(c.encode), jax.jit(c.decode)


def sample(dim, rows=64, seed=0, spread=3.0):
    rng = np.random.default_rng(seed)
    mag = np.exp(rng.uniform(-spread, spread, (rows, 1)))
    return jnp.asarray(rng.standard_normal((rows, dim)) * mag, jnp.float32)


@pytest.mark.parametrize("name", FORMATS)
def test_round_trip_within_precision(name):
    fmt, tol = FORMATS[name]
    c = codecs.codec_for(fmt)
    enc, dec = jitted(c)
    x = sample(c.dim)
    y = np.asarray(dec(*enc(x)))
    x = np.asarray(x)
    amax = np.max(np.abs(x), axis=-1, keepdims=True)
    assert np.all(np.abs(y - x) <= tol * amax + 1e-30), name
    if name == "state_fp32":
        assert np.array_equal(x, y)


@pytest.mark.parametrize("name", FORMATS)
def test_decode_encode_decode_is_exact(name):
    fmt, _ = FORMATS[name]
    c = codecs.codec_for(fmt)
    x = sample(c.dim, seed=3, spread=6.0 if "fp4" not in name else 2.0)
    x = x.at[0].set(0.0).at[1].set(1e-7)  # an all-zero slot and one below the amax floor
    enc, dec = jitted(c)
    y = dec(*enc(x))
    z = dec(*enc(y))
    assert np.array_equal(np.asarray(y), np.asarray(z))


@pytest.mark.parametrize("name", ["v4", "v41", "indexer_fp4"])
def test_power_of_two_formats_are_idempotent_on_arbitrary_valid_bytes(name):
    """Any bytes with finite codes and a sane scale: decode(encode(decode(b))) == decode(b)."""
    fmt, _ = FORMATS[name]
    c = codecs.codec_for(fmt)
    enc, dec = jitted(c)
    rng = np.random.default_rng(7)
    data = rng.integers(0, 256, (64, fmt.data_bytes), dtype=np.uint8)
    if name == "indexer_fp4":
        data[:, ::16] = 0x77  # 6.0 in every 32-value block
    else:
        fp8 = 64 if name == "v4" else c.dim
        data[:, :fp8] &= 0xF7  # exponent field <= 14: never NaN
        data[:, :fp8:32] = 0x70  # a large code in every scale block keeps amax above the 1e-4 floor
    if name == "v4":  # rope: any finite bf16
        rope = rng.standard_normal((64, 64)).astype(np.float32) * 100
        data[:, 64:] = (rope.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8).reshape(64, 128)
    scale = rng.integers(120, 135, (64, fmt.scale_bytes), dtype=np.uint8)
    if name == "v4":
        scale[:, -1] = 0
    y = dec(jnp.asarray(data), jnp.asarray(scale))
    assert np.all(np.isfinite(np.asarray(y)))
    assert np.array_equal(np.asarray(dec(*enc(y))), np.asarray(y))


def test_v4_row_bytes_by_hand():
    enc, _ = jitted(codecs.codec_for(F.v4(64, 64)))
    data, scale = enc(jnp.ones((1, 128)))
    # amax 1 -> scale 2^-8 (byte 119); 1 / 2^-8 = 256 = fp8 0 1111 000 = 0x78; rope 1.0 bf16 = 0x3f80
    assert np.asarray(data)[0, :64].tolist() == [0x78] * 64
    assert np.asarray(data)[0, 64:68].tolist() == [0x80, 0x3F, 0x80, 0x3F]
    assert np.asarray(scale)[0].tolist() == [119, 0]  # one ue8m0 scale, then the zero pad byte


def test_v41_fp4_and_indexer_bytes_by_hand():
    x = np.zeros((3, 32), np.float32)
    x[0, :2] = [6.0, -3.0]
    x[1, :4] = [448.0, -1.0, 0.0, 2.0]
    x[2, :2] = [1.0, -6.0]

    @jax.jit
    def encode_all(x):
        return (codecs.codec_for(F.v41_fp4(32)).encode(x[0]), codecs.codec_for(F.indexer_fp8(32)).encode(x[1]),
                codecs.codec_for(F.indexer_fp4(32)).encode(x[2]))

    (d4, s4), (d8, s8), (di, si) = jax.tree.map(np.asarray, encode_all(jnp.asarray(x)))
    assert d4[0] == 0x7 | (0xD << 4)                 # 6.0 -> 0111 low nibble, -3.0 -> 1101 high
    assert s4.tolist() == [0x38, 0x00]               # e4m3 scale 1.0 = amax / 6; all-zero block: 0
    assert d8[:4].tolist() == [0x7E, 0xB8, 0x00, 0x40]
    assert s8.tolist() == [0x00, 0x00, 0x80, 0x3F]   # fp32 1.0, little-endian
    assert di[0] == 0xF2 and si.tolist() == [127]


def test_page_layout_and_padding():
    fmt = F.v4(64, 64)
    c = codecs.codec_for(fmt)
    x = sample(c.dim, rows=2)
    page, (data, scale) = jax.jit(lambda v: (codecs.encode_page(c, v), c.encode(v)))(x)
    page = np.asarray(page)
    assert page.shape == (fmt.page_bytes(2),) == (576,)
    assert np.array_equal(page[: 2 * 192], np.asarray(data).reshape(-1))
    assert np.array_equal(page[384:388], np.asarray(scale).reshape(-1))
    assert not page[388:].any()  # page padding is zero
    d2, s2 = codecs.unpack_page(fmt, jnp.asarray(page), 2)
    assert np.array_equal(np.asarray(d2), np.asarray(data)) and np.array_equal(np.asarray(s2), np.asarray(scale))
    batch = jnp.stack([jnp.asarray(page)] * 3)
    assert jax.eval_shape(lambda b: codecs.decode_page(c, b, 2), batch).shape == (3, 2, 128)


def test_write_rows_replaces_only_masked_rows():
    fmt = F.indexer_fp8(128)
    c = codecs.codec_for(fmt)
    mask = jnp.arange(64) % 3 == 0

    @jax.jit
    def run(old_rows, new_rows):
        old = codecs.encode_page(c, old_rows)
        page = codecs.write_rows(c, old, new_rows, mask)
        return (codecs.decode_page(c, page, 64), c.decode(*c.encode(new_rows)), codecs.decode_page(c, old, 64))

    got, want_new, want_old = map(np.asarray, run(sample(128, rows=64, seed=1), sample(128, rows=64, seed=2)))
    m = np.asarray(mask)
    assert np.array_equal(got[m], want_new[m]) and np.array_equal(got[~m], want_old[~m])


def test_batched_pages_match_single_pages_and_are_deterministic():
    c = codecs.codec_for(F.v41_fp4(128))
    x = jnp.stack([sample(128, seed=s, spread=1.0) for s in range(3)])  # f32[3 pages, 64, 128]
    batch = jax.jit(lambda v: codecs.encode_page(c, v))
    single = jax.jit(lambda v: codecs.encode_page(c, v))
    got = np.asarray(batch(x))
    assert got.shape == (3, F.v41_fp4(128).page_bytes(64))
    for i in range(3):
        assert np.array_equal(got[i], np.asarray(single(x[i])))
    assert np.array_equal(np.asarray(batch(x)), got)


def test_split_fp4_indexer_pair():
    pay, sc = F.indexer_fp4_payload(128), F.indexer_fp4_scale(128)
    c = codecs.split_pair(pay, sc)
    assert c.fmt == F.indexer_fp4(128)
    d, s = jax.eval_shape(c.encode, sample(128, rows=4))
    assert d.shape == (4, pay.data_bytes) and s.shape == (4, sc.data_bytes)


def test_caller_mistakes_raise_value_error():
    with pytest.raises(ValueError, match="indexer_fp4_payload"):
        codecs.codec_for(F.indexer_fp4_payload(128))
    with pytest.raises(ValueError, match="not the two halves"):
        codecs.split_pair(F.indexer_fp4_payload(128), F.indexer_fp4_scale(64))
    c = codecs.codec_for(F.v41(128))
    with pytest.raises(ValueError, match="128 floats per slot"):
        c.encode(jnp.zeros((2, 64)))
    with pytest.raises(ValueError, match="1 slots is 256 bytes"):
        codecs.decode_page(c, jnp.zeros((100,), jnp.uint8), 1)
