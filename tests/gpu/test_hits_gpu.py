"""On an NVIDIA GPU, with the Mosaic GPU kernels: loads that gather pieces of several host
blocks, by the per-chunk programs and then by their one fused program (early copies of
pieces too), move the right bytes; a step's host hits acquired together (`acquire_many`)
serve each request its own bytes from one engine start (`pytest -m gpu`; skipped elsewhere)."""
import pathlib
import sys

import jax
import pytest

TESTS = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(TESTS / "transfer"))
sys.path.insert(0, str(TESTS / "cache"))
from test_fused_loads import (  # noqa: E402
    test_pieces_copied_early_are_unpacked_by_the_fused_program_and_dropped_without_it as early_pieces,
    test_random_loads_of_pieces_move_the_same_bytes_before_and_after_their_program_compiles as fused_pieces,
)
from test_acquire_many import test_bytes_served_and_one_start_for_many_host_hits as many_hits  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(jax.default_backend() != "gpu", reason="needs an NVIDIA GPU")]


@pytest.mark.parametrize("case", [("tiny_v4", None, "auto"), ("tiny_v41", None, "auto", 2), ("tiny_gqa", None, "auto")],
                         ids=lambda c: "-".join(map(str, c)))
def test_fused_loads_of_pieces_on_the_gpu_kernels(case):
    fused_pieces(case)


@pytest.mark.parametrize("case", [("tiny_v4", None, "auto"), ("tiny_v4", None, "auto", 3)],
                         ids=lambda c: "-".join(map(str, c)))
def test_early_copied_pieces_on_the_gpu_kernels(case):
    early_pieces(case)


@pytest.mark.parametrize("name", ["tiny_v4", "tiny_v41", "tiny_gqa"])
def test_acquire_many_serves_each_request_its_bytes_on_the_gpu(name):
    many_hits(name)
