"""Element codecs: exact bytes for hand-computed values, and agreement with ml_dtypes' rounding."""
import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np

from hicache_jax.codecs import numerics as nx


def u8(x):
    return np.asarray(x).astype(np.uint8).tolist()


def run(f, *args):
    """f(*args) as one compiled program (eager op-by-op dispatch is slow to compile on CPU)."""
    return jax.jit(f)(*args)


def test_e4m3_bytes_by_hand():
    # s eeee mmm, bias 7: 1.0 = 0 0111 000; -2.5 = 1 1000 010; 448 = 0 1111 110; 2^-9 = 0 0000 001
    assert u8(run(nx.e4m3_bytes, jnp.array([1.0, -2.5, 448.0, 2.0 ** -9, 0.0, -0.0]))) == [0x38, 0xC2, 0x7E, 0x01, 0, 0]


def test_e4m3_rounds_half_to_even_and_saturates():
    # 1.0625 is halfway between 1.0 (mantissa 000) and 1.125 (001): even -> 1.0
    # 1.1875 is halfway between 1.125 (001) and 1.25 (010): even -> 1.25
    got = u8(run(nx.e4m3_bytes, jnp.array([1.0625, 1.1875, 1000.0, -1e9, 2.0 ** -11])))
    assert got == [0x38, 0x3A, 0x7E, 0xFE, 0x00]


def test_e4m3_matches_ml_dtypes_on_random_values():
    rng = np.random.default_rng(0)
    x = (rng.standard_normal(20000) * np.exp2(rng.uniform(-12, 9, 20000))).astype(np.float32)
    x = np.clip(x, -448, 448)
    want = x.astype(ml_dtypes.float8_e4m3fn).view(np.uint8)
    want = np.where(want == 0x80, 0, want)  # we write +0 for every zero
    assert np.array_equal(np.asarray(run(nx.e4m3_bytes, jnp.asarray(x))), want)


def test_e4m3_values_decode_every_byte_exactly():
    b = np.arange(256, dtype=np.uint8)
    want = b.view(ml_dtypes.float8_e4m3fn).astype(np.float32)
    assert np.array_equal(np.asarray(run(nx.e4m3_values, jnp.asarray(b))), want, equal_nan=True)


def test_e2m1_nibbles_by_hand_and_packing_order():
    vals = jnp.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.5, -6.0, 5.0, 0.25, 7.0, 2.5])
    # 5.0 -> 4 (tie to even mantissa), 0.25 -> 0 (tie to even), 7.0 saturates to 6, 2.5 -> 2 (tie)
    assert u8(run(nx.e2m1_nibbles, vals)) == [0, 1, 2, 3, 4, 5, 6, 7, 0x9, 0xF, 6, 0, 7, 4]
    # element 2i in the low nibble: [1.0, -6.0] -> 0x2 | 0xF << 4
    assert u8(run(lambda v: nx.pack_nibbles(nx.e2m1_nibbles(v)), jnp.array([1.0, -6.0]))) == [0xF2]
    n = jnp.asarray(np.arange(16, dtype=np.uint8))
    assert u8(run(lambda v: nx.unpack_nibbles(nx.pack_nibbles(v)), n)) == list(range(16))


def test_e2m1_matches_ml_dtypes():
    rng = np.random.default_rng(1)
    x = np.clip(rng.standard_normal(5000).astype(np.float32) * 3, -6, 6)
    want = x.astype(ml_dtypes.float4_e2m1fn).astype(np.float32)
    got = np.asarray(run(lambda v: nx.e2m1_values(nx.e2m1_nibbles(v)), jnp.asarray(x)))
    assert np.array_equal(got, want)


def test_ue8m0_scale_bytes_by_hand():
    amax = jnp.array([448.0, 449.0, 1.0, 0.0, 6.0])
    b, s = run(lambda a: nx.ue8m0_scale(a, nx.E4M3_MAX), amax)
    # 448/448 = 1 = 2^0 -> 127; 449/448 > 1 -> 2^1 -> 128; 1/448 -> 2^-8 -> 119;
    # 0 is clamped to 1e-4: 1e-4/448 -> 2^-22 -> 105
    assert u8(b)[:4] == [127, 128, 119, 105]
    assert np.asarray(s)[:3].tolist() == [1.0, 2.0, 2.0 ** -8]
    b4, _ = run(lambda a: nx.ue8m0_scale(a, nx.E2M1_MAX), amax[4:])
    assert u8(b4) == [127]
    v = np.asarray(run(nx.ue8m0_values, jnp.array([127, 119, 0, 255], jnp.uint8)))
    assert v[:3].tolist() == [1.0, 2.0 ** -8, 2.0 ** -127] and np.isnan(v[3])


def test_f32_and_bf16_bytes_are_little_endian():
    x = np.array([1.0, -2.0, 3.5e-38, 1e30], np.float32)
    f32, bf16 = run(lambda v: (nx.f32_bytes(v), nx.bf16_bytes(v)), jnp.asarray(x))
    assert u8(f32) == list(x.tobytes())
    assert u8(bf16) == list(x.astype(ml_dtypes.bfloat16).tobytes())


def test_ceil_log2_is_exact_at_powers_of_two():
    s = jnp.array([1.0, 2.0 ** -20, 0.75, 3.0, 2.0 ** 10 * (1 + 2.0 ** -23)])
    assert np.asarray(run(nx.ceil_log2, s)).tolist() == [0, -20, 0, 2, 11]
