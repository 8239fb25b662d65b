"""Every backend keeps the protocol: batched presence, bit-exact gets, puts that skip
existing keys, sizes that expose cut-off or foreign objects; and a tier works over each."""
import numpy as np
import pytest

import hicache_jax as hc
from hicache_jax.storage import HEADER_BYTES, MemoryBackend, StorageConfig, StorageTier, open_backend
from hicache_jax.storage.objects import encode
from storage_helpers import load_layout, needs_mooncake, random_rows, random_tokens, start_mooncake

BACKENDS = ["memory", "ocdbt", "plain", pytest.param("mooncake", marks=needs_mooncake)]


@pytest.fixture(scope="module")
def mooncake(tmp_path_factory):
    server = start_mooncake(tmp_path_factory.mktemp("mooncake"))
    yield server
    server.stop()


@pytest.fixture(params=BACKENDS)
def backend(request, tmp_path):
    if request.param == "memory":
        b = MemoryBackend()
    elif request.param == "mooncake":
        b = open_backend(request.getfixturevalue("mooncake").url)
    else:
        b = open_backend(f"file://{tmp_path}/l3" + ("?layout=plain" if request.param == "plain" else ""))
    yield b
    b.close()


def objects(n, size, seed):
    rng = np.random.default_rng(seed)
    keys = [f"hc1/test{seed}/pool/{i:064x}" for i in range(n)]
    payloads = [rng.integers(0, 256, size, dtype=np.uint8) for _ in range(n)]
    return keys, payloads


def split(n, size):
    headers = np.zeros((n, HEADER_BYTES), np.uint8)
    bodies = np.zeros((n, size), np.uint8)
    return headers, bodies, [(headers[i], bodies[i]) for i in range(n)]


def test_round_trip_presence_and_skip_existing(backend):
    keys, payloads = objects(5, 70_000, seed=1)
    assert backend.contains(keys) == [False] * 5 and backend.exists(keys) == 0
    blobs = [encode(k, p) for k, p in zip(keys, payloads)]
    assert backend.put(keys[:3], [(b[:HEADER_BYTES], p) for b, p in zip(blobs[:3], payloads)]) == [True] * 3
    assert backend.contains(keys) == [True, True, True, False, False] and backend.exists(keys) == 3
    assert backend.exists([keys[0], keys[4], keys[1]]) == 1
    headers, bodies, into = split(5, 70_000)
    sizes = backend.get(keys, into)
    assert sizes == [HEADER_BYTES + 70_000] * 3 + [None, None]
    for i in range(3):
        assert headers[i].tobytes() + bodies[i].tobytes() == blobs[i]
    other = [(blobs[0][:HEADER_BYTES], np.zeros(70_000, np.uint8))]      # a second put leaves the first
    assert backend.put(keys[:1], other) == [True]
    backend.get(keys[:1], into[:1])
    assert bodies[0].tobytes() == payloads[0].tobytes()


def test_sizes_expose_objects_of_another_length(backend):
    keys, payloads = objects(2, 4096, seed=2)
    backend.put(keys, [(encode(k, p)[:HEADER_BYTES], p) for k, p in zip(keys, payloads)])
    _, _, short = split(2, 4000)
    _, _, long = split(2, 5000)
    assert backend.get(keys[:1], short[:1]) == [HEADER_BYTES + 4096]      # stored object is longer
    assert backend.get(keys[1:], long[1:]) == [HEADER_BYTES + 4096]       # stored object is shorter


@pytest.mark.parametrize("name, tp", [("tiny_v4", 1), ("tiny_gqa", 2)])
def test_tier_over_each_backend(backend, name, tp):
    tier = StorageTier(load_layout(name), backend, StorageConfig(call_timeout_s=30), tp=tp)
    pages = tier.page_hashes(random_tokens(3, seed=hash((name, tp)) % 1000))
    for allocator, layout in tier.rows.items():
        rows = random_rows(layout, 3)
        tier.register(rows)
        put = tier.put_pages(allocator, pages, rows, [0, 1, 2])
        assert put.wait(30) and put.result().written == 3 * len(layout.spans)
        out = np.zeros_like(rows)
        got = tier.get_pages(allocator, pages, out, [2, 1, 0])
        assert got.wait(30) and got.result().served == 3
        for seg in layout.spans:
            assert np.array_equal(out[::-1, seg.offset:seg.offset + seg.nbytes], rows[:, seg.offset:seg.offset + seg.nbytes])
    assert tier.usable_prefix(pages) == 3
    assert not tier.stats().failures


@pytest.mark.parametrize("url, match", [
    ("redis://localhost:6379", "unknown storage URL scheme 'redis'"), ("file://relative/dir", "absolute local path"),
    ("file:///tmp/x?compress=1", "unknown option 'compress'"), ("file:///tmp/x?layout=zip", "layout must be"),
    ("gs://", "needs a bucket"), ("mooncake://", "mooncake://host:port"),
    ("mooncake://127.0.0.1:1?segment=lots", "byte count"), ("mooncake://127.0.0.1:1?protocol=udp", "protocol"),
])
def test_bad_urls_raise_value_error(url, match):
    from hicache_jax.storage.urls import check_url
    with pytest.raises(ValueError, match=match):   # its form alone, before anything is opened
        check_url(url)
    with pytest.raises(ValueError, match=match):
        hc.HiCacheConfig(device_pages=4, storage=hc.StorageConfig(url=url))
    with pytest.raises(ValueError, match=match):
        open_backend(url)


def test_url_to_spec():
    from hicache_jax.storage.tensorstore_backend import url_to_spec
    assert url_to_spec("file:///data/l3") == {"driver": "ocdbt", "base": {"driver": "file", "path": "/data/l3/",
                                                                         "file_io_sync": False}}
    assert url_to_spec("file:///data/l3/?layout=plain&sync=1") == {"driver": "file", "path": "/data/l3/",
                                                                   "file_io_sync": True}
    assert url_to_spec("gs://bucket/cache") == {"driver": "ocdbt", "base": "gs://bucket/cache/"}
    assert url_to_spec("s3://bucket/a/b?layout=plain") == "s3://bucket/a/b/"


def test_tensorstore_absent_generation_is_the_one_puts_rely_on(tmp_path):
    from hicache_jax.storage.tensorstore_backend import NO_VALUE
    backend = open_backend(f"file://{tmp_path}")
    assert backend.kvstore.read("absent").result().stamp.generation == NO_VALUE


def test_cut_off_object_in_a_real_store_is_a_truncated_miss(tmp_path):
    tier = StorageTier(load_layout("tiny_v4"), open_backend(f"file://{tmp_path}"))
    pages = tier.page_hashes(random_tokens(2))
    rows = random_rows(tier.rows["kv"], 2)
    assert tier.put_pages("kv", pages, rows, [0, 1]).wait(30)
    key = tier.keys.key("deepseek_v4_c4", pages[1]).text
    kvstore = tier.backend.kvstore
    kvstore.write(key, kvstore.read(key).result().value[:-100]).result()   # a torn write
    op = tier.get_pages("kv", pages, np.zeros_like(rows), [0, 1])
    assert op.wait(30) and op.result().served == 1 and op.result().misses == {"truncated": 1}
    assert tier.stats().pools["deepseek_v4_c4"].misses == {"truncated": 1}


@needs_mooncake
def test_dead_mooncake_master_degrades_without_hanging(tmp_path):
    import time
    server = start_mooncake(tmp_path)
    tier = StorageTier(load_layout("tiny_v4"), open_backend(server.url), StorageConfig(call_timeout_s=5))
    pages = tier.page_hashes(random_tokens(2, seed=3))
    rows = random_rows(tier.rows["kv"], 2)
    assert tier.put_pages("kv", pages, rows, [0, 1]).wait(30) and tier.exists_prefix(pages) == 2
    server.stop()
    t = time.monotonic()
    assert tier.exists_prefix(pages) == 0 and tier.usable_prefix(pages) == 0
    op = tier.get_pages("kv", pages, np.zeros_like(rows), [0, 1])
    assert op.wait(10) and op.result().served == 0
    assert time.monotonic() - t < 10
    s = tier.stats()
    assert s.degraded and s.failures_of("error") == 1 and s.failures_of("unavailable") == 2
    from hicache_jax.storage.mooncake_backend import MooncakeError
    with pytest.raises(MooncakeError, match="every key"):     # what the tier counts as an error
        tier.backend.put(["hc1/x"], [(bytes(HEADER_BYTES), np.zeros(8, np.uint8))])
    tier.close()
