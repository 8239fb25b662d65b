"""Bad models and bad config files raise ValueError naming the offending value."""
import json

import pytest

import hicache_jax as hc
from hicache_jax.config import model_config_from_dict


def tiny(config_path, name, **changes):
    raw = json.loads(config_path(name).read_text())
    raw.update(changes)
    return raw


def build(raw):
    return hc.build_layout(model_config_from_dict(raw))


@pytest.mark.parametrize("bad", [3, 8, 64, -1, 256])
def test_ratio_outside_allowed_set(config_path, bad):
    raw = tiny(config_path, "tiny_v4", compress_ratios=[0, 0, 4, bad, 4])
    with pytest.raises(ValueError, match=rf"compress_ratios\[3\] = {bad} is not one of 0, 1, 2, 4, 128"):
        build(raw)


@pytest.mark.parametrize("ratio", [1, 2])
def test_v41_ratios_rejected_in_v4(config_path, ratio):
    raw = tiny(config_path, "tiny_v4", compress_ratios=[0, ratio, 4, 128, 4])
    with pytest.raises(ValueError, match=rf"compress_ratios\[1\] = {ratio}: ratios 1 and 2 are DeepSeek-V4.1 only"):
        build(raw)


def test_c128_needs_page_multiple_of_128(config_path):
    raw = tiny(config_path, "tiny_v4", page_size=192)  # multiple of 4, not of 128
    with pytest.raises(ValueError, match="page_size 192 .*compress ratio 128|page_size 192 must be a multiple of 128"):
        build(raw)
    # without C128 layers a 64-token page is fine
    build(tiny(config_path, "tiny_v4", page_size=64, compress_ratios=[0, 0, 4, 0, 4]))


def test_v41_rejects_unified_layout(config_path):
    raw = tiny(config_path, "tiny_v41", kv_layout="unified")
    with pytest.raises(ValueError, match="DeepSeek-V4.1 does not support the unified KV layout yet"):
        build(raw)


def test_unknown_kv_layout(config_path):
    with pytest.raises(ValueError, match=r"kv_layout.*'v5'"):
        build(tiny(config_path, "tiny_v4", kv_layout="v5"))


def test_unknown_indexer_dtype(config_path):
    with pytest.raises(ValueError, match=r"indexer_dtype.*'int8'"):
        build(tiny(config_path, "tiny_v4", indexer_dtype="int8"))


def test_v41_layer_without_preceding_kv_source(config_path):
    raw = tiny(config_path, "tiny_v41", kv_source_layers=[3, 4], index_source_layers=[3, 4])
    with pytest.raises(ValueError, match=r"layer 1 \(ratio 2\) has no preceding kv source"):
        build(raw)


def test_v41_layer_without_preceding_index_source(config_path):
    raw = tiny(config_path, "tiny_v41", index_source_layers=[3, 4, 5])
    with pytest.raises(ValueError, match=r"layer 1 \(ratio 2\) has no preceding index source"):
        build(raw)


def test_v41_consumer_of_other_ratio(config_path):
    # layer 4 (ratio 1) would read layer 3's ratio-2 latent
    raw = tiny(config_path, "tiny_v41", kv_source_layers=[1, 3], index_source_layers=[1, 3])
    with pytest.raises(ValueError, match=r"layer 4 \(ratio 1\) would read kv source layer 3 of ratio 2"):
        build(raw)


def test_v41_source_must_be_low_ratio(config_path):
    raw = tiny(config_path, "tiny_v41", kv_source_layers=[0, 1, 3, 4])
    with pytest.raises(ValueError, match=r"'kv_source_layers' names layer 0 of compress ratio 0"):
        build(raw)


def test_missing_field_is_named(config_path):
    raw = tiny(config_path, "tiny_v4")
    del raw["num_hidden_layers"]
    with pytest.raises(ValueError, match="config field 'num_hidden_layers' is missing"):
        build(raw)


def test_misspelled_field_is_named(config_path):
    raw = tiny(config_path, "tiny_v4")
    raw["sliding_windw"] = raw.pop("sliding_window")
    with pytest.raises(ValueError, match=r"unknown config field 'sliding_windw' \(did you mean 'sliding_window'\?\)"):
        build(raw)


@pytest.mark.parametrize("field,value", [
    ("page_size", "256"), ("num_hidden_layers", 5.0), ("compress_ratios", [0, "4"]),
    ("kv_layout", 4), ("head_dim", True),
])
def test_mistyped_field_is_named(config_path, field, value):
    raw = tiny(config_path, "tiny_v4", **{field: value})
    with pytest.raises(ValueError, match=f"config field '{field}' must be"):
        build(raw)


def test_non_positive_and_short_ratio_list(config_path):
    with pytest.raises(ValueError, match="'page_size' must be positive, got 0"):
        build(tiny(config_path, "tiny_v4", page_size=0))
    with pytest.raises(ValueError, match="'compress_ratios' has 3 entries for num_hidden_layers=5"):
        build(tiny(config_path, "tiny_v4", compress_ratios=[0, 0, 4]))


def test_trailing_draft_layer_ratios_are_ignored(config_path):
    layout = build(tiny(config_path, "tiny_v4", compress_ratios=[0, 0, 4, 128, 4, 0]))
    assert layout.pool("swa").num_layers == 5


def test_load_model_config_names_the_file(tmp_path):
    p = tmp_path / "broken.json"
    p.write_text("{not json")
    with pytest.raises(ValueError, match="broken.json: not valid JSON"):
        hc.load_model_config(p)
    p.write_text(json.dumps({"model_type": "gqa"}))
    with pytest.raises(ValueError, match="broken.json: config field 'num_hidden_layers' is missing"):
        hc.load_model_config(p)


def test_gqa_rejects_sliding_window(config_path):
    with pytest.raises(ValueError, match="'sliding_window' = 128"):
        build(tiny(config_path, "tiny_gqa", sliding_window=128))


def test_build_layout_type_check():
    with pytest.raises(ValueError, match="takes a ModelConfig, got dict"):
        hc.build_layout({"model_type": "gqa"})


@pytest.mark.parametrize("field", ["hidden_size", "num_attention_heads", "vocab_size", "index_topk", "intermediate_size"])
def test_negative_sizes_are_rejected(config_path, field):
    """0 stands for a field a family does not use; a negative size is never valid."""
    with pytest.raises(ValueError, match=rf"config field '{field}' must not be negative, got -128"):
        build(tiny(config_path, "tiny_v4", **{field: -128}))
