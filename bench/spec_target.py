#!/usr/bin/env python3
"""A ~1.4B-parameter "target" GGUF that computes the 135M draft's function (speculative decoding).

Measuring draft-model speculation needs a target that (a) shares the draft's vocabulary,
(b) agrees with the draft's greedy choices at a realistic high rate, and (c) costs per token
what a real ~1.3B model costs.  This script zero-pads SmolLM2-135M (llama: 30 layers, hidden
576, 9 q heads / 3 kv heads of 64, FFN 1536, vocab 49152, tied embeddings) up to the
TinyLlama-1.1B shape (hidden 2048, 32 q heads / 4 kv heads of 64, FFN 5632), keeping all 30
layers: ~1.42B parameters, 1.5 GB as Q8_0.

Construction (every source tensor dequantized to float32; numpy arrays are [ne1][ne0], i.e.
[out][in] for a matrix, ne0 = input = fastest axis):
  * residual stream 576 -> 2048: token_embd columns 576.. are zero, and so are every matrix's
    output rows / input columns beyond the source's where they touch the residual stream, so
    residual dims 576.. stay exactly zero through every layer.
  * RMSNorm over 2048 dims of which 1520 are zero: mean(x^2) is 576/2048 of the 576-dim
    mean, so x / rms grows by sqrt(2048/576).  Every norm weight (attn_norm, ffn_norm,
    output_norm) is multiplied by sqrt(576/2048) and layer_norm_rms_epsilon by 576/2048:
        x / sqrt(576/2048 * (ms + eps)) * w * sqrt(576/2048) = x / sqrt(ms + eps) * w
    exactly (in real arithmetic).  The zero dims of the norm weights keep them zero.
  * attention: q heads h = 3g + i (i = 0..2, served by kv head g = 0..2 in the source) go to
    new q head 8g + i, served by new kv head g (group size 8 = 32 / 4); kv heads 0..2 stay
    0..2; q heads 3..7, 11..15, 19..31 and kv head 3 are zero.  A zero q head attends
    uniformly over zero v rows (kv head 3) or real v rows, but its attn_output columns are
    zero, so it contributes nothing.  Heads are moved as whole 64-row blocks, so the
    per-head Q/K row permutation llama.cpp's converter applies for rope stays valid; head_dim,
    hence the 1/sqrt(64) score scale and the rope dimension count, are unchanged.
  * FFN 1536 -> 5632: gate/up rows and down columns beyond 1536 are zero (silu(0) * 0 = 0).
  * the source ties the output to token_embd (no output.weight); so does the target.

Every other metadata key (rope, context, tokenizer, chat template) is copied as is; changed:
embedding_length, feed_forward_length, attention.head_count(_kv), layer_norm_rms_epsilon,
general.name, general.size_label and general.file_type.  The function differs from the
draft's only by rounding: the weights are the draft's dequantized Q4_1/Q8_0 values
requantized to --type (Q8_0 by default; norms F32), and sums run over longer vectors.

usage: .venv/bin/python bench/spec_target.py --src models/SmolLM2-135M-Instruct.Q4_1.gguf \\
           --out build/spec/target-1.3b.q8_0.gguf [--type q8_0|f16|q4_0]
           [--shape EMBD,HEADS,KV_HEADS,FF]   (default 2048,32,4,5632; tests/py/test_spec_draft.py
                                             builds a ~0.4B 1024,16,4,3072 one)
Deterministic (no randomness); write under build/ (git-ignored), never into the repository.
"""
from __future__ import annotations

import argparse
import math
import os
import sys

import numpy as np
import gguf
from gguf import GGUFReader, GGUFWriter, GGUFValueType
from gguf.constants import GGMLQuantizationType as QT, LlamaFileType

N_EMBD, N_HEAD, N_HEAD_KV, N_FF = 2048, 32, 4, 5632
DEFAULT_SHAPE = "2048,32,4,5632"
TYPES = {"q8_0": (QT.Q8_0, LlamaFileType.MOSTLY_Q8_0),
         "f16": (QT.F16, LlamaFileType.MOSTLY_F16),
         "q4_0": (QT.Q4_0, LlamaFileType.MOSTLY_Q4_0)}


def field(r: GGUFReader, key: str):
    f = r.fields.get(key)
    if f is None:
        sys.exit(f"spec_target: {key} missing in the source")
    return f.contents()


def dequant(t) -> np.ndarray:
    """float32 array [ne_{n-1}]..[ne0] of a reader tensor."""
    shape = tuple(int(x) for x in reversed(t.shape))
    if t.tensor_type in (QT.F32, QT.F16):
        return np.asarray(t.data, dtype=np.float32).reshape(shape)
    return gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32).reshape(shape)


def head_map(n_head: int, n_head_kv: int) -> list[int]:
    """new q head of each source q head: head i of kv group g -> N_HEAD/N_HEAD_KV * g + i."""
    grp, new_grp = n_head // n_head_kv, N_HEAD // N_HEAD_KV
    return [new_grp * (h // grp) + h % grp for h in range(n_head)]


def pad(name: str, w: np.ndarray, hd: int, qmap: list[int], e: int, ff: int) -> np.ndarray:
    """the zero-padded target tensor of source tensor `name` (float32)."""
    kind = name.split(".")[-2]
    if w.ndim == 1:                                  # norms: scaled, see the docstring
        out = np.zeros(N_EMBD, np.float32)
        out[:e] = w * np.float32(math.sqrt(e / N_EMBD))
        return out
    rows, cols = w.shape
    if kind == "token_embd":
        out = np.zeros((rows, N_EMBD), np.float32)
        out[:, :e] = w
    elif kind == "attn_q":                           # [head*hd out][e in]
        out = np.zeros((N_HEAD * hd, N_EMBD), np.float32)
        for h, nh in enumerate(qmap):
            out[nh * hd:(nh + 1) * hd, :e] = w[h * hd:(h + 1) * hd]
    elif kind in ("attn_k", "attn_v"):               # kv heads keep their index
        out = np.zeros((N_HEAD_KV * hd, N_EMBD), np.float32)
        out[:rows, :e] = w
    elif kind == "attn_output":                      # [e out][head*hd in]
        out = np.zeros((N_EMBD, N_HEAD * hd), np.float32)
        for h, nh in enumerate(qmap):
            out[:e, nh * hd:(nh + 1) * hd] = w[:, h * hd:(h + 1) * hd]
    elif kind in ("ffn_gate", "ffn_up"):             # [ff out][e in]
        out = np.zeros((N_FF, N_EMBD), np.float32)
        out[:ff, :e] = w
    elif kind == "ffn_down":                         # [e out][ff in]
        out = np.zeros((N_EMBD, N_FF), np.float32)
        out[:e, :ff] = w
    elif kind == "output":                           # untied output: [vocab][e]
        out = np.zeros((rows, N_EMBD), np.float32)
        out[:, :e] = w
    else:
        sys.exit(f"spec_target: no padding rule for {name} {w.shape}")
    return out


def copy_kv(r: GGUFReader, w: GGUFWriter, arch: str, skip: set[str]) -> None:
    for key, f in r.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture" or key in skip:
            continue
        vt = f.types[0]
        if vt == GGUFValueType.ARRAY:
            w.add_key_value(key, f.contents(), vt, sub_type=f.types[-1])
        else:
            w.add_key_value(key, f.contents(), vt)


def main(argv: list[str] | None = None) -> int:
    global N_EMBD, N_HEAD, N_HEAD_KV, N_FF
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--src", default="models/SmolLM2-135M-Instruct.Q4_1.gguf")
    ap.add_argument("--out", default="build/spec/target-1.3b.q8_0.gguf")
    ap.add_argument("--type", choices=sorted(TYPES), default="q8_0")
    ap.add_argument("--shape", default=DEFAULT_SHAPE,
                    help="the target's EMBD,HEADS,KV_HEADS,FF")
    a = ap.parse_args(argv)
    N_EMBD, N_HEAD, N_HEAD_KV, N_FF = (int(x) for x in a.shape.split(","))

    r = GGUFReader(a.src)
    arch = field(r, "general.architecture")
    if arch != "llama":
        sys.exit(f"spec_target: {a.src}: architecture {arch}, want llama")
    e = field(r, f"{arch}.embedding_length")
    ff = field(r, f"{arch}.feed_forward_length")
    nh = field(r, f"{arch}.attention.head_count")
    nkv = field(r, f"{arch}.attention.head_count_kv")
    eps = field(r, f"{arch}.attention.layer_norm_rms_epsilon")
    hd = e // nh
    if e % nh or hd != N_EMBD // N_HEAD or nh % nkv or nkv > N_HEAD_KV \
            or nh // nkv > N_HEAD // N_HEAD_KV or e > N_EMBD or ff > N_FF:
        sys.exit(f"spec_target: source shape e={e} ff={ff} heads={nh}/{nkv} does not pad "
                 f"into e={N_EMBD} ff={N_FF} heads={N_HEAD}/{N_HEAD_KV} of {N_EMBD // N_HEAD}")
    qmap = head_map(nh, nkv)
    qt, ftype = TYPES[a.type]
    print(f"source: {a.src}: e={e} ff={ff} heads={nh}/{nkv} head_dim={hd} eps={eps:g}; "
          f"q heads -> {qmap}")

    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    tmp = a.out + ".tmp"
    w = GGUFWriter(tmp, arch)
    new_eps = float(np.float32(eps * e / N_EMBD))
    changed = {f"{arch}.embedding_length": N_EMBD, f"{arch}.feed_forward_length": N_FF,
               f"{arch}.attention.head_count": N_HEAD,
               f"{arch}.attention.head_count_kv": N_HEAD_KV}
    copy_kv(r, w, arch, set(changed) | {f"{arch}.attention.layer_norm_rms_epsilon",
                                        "general.name", "general.size_label",
                                        "general.file_type"})
    for k, v in changed.items():
        w.add_uint32(k, v)
    w.add_float32(f"{arch}.attention.layer_norm_rms_epsilon", new_eps)
    w.add_name(f"{field(r, 'general.name')} zero-padded to {N_EMBD}/{N_FF} (spec target)")
    w.add_file_type(int(ftype))

    n_params = 0
    for t in r.tensors:
        x = pad(t.name, dequant(t), hd, qmap, e, ff)
        n_params += x.size
        if x.ndim == 1:
            w.add_tensor(t.name, x)
        elif qt == QT.F16:
            w.add_tensor(t.name, x.astype(np.float16))
        else:
            w.add_tensor(t.name, gguf.quants.quantize(x, qt), raw_dtype=qt)
    w.add_string("general.size_label", f"{n_params / 1e9:.1f}B")
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    os.replace(tmp, a.out)
    tied = all(t.name != "output.weight" for t in r.tensors)
    print(f"wrote {a.out}: {n_params:,} parameters ({n_params / 1e9:.3f}B, "
          f"{'tied' if tied else 'untied'} output), {a.type}, "
          f"{os.path.getsize(a.out):,} bytes ({os.path.getsize(a.out) / 2**30:.2f} GiB); "
          f"rms eps {eps:g} -> {new_eps:g}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
