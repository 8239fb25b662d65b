"""`hicache_jax.trace`: Mooncake-format traces read and validated, hash ids turned into token ids."""
import gzip
import json

import numpy as np
import pytest

from conftest import ROOT
from hicache_jax.trace import BLOCK_TOKENS, TraceRequest, read_trace, request_tokens

TRACE = ROOT / "traces" / "conversation_trace.jsonl.gz"


def write(tmp_path, records, name="t.jsonl"):
    path = tmp_path / name
    lines = "\n".join(r if isinstance(r, str) else json.dumps(r) for r in records) + "\n"
    if name.endswith(".gz"):
        with gzip.open(path, "wt") as f:
            f.write(lines)
    else:
        path.write_text(lines)
    return path


def rec(ts=0, n_in=600, n_out=5, ids=(1, 2)):
    return {"timestamp": ts, "input_length": n_in, "output_length": n_out, "hash_ids": list(ids)}


def test_reads_the_conversation_trace():
    reqs = read_trace(TRACE, limit=3)
    assert [r.index for r in reqs] == [0, 1, 2]
    assert reqs[0] == TraceRequest(0, 0.0, 6758, 500, tuple(range(14)))
    assert reqs[1].hash_ids[:2] == (0, 14)


def test_plain_and_gzip_read_the_same(tmp_path):
    records = [rec(0), rec(5, 1024, 0, (1, 3)), rec(5.5, 1, 1, (9,))]
    plain, packed = read_trace(write(tmp_path, records)), read_trace(write(tmp_path, records, "t.jsonl.gz"))
    assert plain == packed and len(plain) == 3 and plain[2].timestamp_ms == 5.5


@pytest.mark.parametrize("bad, field", [
    ({"timestamp": 0, "input_length": 600, "output_length": 1}, "'hash_ids' is missing"),
    (rec(ts=-1), "'timestamp'"), (rec(ts="0"), "'timestamp'"),
    (rec(n_in=0, ids=()), "'input_length'"), (rec(n_in=True), "'input_length'"),
    (rec(n_out=-2), "'output_length'"), (rec(ids=(1, "2")), "'hash_ids'"), (rec(ids=(1, -2)), "'hash_ids'"),
    (rec(n_in=600, ids=(1,)), "has 1 ids; input_length 600 needs 2"),
    ("[1, 2]", "JSON object"), ("{not json", "not valid JSON"),
])
def test_a_bad_record_names_its_line_and_field(tmp_path, bad, field):
    path = write(tmp_path, [rec(0), bad])
    with pytest.raises(ValueError, match=f"t.jsonl:2: .*{field}"):
        read_trace(path)


def test_timestamps_must_not_go_back(tmp_path):
    with pytest.raises(ValueError, match=r":2: field 'timestamp' goes back in time"):
        read_trace(write(tmp_path, [rec(10), rec(9)]))


def test_limit_reads_only_the_first_requests(tmp_path):
    path = write(tmp_path, [rec(0), rec(1), "{broken"])
    assert len(read_trace(path, limit=2)) == 2          # the broken third line is never read
    with pytest.raises(ValueError, match="limit"):
        read_trace(path, limit=-1)


def test_equal_hash_ids_give_equal_blocks_wherever_they_are():
    a = TraceRequest(0, 0, 3 * BLOCK_TOKENS, 0, (7, 3, 12))
    b = TraceRequest(1, 0, 2 * BLOCK_TOKENS + 90, 0, (7, 12, 3))
    ta, tb = request_tokens(a, 1000), request_tokens(b, 1000)
    assert ta.dtype == np.int32 and ta.shape == (3 * 512,) and tb.shape == (2 * 512 + 90,)
    assert np.array_equal(ta[:512], tb[:512])                     # block 7 at position 0 in both
    assert np.array_equal(ta[1024:], tb[512:1024])               # block 12 at another position
    assert np.array_equal(ta[512:602], tb[1024:])                # block 3, cut to input_length
    assert not np.array_equal(ta[512:1024], ta[1024:])           # different ids differ
    assert ta.min() >= 1 and ta.max() <= 999


def test_tokens_depend_on_seed_vocab_and_cut_only_as_documented():
    r = TraceRequest(0, 0, 1000, 0, (5, 6))
    base = request_tokens(r, 50)
    assert np.array_equal(base, request_tokens(r, 50))
    assert not np.array_equal(base, request_tokens(r, 50, seed=1))
    assert np.array_equal(request_tokens(r, 50, max_tokens=700), base[:700])
    assert np.array_equal(request_tokens(r, 50, max_tokens=5000), base)
    assert set(np.unique(request_tokens(r, 2)).tolist()) == {1}
    for kwargs in ({"vocab": 1}, {"vocab": 50, "max_tokens": 0}, {"vocab": 50, "seed": -1}):
        with pytest.raises(ValueError):
            request_tokens(r, **kwargs)
