"""The SentencePiece tokenizer on a small made-up vocabulary: merge order, byte fallback,
special pieces, decoding and Gemma's chat template. (Against llama.cpp on the real
vocabulary: examples/check_gemma_reference.py, recorded in BENCHMARKS.md.)"""
import numpy as np
import pytest

from examples.gemma.tokenizer import BYTE, CONTROL, NORMAL, USER_DEFINED, Tokenizer

S = "\u2581"


def vocab(normal: dict[str, float]):
    pieces = ["<pad>", "<eos>", "<bos>", "<start_of_turn>", "<end_of_turn>", "\n", "\n\n", "<b>"]
    types = [CONTROL] * 5 + [USER_DEFINED] * 3
    pieces += [f"<0x{b:02X}>" for b in range(256)]
    types += [BYTE] * 256
    pieces += list(normal)
    types += [NORMAL] * len(normal)
    scores = [0.0] * (len(pieces) - len(normal)) + list(normal.values())
    return Tokenizer(pieces, np.asarray(scores), np.asarray(types), bos=2, eos=1)


@pytest.fixture
def tok():
    return vocab({"a": -1, "b": -1, "c": -1, S: -1, "ab": -5, "bc": -2, "abc": -3, f"{S}a": -4})


def piece(t, ids):
    return [t.pieces[i] for i in ids]


def test_highest_score_merges_first(tok):
    # "bc" (-2) beats "ab" (-5); then "a" + "bc" = "abc" exists (-3)
    assert piece(tok, tok.encode("abc", add_bos=False)) == ["abc"]
    # "ab" + "ab": both pairs score -5, leftmost first; "ba" is no piece
    assert piece(tok, tok.encode("abab", add_bos=False)) == ["ab", "ab"]


def test_spaces_become_the_meta_symbol_without_a_leading_one(tok):
    assert piece(tok, tok.encode("a a", add_bos=False)) == ["a", f"{S}a"]
    assert tok.encode("a") == [2] + tok.encode("a", add_bos=False)
    assert tok.encode("") == [2] and tok.encode("", add_bos=False) == []


def test_unknown_characters_fall_back_to_utf8_bytes(tok):
    assert piece(tok, tok.encode("é", add_bos=False)) == ["<0xC3>", "<0xA9>"]
    assert tok.decode(tok.encode("aé b")) == "aé b"


def test_special_pieces_are_cut_first_longest_first(tok):
    ids = tok.encode("<start_of_turn>a\n\n\nab<b>c<end_of_turn>", add_bos=False)
    assert piece(tok, ids) == ["<start_of_turn>", "a", "\n\n", "\n", "ab", "<b>", "c", "<end_of_turn>"]
    assert tok.decode(ids) == "a\n\n\nab<b>c"                  # control pieces left out
    assert tok.decode(ids, skip_special=False) == "<start_of_turn>a\n\n\nab<b>c<end_of_turn>"


def test_chat_template(tok):
    first = tok.chat("SYS", [("q", "a")], "m")
    text = tok.decode(first, skip_special=False)
    assert first[0] == tok.bos
    assert text == ("<bos><start_of_turn>user\nSYS\n\nq<end_of_turn>\n<start_of_turn>model\na<end_of_turn>\n"
                    "<start_of_turn>user\nm<end_of_turn>\n<start_of_turn>model\n")
    assert tok.decode(tok.next_turn(" n "), skip_special=False) == \
        "<end_of_turn>\n<start_of_turn>user\nn<end_of_turn>\n<start_of_turn>model\n"
    assert tok.end_of_turn == 4


def test_vocabulary_arrays_must_agree():
    with pytest.raises(ValueError, match="differ in length"):
        Tokenizer(["a"], np.zeros(2), np.zeros(1), bos=0, eos=0)
