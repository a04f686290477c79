#!/usr/bin/env python3
"""make-quant-vectors.py - independent test vectors for src/kernels/quant_ref.c.

Uses gguf.quants (the gguf Python package's numpy implementation, written
independently of ggml's C code) as the reference.  For each type it writes,
under tests/data/quant-vectors/:
  <name>.blk   random blocks (random bytes, with the f16 scale fields set to
               finite random values so no block decodes to inf/nan)
  <name>.f32   gguf.quants.dequantize(<name>.blk), little-endian f32
and for the types gguf.quants can quantize:
  <name>.src   random normal f32 input
  <name>.qnt   gguf.quants.quantize(<name>.src)
tests/unit/test_dtype.c reads them.  Deterministic (fixed seed); rerun with
  .venv/bin/python scripts/make-quant-vectors.py
"""
import os
import sys

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import quants
from gguf.constants import GGML_QUANT_SIZES

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "data", "quant-vectors")

# name -> (type, byte offsets of f16 scale fields inside a block)
TYPES = {
    "f16": (T.F16, None),
    "bf16": (T.BF16, None),
    "q4_0": (T.Q4_0, [0]),
    "q4_1": (T.Q4_1, [0, 2]),
    "q5_0": (T.Q5_0, [0]),
    "q5_1": (T.Q5_1, [0, 2]),
    "q8_0": (T.Q8_0, [0]),
    "q4_K": (T.Q4_K, [0, 2]),
    "q5_K": (T.Q5_K, [0, 2]),
    "q6_K": (T.Q6_K, [208]),
}
QUANTIZABLE = {"f16", "bf16", "q4_0", "q4_1", "q5_0", "q5_1", "q8_0"}
N_ELEMS = 1024  # per type: 32 legacy blocks or 4 K blocks


def random_blocks(rng, qtype, scale_offsets):
    bs, ts = GGML_QUANT_SIZES[qtype]
    nb = N_ELEMS // bs
    if scale_offsets is None:  # f16 / bf16: encode random normal values
        x = rng.standard_normal(N_ELEMS).astype(np.float32)
        return quants.quantize(x, qtype).reshape(-1).view(np.uint8)
    raw = rng.integers(0, 256, size=(nb, ts), dtype=np.uint8)
    for off in scale_offsets:
        d = (rng.standard_normal(nb) * 0.05).astype(np.float16)
        raw[:, off:off + 2] = d.view(np.uint8).reshape(nb, 2)
    return raw.reshape(-1)


def main():
    os.makedirs(OUT, exist_ok=True)
    rng = np.random.default_rng(20240607)
    for name, (qtype, offs) in TYPES.items():
        blk = random_blocks(rng, qtype, offs)
        deq = quants.dequantize(blk, qtype).astype("<f4").reshape(-1)
        assert deq.size == N_ELEMS and np.all(np.isfinite(deq))
        blk.tofile(os.path.join(OUT, name + ".blk"))
        deq.tofile(os.path.join(OUT, name + ".f32"))
        if name in QUANTIZABLE:
            src = rng.standard_normal(N_ELEMS).astype("<f4")
            qnt = quants.quantize(src, qtype).reshape(-1).view(np.uint8)
            src.tofile(os.path.join(OUT, name + ".src"))
            qnt.tofile(os.path.join(OUT, name + ".qnt"))
    print("wrote", len(TYPES), "types to", os.path.normpath(OUT), file=sys.stderr)


if __name__ == "__main__":
    main()
