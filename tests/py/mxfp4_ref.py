"""MXFP4 (GGUF type 39) in numpy, written from the OCP Microscaling Formats spec v1.0 and
ggml's block layout, not from kvant: gguf 0.17 (tests/requirements.txt) has no MXFP4, neither
in gguf.quants nor in GGUFReader (which refuses a file holding a type-39 tensor), so the tests
use this decoder, this encoder and the small GGUF table reader below.

Block (17 bytes, 32 values): byte 0 = E8M0 scale e, bytes 1..16 = codes, value j < 16 in the
low nibble of byte 1 + j, value j >= 16 in the high nibble of byte 1 + j - 16.  Value =
E2M1(code) * 2^(e - 127), i.e. KVALUES[code] * 2^(e - 128) with the E2M1 values doubled
(ggml's kvalues_mxfp4).  e = 255 (NaN in the spec) is 2^127 as in ggml.

Encoder (ggml's quantize_row_mxfp4_ref): per block e = floor(log2(max |x|)) - 2 + 127 (0 for an
all-zero block, clipped to 0..254), d = 2^(e - 128), code = argmin |KVALUES[i] * d - x| in f32,
the first index on ties.  floor(log2) is taken exactly here (frexp); ggml's floorf(log2f()) can
only differ for max |x| within a few ulps below a power of two, which f16 sources never are.
"""
from __future__ import annotations

import struct

import numpy as np

MXFP4 = 39
BLOCK = 32
BLOCK_BYTES = 17
E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]
KVALUES = np.array([2 * v for v in E2M1] + [-2 * v for v in E2M1], dtype=np.int8)


def dequantize(raw: np.ndarray, n_values: int) -> np.ndarray:
    """Bytes of ceil(n_values/32) blocks -> float32 [n_values] (+-inf where 12 * 2^(e-128) overflows)."""
    b = np.asarray(raw, dtype=np.uint8).reshape(-1, BLOCK_BYTES)
    e = b[:, 0].astype(np.int64)
    codes = np.concatenate([b[:, 1:] & 0x0F, b[:, 1:] >> 4], axis=1)
    with np.errstate(over="ignore"):
        v = np.ldexp(KVALUES[codes].astype(np.float64), (e - 128)[:, None]).astype(np.float32)
    return v.reshape(-1)[:n_values]


def _e8m0_half(e: np.ndarray) -> np.ndarray:
    return np.ldexp(np.float64(1.0), e.astype(np.int64) - 128).astype(np.float32)


def quantize(x: np.ndarray) -> np.ndarray:
    """float32 [..., n] (n % 32 == 0) -> uint8 [..., n / 32 * 17]."""
    x = np.asarray(x, dtype=np.float32)
    lead = x.shape[:-1]
    b = x.reshape(-1, BLOCK)
    amax = np.abs(b).max(axis=1)
    _, ex = np.frexp(amax)                      # amax = m 2^ex, m in [0.5, 1): floor(log2) = ex - 1
    e = np.where(amax > 0, np.clip(ex.astype(np.int64) - 1 - 2 + 127, 0, 254), 0).astype(np.uint8)
    d = _e8m0_half(e)
    cand = KVALUES.astype(np.float32)[None, None, :] * d[:, None, None]
    codes = np.argmin(np.abs(cand - b[:, :, None]), axis=2).astype(np.uint8)   # first minimum
    out = np.empty((b.shape[0], BLOCK_BYTES), dtype=np.uint8)
    out[:, 0] = e
    out[:, 1:] = codes[:, :16] | (codes[:, 16:] << 4)
    return out.reshape(*lead, -1)


# ---- the GGUF tensor table (header, key/values skipped or read, tensor infos) ----

_SCALAR = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q",
           12: "<d"}


def _read_value(buf: bytes, off: int, vtype: int):
    if vtype in _SCALAR:
        fmt = _SCALAR[vtype]
        return struct.unpack_from(fmt, buf, off)[0], off + struct.calcsize(fmt)
    if vtype == 8:   # string
        (n,) = struct.unpack_from("<Q", buf, off)
        return buf[off + 8:off + 8 + n].decode("utf-8", "replace"), off + 8 + n
    if vtype == 9:   # array
        sub, n = struct.unpack_from("<IQ", buf, off)
        off += 12
        items = []
        for _ in range(n):
            v, off = _read_value(buf, off, sub)
            items.append(v)
        return items, off
    raise ValueError(f"GGUF value type {vtype}")


def read_table(path: str):
    """(kv: dict, tensors: dict name -> (type, [ne0, ne1, ...], absolute data offset))."""
    buf = open(path, "rb").read()
    magic, version, n_t, n_kv = struct.unpack_from("<4sIQQ", buf, 0)
    assert magic == b"GGUF" and version == 3, (magic, version)
    off, kv = 24, {}
    for _ in range(n_kv):
        key, off = _read_value(buf, off, 8)
        (vt,) = struct.unpack_from("<I", buf, off)
        kv[key], off = _read_value(buf, off + 4, vt)
    infos = []
    for _ in range(n_t):
        name, off = _read_value(buf, off, 8)
        (nd,) = struct.unpack_from("<I", buf, off)
        ne = list(struct.unpack_from(f"<{nd}Q", buf, off + 4))
        t, rel = struct.unpack_from("<IQ", buf, off + 4 + 8 * nd)
        off += 4 + 8 * nd + 12
        infos.append((name, t, ne, rel))
    align = int(kv.get("general.alignment", 32))
    base = (off + align - 1) // align * align
    return kv, {name: (t, ne, base + rel) for name, t, ne, rel in infos}


def tensor_bytes(path: str, entry) -> np.ndarray:
    """Raw bytes of an MXFP4 tensor entry from read_table."""
    t, ne, at = entry
    assert t == MXFP4, t
    n = int(np.prod(ne))
    return np.fromfile(path, dtype=np.uint8, count=n // BLOCK * BLOCK_BYTES, offset=at)
