#!/usr/bin/env python3
"""Synthetic TinyLlama-1.1B-shaped GGUF models for `kvant bench` (speed only).

Shape: llama, 22 layers, hidden 2048, 32 heads, 4 KV heads, FFN 5632,
vocab 32000, ctx 2048, untied output.  Weights are random but valid blocks
written directly as bytes (no quantizer: fast), with f16 scales chosen so
each weight has std ~0.02 and ~zero mean; norms are 1.  The tokenizer is a
minimal byte-level gpt2 one (256 byte tokens, one merge, bos/eos,
fillers).

    .venv/bin/python bench/make_tinyllama.py OUTDIR [Q4_0 Q4_1 Q5_0 Q5_1 Q8_0 Q4_K Q5_K Q6_K F16]

Writes OUTDIR/tinyllama-1.1b-<TYPE>.gguf (~0.6-1.2 GB each, 2.2 GB for F16: the
weight-offload measurement in docs/PERFORMANCE.md); generate into
build/bench/ (git-ignored), never into the repository.
"""
from __future__ import annotations

import os
import sys

import numpy as np
from gguf import GGUFWriter
from gguf.constants import GGMLQuantizationType as QT

N_EMBD, N_FF, N_HEAD, N_HEAD_KV, N_LAYER, N_VOCAB, N_CTX = 2048, 5632, 32, 4, 22, 32000, 2048
HEAD_DIM = N_EMBD // N_HEAD
STD = 0.02
# type -> (block elements, block bytes)
BLOCK = {"Q4_0": (32, 18), "Q4_1": (32, 20), "Q5_0": (32, 22), "Q5_1": (32, 24),
         "Q8_0": (32, 34), "Q4_K": (256, 144), "Q5_K": (256, 176), "Q6_K": (256, 210)}


def _f16(v: float, n: int) -> np.ndarray:
    return np.full((n, 1), v, dtype=np.float16).view(np.uint8)


def random_blocks(rng: np.random.Generator, rows: int, cols: int, t: str) -> np.ndarray:
    """uint8 [rows][cols/QK*bytes] of valid blocks with std ~STD."""
    qk, bb = BLOCK[t]
    nb = rows * cols // qk
    b = rng.integers(0, 256, size=(nb, bb), dtype=np.uint8)
    if t == "Q4_0":            # (q - 8) * d, q uniform 0..15: std 4.6 d
        b[:, 0:2] = _f16(STD / 4.6, nb)
    elif t == "Q4_1":          # q * d + m
        d = STD / 4.6
        b[:, 0:2], b[:, 2:4] = _f16(d, nb), _f16(-7.5 * d, nb)
    elif t == "Q5_0":          # (q - 16) * d, q uniform 0..31: std 9.2 d
        b[:, 0:2] = _f16(STD / 9.2, nb)
    elif t == "Q5_1":          # q * d + m
        d = STD / 9.2
        b[:, 0:2], b[:, 2:4] = _f16(d, nb), _f16(-15.5 * d, nb)
    elif t == "Q8_0":          # q * d, q uniform int8: std 74 d
        b[:, 0:2] = _f16(STD / 74.0, nb)
    elif t == "Q6_K":          # (q - 32) * sc * d, sc int8: std 18.5 * 74 d
        b[:, 208:210] = _f16(STD / (18.5 * 74.0), nb)
    else:                      # Q4_K, Q5_K: d * sc * q - dmin * m, sc, m 6-bit
        sd = 4.6 if t == "Q4_K" else 9.2
        d = STD / (32 * sd)
        b[:, 0:2], b[:, 2:4] = _f16(d, nb), _f16(sd * 1.6 * d, nb)
    return b.reshape(rows, -1)


def tokenizer():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    cs, n = bs[:], 0
    for x in range(256):
        if x not in bs:
            bs.append(x)
            cs.append(256 + n)
            n += 1
    b2u = dict(zip(bs, map(chr, cs)))
    tokens = [b2u[x] for x in range(256)]
    types = [1] * 256
    tokens.append("\u0120t")  # one merge ("Ġ t"): the reader needs a non-empty list
    types.append(1)
    bos = len(tokens)
    tokens += ["<|bos|>", "<|eos|>"]
    types += [3, 3]
    while len(tokens) < N_VOCAB:
        tokens.append(f"<|tok_{len(tokens)}|>")
        types.append(3)
    return tokens, types, bos, bos + 1


def write(path: str, t: str, seed: int = 1) -> None:
    rng = np.random.default_rng(seed)
    w = GGUFWriter(path, "llama")
    w.add_name(f"tinyllama-1.1b-synthetic-{t}")
    w.add_context_length(N_CTX)
    w.add_embedding_length(N_EMBD)
    w.add_feed_forward_length(N_FF)
    w.add_block_count(N_LAYER)
    w.add_head_count(N_HEAD)
    w.add_head_count_kv(N_HEAD_KV)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_dimension_count(HEAD_DIM)
    w.add_vocab_size(N_VOCAB)
    tokens, types, bos, eos = tokenizer()
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(["\u0120 t"])
    w.add_bos_token_id(bos)
    w.add_eos_token_id(eos)

    def add(name, rows, cols):
        if t == "F16":  # normal with std STD
            w.add_tensor(name, (rng.standard_normal((rows, cols), dtype=np.float32) * STD)
                         .astype(np.float16))
            return
        w.add_tensor(name, random_blocks(rng, rows, cols, t), raw_dtype=QT[t])

    def ones(name):
        w.add_tensor(name, np.ones(N_EMBD, dtype=np.float32))

    kvd = N_HEAD_KV * HEAD_DIM
    add("token_embd.weight", N_VOCAB, N_EMBD)
    for L in range(N_LAYER):
        p = f"blk.{L}."
        ones(p + "attn_norm.weight")
        add(p + "attn_q.weight", N_EMBD, N_EMBD)
        add(p + "attn_k.weight", kvd, N_EMBD)
        add(p + "attn_v.weight", kvd, N_EMBD)
        add(p + "attn_output.weight", N_EMBD, N_EMBD)
        ones(p + "ffn_norm.weight")
        add(p + "ffn_gate.weight", N_FF, N_EMBD)
        add(p + "ffn_up.weight", N_FF, N_EMBD)
        add(p + "ffn_down.weight", N_EMBD, N_FF)
    ones("output_norm.weight")
    add("output.weight", N_VOCAB, N_EMBD)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__)
        return 2
    os.makedirs(argv[0], exist_ok=True)
    for t in argv[1:] or list(BLOCK):
        path = os.path.join(argv[0], f"tinyllama-1.1b-{t}.gguf")
        if not os.path.exists(path):
            write(path + ".tmp", t)
            os.replace(path + ".tmp", path)
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
