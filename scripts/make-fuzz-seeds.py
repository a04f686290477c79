#!/usr/bin/env python3
"""Writes small GGUF seed files (< 64 KiB each) for fuzz/fuzz_gguf.c into
tests/data/fuzz-seeds/, using the official gguf package's GGUFWriter so the
seeds come from an independent implementation.  Deterministic: running it
again produces the same bytes.  Usage: .venv/bin/python scripts/make-fuzz-seeds.py
"""
import os
import sys

import numpy as np
import gguf

OUT = os.path.join(os.path.dirname(__file__), "..", "tests", "data", "fuzz-seeds")
Q = gguf.GGMLQuantizationType
rng = np.random.default_rng(1234)


def write(name, build, arch="llama"):
    path = os.path.join(OUT, name)
    w = gguf.GGUFWriter(path, arch)
    build(w)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    size = os.path.getsize(path)
    assert size < 65536, (name, size)
    print(f"{name}: {size} bytes")


def raw_tensor(w, name, qtype, ne):
    """Adds a quantized tensor of logical shape ne (ne[0] fastest) with random bytes."""
    block, type_size = gguf.GGML_QUANT_SIZES[qtype]
    row = ne[0] // block * type_size
    rows = int(np.prod(ne[1:])) if len(ne) > 1 else 1
    data = rng.integers(0, 256, size=(rows, row), dtype=np.uint8)
    # GGUFWriter takes the numpy (reversed) byte shape for raw quantized data.
    data = data.reshape(tuple(reversed(ne[1:])) + (row,))
    w.add_tensor(name, data, raw_dtype=qtype)


def scalars(w):
    w.add_uint8("s.u8", 200)
    w.add_int8("s.i8", -5)
    w.add_uint16("s.u16", 60000)
    w.add_int16("s.i16", -300)
    w.add_uint32("s.u32", 7)
    w.add_int32("s.i32", -70000)
    w.add_float32("s.f32", 1.5)
    w.add_bool("s.bool", True)
    w.add_uint64("s.u64", 1 << 40)
    w.add_int64("s.i64", -3)
    w.add_float64("s.f64", 0.25)
    w.add_string("s.str", "hello")
    w.add_array("s.arr_i32", [1, -2, 3])
    w.add_array("s.arr_f32", [0.5, 1.5])
    w.add_array("s.arr_bool", [True, False])


def vocab(w):
    toks = ["<unk>", "<s>", "</s>"] + [f"\u2581t{i}" for i in range(300)] + [f"<0x{i:02X}>" for i in range(256)]
    w.add_tokenizer_model("llama")
    w.add_token_list(toks)
    w.add_token_scores([float(-i) for i in range(len(toks))])
    w.add_token_types([2, 3, 3] + [1] * 300 + [6] * 256)
    w.add_token_merges([f"t{i} t{i + 1}" for i in range(100)])
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)


def model(w):
    w.add_block_count(1)
    w.add_embedding_length(64)
    w.add_context_length(128)
    w.add_head_count(4)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_tensor("token_embd.weight", rng.standard_normal((16, 64)).astype(np.float32))
    w.add_tensor("output_norm.weight", rng.standard_normal(64).astype(np.float16))
    raw_tensor(w, "blk.0.attn_q.weight", Q.Q8_0, [64, 64])
    raw_tensor(w, "blk.0.attn_k.weight", Q.Q4_0, [64, 8])
    raw_tensor(w, "blk.0.attn_v.weight", Q.Q4_1, [64, 8])
    raw_tensor(w, "blk.0.ffn_up.weight", Q.Q4_K, [256, 4])
    raw_tensor(w, "blk.0.ffn_down.weight", Q.Q6_K, [256, 2, 2])
    raw_tensor(w, "blk.0.ffn_gate.weight", Q.Q5_0, [32, 4])


def aligned(w):
    w.add_custom_alignment(64)
    scalars(w)
    w.add_tensor("a", rng.standard_normal((3, 5)).astype(np.float32))
    w.add_tensor("b", rng.standard_normal(7).astype(np.float32))


def main():
    os.makedirs(OUT, exist_ok=True)
    write("empty.gguf", lambda w: None)
    write("scalars.gguf", scalars)
    write("vocab.gguf", vocab)
    write("model.gguf", model)
    write("aligned64.gguf", aligned)
    return 0


if __name__ == "__main__":
    sys.exit(main())
