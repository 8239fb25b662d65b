"""On an NVIDIA GPU: the decode example, overlapped or not, is bit-identical to recompute,
compiles nothing and runs no transfer program for the first time while it serves
(`pytest -m gpu`; skipped elsewhere).

Each case runs `examples/decode.py` in this process (models and transfer programs of equal
shapes are compiled once per process) and appends its JSON line to the file named by
`HICACHE_GPU_RESULTS`, when set, for the benchmark tables.
"""
import json
import os

import jax
import pytest

from examples import decode

pytestmark = [pytest.mark.gpu, pytest.mark.slow,
              pytest.mark.skipif(jax.default_backend() != "gpu", reason="needs an NVIDIA GPU")]

# (config, seed, device pages, host pages, write policy, layer groups; None: no --overlap)
CASES = [
    ("tiny_v4", 9090, 8, 32, "write_through", None), ("tiny_v4", 9090, 8, 32, "write_through", 1),
    ("tiny_v4", 9090, 8, 32, "write_through", 2), ("tiny_v4", 9090, 8, 32, "write_through", 4),
    ("tiny_v4", 5150, 8, 32, "write_back", 2), ("tiny_v4", 1, 8, 32, "write_through_selective", 2),
    ("tiny_v41", 5150, 9, 40, "write_through", None), ("tiny_v41", 5150, 9, 40, "write_through", 1),
    ("tiny_v41", 5150, 9, 40, "write_through", 2), ("tiny_v41", 5150, 9, 40, "write_through", 4),
    ("tiny_v41", 9090, 9, 40, "write_back", 2),
    ("tiny_gqa", 9090, 8, 32, "write_through", None), ("tiny_gqa", 9090, 8, 32, "write_through", 2),
    ("tiny_gqa", 9090, 8, 32, "write_through", 4), ("tiny_gqa", 5150, 8, 32, "write_back", 2),
    ("tiny_gqa", 5150, 9, 40, "write_through", 2),
]


def run_decode(capsys, config, seed, dev, host, policy, groups) -> dict:
    argv = ["--config", f"configs/{config}.json", "--seed", str(seed), "--device-pages", str(dev),
            "--host-pages", str(host), "--write-policy", policy, "--quiet"]
    if groups is not None:
        argv += ["--overlap", "--layer-groups", str(groups)]
    rc = decode.main(argv)
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    out.update(rc=rc, seed=seed, device_pages=dev, host_pages=host, layer_groups=groups,
               jax=jax.__version__, device=jax.devices()[0].device_kind)
    if os.environ.get("HICACHE_GPU_RESULTS"):
        with open(os.environ["HICACHE_GPU_RESULTS"], "a") as f:
            f.write(json.dumps(out) + "\n")
    return out


@pytest.mark.parametrize("config, seed, dev, host, policy, groups", CASES,
                         ids=lambda v: str(v) if v is not None else "blocking")
def test_decode_is_bit_identical_and_compiles_nothing_while_serving(capsys, config, seed, dev, host, policy, groups):
    out = run_decode(capsys, config, seed, dev, host, policy, groups)
    assert out["identical"] and out["rc"] == 0
    assert out["compiles_while_serving"] == 0
    assert out["first_program_runs_while_serving"] == 0    # warm-up ran them (on a GPU: loaded their kernels)
    assert out["host_hit_tokens"] > 0
    if groups is not None:     # the step landed host hits itself, every layer group included
        assert out["deferred_loads"].get("step", 0) > 0, out["deferred_loads"]
