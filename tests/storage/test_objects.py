"""The object format: header + payload; anything but the expected object is a miss with a reason."""
import numpy as np
import pytest

from hicache_jax.storage.objects import (CORRUPT, HEADER_BYTES, MAX_KEY_BYTES, MissReason, encode, make_header,
                                         verify)

KEY = "hc1/0123456789abcdef/deepseek_v4_c4/" + "ab" * 32


def split(blob: bytes, payload_bytes: int):
    header = bytearray(HEADER_BYTES)
    payload = bytearray(payload_bytes)
    n = min(len(blob), HEADER_BYTES)
    header[:n] = blob[:n]
    rest = blob[HEADER_BYTES:HEADER_BYTES + payload_bytes]
    payload[:len(rest)] = rest
    return header, payload


def test_round_trip_and_layout():
    payload = np.random.default_rng(0).integers(0, 256, 10_000, dtype=np.uint8)
    blob = encode(KEY, payload)
    assert len(blob) == HEADER_BYTES + payload.nbytes and blob[:4] == b"HCL3"
    header, body = split(blob, payload.nbytes)
    assert verify(KEY, len(blob), header, body) is None
    assert bytes(body) == payload.tobytes()


@pytest.mark.parametrize("damage, reason", [
    ("flip_payload", MissReason.CHECKSUM), ("flip_magic", MissReason.BAD_HEADER),
    ("version", MissReason.BAD_HEADER), ("other_key", MissReason.FOREIGN), ("cut", MissReason.TRUNCATED),
    ("longer", MissReason.OVERSIZE), ("other_length", MissReason.FOREIGN), ("absent", MissReason.ABSENT),
])
def test_damaged_objects_are_misses_with_a_reason(damage, reason):
    payload = np.arange(4096, dtype=np.uint8)
    blob = bytearray(encode(KEY, payload))
    size = len(blob)
    key = KEY
    if damage == "flip_payload":
        blob[HEADER_BYTES + 77] ^= 1
    elif damage == "flip_magic":
        blob[1] ^= 0xFF
    elif damage == "version":
        blob[4] = 99
    elif damage == "other_key":
        key = KEY[:-1] + "0"
    elif damage == "cut":
        size -= 1
    elif damage == "longer":
        size += 1
    elif damage == "other_length":   # a consistent object of another page length, read into this length
        blob = bytearray(encode(KEY, payload[:2048]) + bytes(2048))
    elif damage == "absent":
        size = None
    header, body = split(bytes(blob), payload.nbytes)
    assert verify(key, size, header, body) is reason
    assert (reason in CORRUPT) == (damage != "absent")


def test_key_longer_than_the_header_is_refused():
    make_header("k" * MAX_KEY_BYTES, b"x")
    with pytest.raises(ValueError, match="exceeds"):
        make_header("k" * (MAX_KEY_BYTES + 1), b"x")
