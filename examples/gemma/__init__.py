"""Gemma 3 (text) over HiCache's paged pools: a real model for the chat example.

    modules.py       the model as flax NNX modules, one chunk of positions per call
    attention.py     paged K/V: write a chunk's rows, read the window / every earlier page
    model.py         GemmaModel: the jitted paged-model contract (tiny_models/base.py)
    weights.py       GGUF metadata checks, dequantized weights, the file from the package index
    tokenizer.py     SentencePiece from the GGUF vocabulary, Gemma's chat template
    conversation.py  the chat example's system prompt and users
"""
