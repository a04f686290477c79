#!/usr/bin/env python3
"""Tiny synthetic GGUF models (llama / qwen2) in every supported weight type.

Shapes: n_embd 256, n_ff 512, 4 heads of 64, 2 KV heads, 2 layers, vocab 384, ctx 256
(the -ffw variants have per-layer FFN widths, -heads fewer heads and -lheads per-layer head
counts, as `kvant prune` writes).
Random weights with realistic scales; norms ~1 (F32).  Types gguf.quants can quantize
(F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1) are quantized from Gaussian data; Q4_K, Q5_K and
Q6_K (no quantizer in gguf 0.17) are built as random but valid blocks whose f16 scales are
chosen so each block has ~zero mean and the target standard deviation.  MXFP4 (type 39, not in
gguf 0.17 at all; mxfp4_ref.py) is not in TYPES: its blocks have random codes and E8M0 scales
around the target deviation, and wtype "MXFP4-F32" writes the same draws decoded to F32 (the
twin that ref_model.py, through GGUFReader, can read; tests/py/test_mxfp4.py).

    python tests/py/make_synthetic.py OUTDIR [NAME ...]     (default: all variants)
"""
from __future__ import annotations

import os
import sys
import zlib
from dataclasses import dataclass

import numpy as np
import mxfp4_ref
from gguf import GGUFWriter
from gguf import quants
from gguf.constants import GGMLQuantizationType as QT

N_EMBD, N_FF, N_HEAD, N_HEAD_KV, N_LAYER, N_VOCAB, N_CTX = 256, 512, 4, 2, 2, 384, 256
HEAD_DIM = N_EMBD // N_HEAD
EPS = 1e-5

TYPES = ["F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K"]


@dataclass(frozen=True)
class Spec:
    arch: str              # "llama" | "qwen2"
    wtype: str             # type of the 2-D weight matrices
    emb_type: str          # type of token_embd (and of output.weight when untied)
    tied: bool             # no output.weight: logits use token_embd
    freq_base: float | None = None   # None: key absent (default 10000)
    rope_freqs: bool = False          # add rope_freqs.weight (Llama-3.1 style)
    rope_linear: float | None = None  # rope.scaling.type linear with this factor
    ff: tuple[int, ...] | None = None  # per-layer FFN widths (array key), like a pruned model
    heads: tuple[int, int] | None = None  # (n_head, n_head_kv) with key_length 64: q_dim != n_embd
    layer_heads: tuple[tuple[int, int], ...] | None = None  # per-layer (n_head, n_head_kv) arrays


def _variants() -> dict[str, Spec]:
    v: dict[str, Spec] = {}
    for t in TYPES:
        v[f"llama-{t}"] = Spec("llama", t, t, tied=False)      # untied output in type t
        v[f"qwen2-{t}"] = Spec("qwen2", t, t, tied=True)       # tied output (embd in type t)
    v["llama-tied-Q8_0"] = Spec("llama", "Q4_1", "Q8_0", tied=True)   # like SmolLM2 Q4_1
    v["llama-embf32-Q4_K"] = Spec("llama", "Q4_K", "F32", tied=False)
    v["qwen2-untied-Q6_K"] = Spec("qwen2", "Q6_K", "Q6_K", tied=False)
    v["llama-freqbase-F16"] = Spec("llama", "F16", "F16", tied=True, freq_base=100000.0)
    v["llama-ropefreqs-F32"] = Spec("llama", "F32", "F32", tied=False, freq_base=500000.0, rope_freqs=True)
    v["llama-ropefreqs-Q8_0"] = Spec("llama", "Q8_0", "Q8_0", tied=True, freq_base=500000.0, rope_freqs=True)
    v["llama-ropelinear-F32"] = Spec("llama", "F32", "F32", tied=False, rope_linear=4.0)
    # shapes `kvant prune` writes: per-layer FFN widths, fewer heads than n_embd / head_dim
    v["llama-ffw-Q4_1"] = Spec("llama", "Q4_1", "Q8_0", tied=True, ff=(512, 160))
    v["qwen2-ffw-heads-F16"] = Spec("qwen2", "F16", "F16", tied=True, ff=(96, 512), heads=(2, 1))
    # per-layer head counts (KV-head groups pruned unevenly): KV rows differ per layer
    v["llama-lheads-Q8_0"] = Spec("llama", "Q8_0", "Q8_0", tied=True, layer_heads=((4, 2), (2, 1)))
    v["qwen2-lheads-F32"] = Spec("qwen2", "F32", "F32", tied=True, ff=(512, 96),
                                 layer_heads=((2, 1), (4, 2)))
    return v


VARIANTS = _variants()

_BLK = {"Q4_K": 144, "Q5_K": 176, "Q6_K": 210}


def _f16_bytes(a: np.ndarray) -> np.ndarray:
    return a.astype(np.float16).reshape(-1, 1).view(np.uint8)


def _random_kquant(rng: np.random.Generator, rows: int, cols: int, std: float, t: str) -> np.ndarray:
    """Random valid K-quant blocks as uint8 [rows][cols/256*blk]."""
    nb = rows * cols // 256
    qt = QT[t]
    blocks = rng.integers(0, 256, size=(nb, _BLK[t]), dtype=np.uint8)
    if t == "Q6_K":
        sc = rng.integers(-60, 61, size=(nb, 16)).astype(np.int8)
        sc[sc == 0] = 1
        blocks[:, 192:208] = sc.view(np.uint8)
        blocks[:, 208:210] = _f16_bytes(np.ones(nb))
        a = quants.dequantize(blocks, qt).reshape(nb, 256).astype(np.float64)
        d = std / np.maximum(a.std(axis=1), 1e-6)
        blocks[:, 208:210] = _f16_bytes(d)
    else:
        one, zero = _f16_bytes(np.ones(nb)), _f16_bytes(np.zeros(nb))
        blocks[:, 0:2], blocks[:, 2:4] = one, zero
        A = quants.dequantize(blocks, qt).reshape(nb, 256).astype(np.float64)
        blocks[:, 0:2], blocks[:, 2:4] = zero, one
        B = -quants.dequantize(blocks, qt).reshape(nb, 256).astype(np.float64)   # value = d*A - dmin*B
        mb = B.mean(axis=1)
        r = np.where(mb > 0, A.mean(axis=1) / np.maximum(mb, 1e-9), 0.0)
        d = std / np.maximum((A - r[:, None] * B).std(axis=1), 1e-6)
        blocks[:, 0:2], blocks[:, 2:4] = _f16_bytes(d), _f16_bytes(d * r)
    return blocks.reshape(rows, -1)


def _random_mxfp4(rng: np.random.Generator, rows: int, cols: int, std: float) -> np.ndarray:
    """Random MXFP4 blocks as uint8 [rows][cols/32*17]: uniform codes (rms 5.85 in table units),
    E8M0 scale within one step of the one giving `std`."""
    nb = rows * cols // mxfp4_ref.BLOCK
    blocks = rng.integers(0, 256, size=(nb, mxfp4_ref.BLOCK_BYTES), dtype=np.uint8)
    base = 128 + int(round(np.log2(std / np.sqrt(np.mean(mxfp4_ref.KVALUES.astype(float) ** 2)))))
    blocks[:, 0] = base + rng.integers(-1, 2, size=nb)
    return blocks.reshape(rows, -1)


def _tensor(rng: np.random.Generator, shape: tuple[int, int], std: float, t: str):
    """(array, raw_dtype) for GGUFWriter.add_tensor; shape is numpy [rows][cols]."""
    if t in ("MXFP4", "MXFP4-F32"):
        b = _random_mxfp4(rng, shape[0], shape[1], std)
        if t == "MXFP4":   # int8 bytes: GGUFWriter would look up the block size of a uint8 array
            return b.view(np.int8), mxfp4_ref.MXFP4
        return mxfp4_ref.dequantize(b, shape[0] * shape[1]).reshape(shape), None
    if t in _BLK:
        return _random_kquant(rng, shape[0], shape[1], std, t), QT[t]
    x = (rng.standard_normal(shape) * std).astype(np.float32)
    if t == "F32":
        return x, None
    if t == "F16":
        return x.astype(np.float16), None
    return quants.quantize(x, QT[t]), QT[t]


def bytes_to_unicode() -> dict[int, str]:
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


MERGES = ["Ġ t", "h e", "i n", "e r", "a n", "Ġ a", "o n", "Ġt he", "r e", "e n",
          "Ġ s", "Ġ w", "a t", "o r", "n d", "Ġ o", "i s", "Ġ i", "e s", "i t"]


def tokenizer_vocab():
    """(tokens, token_types, merges, bos_id, eos_id)."""
    b2u = bytes_to_unicode()
    tokens = [b2u[b] for b in range(256)]
    types = [1] * 256
    for m in MERGES:
        a, b = m.split(" ")
        assert a in tokens and b in tokens
        tokens.append(a + b)
        types.append(1)
    bos = len(tokens)
    tokens += ["<|bos|>", "<|eos|>"]
    types += [3, 3]
    while len(tokens) < N_VOCAB:
        tokens.append(f"<|tok_{len(tokens)}|>")
        types.append(3)
    return tokens, types, list(MERGES), bos, bos + 1


def add_tokenizer(w: GGUFWriter, tokens, types, merges, bos: int, eos: int) -> None:
    """The byte-level BPE vocabulary's keys (gpt2 model, no BOS added), in this order."""
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(bos)
    w.add_eos_token_id(eos)
    w.add_add_bos_token(False)


def write_model(path: str, spec: Spec, seed: int) -> str:
    rng = np.random.default_rng(seed)
    w = GGUFWriter(path, spec.arch)
    w.add_name(os.path.basename(path))
    w.add_context_length(N_CTX)
    w.add_embedding_length(N_EMBD)
    ffs = list(spec.ff) if spec.ff else [N_FF] * N_LAYER
    n_head, n_head_kv = spec.heads or (N_HEAD, N_HEAD_KV)
    lh = list(spec.layer_heads) if spec.layer_heads else [(n_head, n_head_kv)] * N_LAYER
    w.add_feed_forward_length(ffs if spec.ff else N_FF)
    w.add_block_count(N_LAYER)
    w.add_head_count([h for h, _ in lh] if spec.layer_heads else n_head)
    w.add_head_count_kv([k for _, k in lh] if spec.layer_heads else n_head_kv)
    if spec.heads or spec.layer_heads:
        w.add_key_length(HEAD_DIM)
        w.add_value_length(HEAD_DIM)
    w.add_layer_norm_rms_eps(EPS)
    w.add_rope_dimension_count(HEAD_DIM)
    if spec.freq_base is not None:
        w.add_rope_freq_base(spec.freq_base)
    if spec.rope_linear is not None:
        w.add_string(f"{spec.arch}.rope.scaling.type", "linear")
        w.add_float32(f"{spec.arch}.rope.scaling.factor", spec.rope_linear)
    w.add_vocab_size(N_VOCAB)
    add_tokenizer(w, *tokenizer_vocab())

    def add(name, shape, std, t):
        arr, raw = _tensor(rng, shape, std, t)
        w.add_tensor(name, arr, raw_shape=shape if raw == mxfp4_ref.MXFP4 else None, raw_dtype=raw)

    def add_f32(name, arr):
        w.add_tensor(name, np.ascontiguousarray(arr, dtype=np.float32))

    add("token_embd.weight", (N_VOCAB, N_EMBD), 0.2, spec.emb_type)
    if spec.rope_freqs:
        add_f32("rope_freqs.weight", np.geomspace(1.0, 8.0, HEAD_DIM // 2))
    for L in range(N_LAYER):
        p = f"blk.{L}."
        nff = ffs[L]
        kvd = lh[L][1] * HEAD_DIM
        qd = lh[L][0] * HEAD_DIM
        add_f32(p + "attn_norm.weight", 1.0 + 0.1 * rng.standard_normal(N_EMBD))
        add(p + "attn_q.weight", (qd, N_EMBD), 0.08, spec.wtype)
        add(p + "attn_k.weight", (kvd, N_EMBD), 0.08, spec.wtype)
        add(p + "attn_v.weight", (kvd, N_EMBD), 0.06, spec.wtype)
        if spec.arch == "qwen2":
            add_f32(p + "attn_q.bias", 0.1 * rng.standard_normal(qd))
            add_f32(p + "attn_k.bias", 0.1 * rng.standard_normal(kvd))
            add_f32(p + "attn_v.bias", 0.1 * rng.standard_normal(kvd))
        add(p + "attn_output.weight", (N_EMBD, qd), 0.06, spec.wtype)
        add_f32(p + "ffn_norm.weight", 1.0 + 0.1 * rng.standard_normal(N_EMBD))
        add(p + "ffn_gate.weight", (nff, N_EMBD), 0.06, spec.wtype)
        add(p + "ffn_up.weight", (nff, N_EMBD), 0.06, spec.wtype)
        add(p + "ffn_down.weight", (N_EMBD, nff), 0.044, spec.wtype)
    add_f32("output_norm.weight", 1.0 + 0.1 * rng.standard_normal(N_EMBD))
    if not spec.tied:
        add("output.weight", (N_VOCAB, N_EMBD), 0.2, spec.emb_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def make_model(outdir: str, name: str) -> str:
    """Write variant `name` into outdir (if not already there) and return its path."""
    os.makedirs(outdir, exist_ok=True)
    path = os.path.join(outdir, f"{name}.gguf")
    if not os.path.exists(path):
        tmp = path + ".tmp"
        write_model(tmp, VARIANTS[name], seed=zlib.crc32(name.encode()))
        os.replace(tmp, path)
    return path


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv:
        print(__doc__)
        return 2
    names = argv[1:] or list(VARIANTS)
    for n in names:
        print(make_model(argv[0], n))
    return 0


if __name__ == "__main__":
    sys.exit(main())
