/* qpack.c - packing weight rows into the group-interleaved layout and
 * interleaving activation codes (layouts in qpack.h). */
#include "kernels/qpack.h"

#include <string.h>

#include "kernels/blocks.h"

#define K4_HEAD 16 /* d, dmin, scales of a q4_K/q5_K super-block */
#define QP_GROUP_MAX (QACT_LANES * sizeof(block_q8_0)) /* largest group, q8_0 */

static size_t block_bytes(uint32_t t)
{
    switch (t) {
    case DT_Q4_0: return sizeof(block_q4_0);
    case DT_Q4_1: return sizeof(block_q4_1);
    case DT_Q8_0: return sizeof(block_q8_0);
    case DT_MXFP4: return sizeof(block_mxfp4);
    case DT_Q5_0: return sizeof(block_q5_0);
    case DT_Q5_1: return sizeof(block_q5_1);
    case DT_Q4_K: return sizeof(block_q4_K) / 8; /* per 32-value chunk */
    case DT_Q5_K: return sizeof(block_q5_K) / 8;
    case DT_Q6_K: return sizeof(block_q6_K) / 8; /* 26.25: use for 8 chunks only */
    default: return 0;
    }
}

/* Bytes of tc stored chunks (K types: whole super-blocks, tc % 8 == 0). */
static size_t group_bytes(uint32_t t, int tc)
{
    if (t == DT_Q6_K)
        return (size_t)(tc / 8) * sizeof(block_q6_K);
    return (size_t)tc * block_bytes(t);
}

static int is_k(uint32_t t)
{
    return t == DT_Q4_K || t == DT_Q5_K || t == DT_Q6_K;
}

int qpack_supported(uint32_t type, int64_t n)
{
    const int64_t unit = is_k(type) ? QK_K : QACT_CHUNK;
    return block_bytes(type) != 0 && n > 0 && n % unit == 0;
}

/* q4_K: the nibbles of chunk c of a group of stored super-blocks g, and
 * whether its codes are the high nibbles (odd chunks of a pair). */
static uint8_t *k4_nibbles(uint8_t *g, int c, int *high)
{
    block_q4_K *b = (block_q4_K *)(g + (size_t)(c / 8) * sizeof(block_q4_K));
    *high = (c % 8) & 1;
    return b->qs + 32 * ((c % 8) / 2);
}

static void set_code(uint32_t t, uint8_t *blk, int p, int v)
{
    if (t == DT_Q8_0) {
        ((block_q8_0 *)blk)->qs[p] = (int8_t)v;
        return;
    }
    uint8_t *qs = t == DT_Q4_0    ? ((block_q4_0 *)blk)->qs
                  : t == DT_MXFP4 ? ((block_mxfp4 *)blk)->qs
                                  : ((block_q4_1 *)blk)->qs;
    if (p < 16)
        qs[p] = (uint8_t)((qs[p] & 0xF0) | v);
    else
        qs[p - 16] = (uint8_t)((qs[p - 16] & 0x0F) | (v << 4));
}

/* Bytes of scales at the head of a packed group of tc blocks. */
static size_t head_bytes(uint32_t t, int tc)
{
    if (t == DT_Q4_K) /* d, dmin, scales[12] of each super-block */
        return (size_t)(tc / 8) * K4_HEAD;
    if (t == DT_MXFP4) /* one E8M0 byte per block */
        return (size_t)tc;
    return (size_t)(t == DT_Q4_1 ? 2 : 1) * (size_t)tc * sizeof(half_fp16);
}

/* Value position held by byte b of code vector r (q8_0: r < 8; q4: the
 * low (h = 0) or high (h = 1) nibble of byte b of load r < 4). */
static int pos_of(uint32_t t, int r, int h, int b)
{
    return t == DT_Q8_0 ? 4 * r + b % 4 : 8 * r + 4 * h + b % 4;
}

/* The layout of qpack.h written directly from the stored blocks (the
 * inverse, unpack_group, goes through set_code/pos_of; the tests check
 * that one undoes the other). */
static void pack_group_k4(int tc, const uint8_t *in, uint8_t *out)
{
    const int L = 4 * tc;
    for (int sb = 0; sb < tc / 8; sb++)
        memcpy(out + K4_HEAD * sb, in + sizeof(block_q4_K) * sb, K4_HEAD);
    uint8_t *qs = out + head_bytes(DT_Q4_K, tc);
    for (int c = 0; c < tc; c++) {
        int hi;
        const uint8_t *q = k4_nibbles((uint8_t *)in, c, &hi);
        for (int i = 0; i < 4; i++)
            for (int j = 0; j < 4; j++) {
                const int lo_v = (hi ? q[8 * i + j] >> 4 : q[8 * i + j] & 0x0F);
                const int hi_v = (hi ? q[8 * i + 4 + j] >> 4 : q[8 * i + 4 + j] & 0x0F);
                qs[L * i + 4 * c + j] = (uint8_t)(lo_v | (hi_v << 4));
            }
    }
}

static void unpack_group_k4(int tc, const uint8_t *in, uint8_t *out)
{
    const int L = 4 * tc;
    for (int sb = 0; sb < tc / 8; sb++)
        memcpy(out + sizeof(block_q4_K) * sb, in + K4_HEAD * sb, K4_HEAD);
    const uint8_t *qs = in + head_bytes(DT_Q4_K, tc);
    for (int c = 0; c < tc; c++) {
        int hi;
        uint8_t *q = k4_nibbles(out, c, &hi);
        for (int i = 0; i < 4; i++)
            for (int j = 0; j < 4; j++) {
                const uint8_t v = qs[L * i + 4 * c + j];
                const int ps[2] = {8 * i + j, 8 * i + 4 + j}, vs[2] = {v & 0x0F, v >> 4};
                for (int e = 0; e < 2; e++)
                    q[ps[e]] = (uint8_t)(hi ? (q[ps[e]] & 0x0F) | (vs[e] << 4)
                                            : (q[ps[e]] & 0xF0) | vs[e]);
            }
    }
}

/* ---- q5_0, q5_1, q5_K, q6_K: value by value through each full code
 * (layout in qpack.h; offsets qpack_qs_off, qpack_qx_off) ---- */

/* Where value p of a chunk sits in the packed nibbles: vector i, byte j
 * of the chunk's lane, high nibble h. */
typedef struct pk_pos {
    int i, j, h;
} pk_pos;

static pk_pos pos_in_lane(int p)
{
    const pk_pos q = {p / 8, p % 4, (p % 8) / 4};
    return q;
}

/* The 32 full codes of chunk c of a stored group g. */
static void codes_stored(uint32_t t, const uint8_t *g, int c, uint8_t u[QACT_CHUNK])
{
    if (t == DT_Q5_0 || t == DT_Q5_1) {
        const uint8_t *blk = g + (size_t)c * block_bytes(t);
        const uint8_t *qh = blk + (t == DT_Q5_1 ? 4 : 2), *qs = qh + 4;
        uint32_t h;
        memcpy(&h, qh, 4);
        for (int p = 0; p < 16; p++) {
            u[p] = (uint8_t)((qs[p] & 0xF) | ((h >> p) & 1) << 4);
            u[p + 16] = (uint8_t)((qs[p] >> 4) | ((h >> (p + 16)) & 1) << 4);
        }
        return;
    }
    const int j = c % 8;
    if (t == DT_Q5_K) {
        const block_q5_K *b = (const block_q5_K *)g + c / 8;
        const uint8_t *qs = b->qs + 32 * (j / 2);
        for (int p = 0; p < QACT_CHUNK; p++)
            u[p] = (uint8_t)(((j & 1) ? qs[p] >> 4 : qs[p] & 0xF) | ((b->qh[p] >> j) & 1) << 4);
        return;
    }
    const block_q6_K *b = (const block_q6_K *)(g + (size_t)(c / 8) * sizeof(block_q6_K));
    const int h = j / 4, k = j % 4;
    const uint8_t *ql = b->ql + 64 * h + (k & 1) * 32, *qh = b->qh + 32 * h;
    for (int p = 0; p < QACT_CHUNK; p++)
        u[p] = (uint8_t)((k < 2 ? ql[p] & 0xF : ql[p] >> 4) | ((qh[p] >> (2 * k)) & 3) << 4);
}

/* Writes chunk c's codes u into a packed group g (whole bytes: its lane of
 * every code vector, of qh' or of the q6_K planes). */
static void put_packed_chunk(uint32_t t, int tc, uint8_t *g, int c, const uint8_t u[QACT_CHUNK])
{
    const int L = 4 * tc;
    uint8_t *qs = g + qpack_qs_off(t, tc), *qx = g + qpack_qx_off(t, tc);
    for (int j = 0; j < 4; j++) {
        int x5 = 0, x6[2] = {0, 0};
        for (int i = 0; i < 4; i++) {
            const int lo = u[8 * i + j], hi = u[8 * i + 4 + j];
            qs[L * i + 4 * c + j] = (uint8_t)((lo & 0xF) | (hi & 0xF) << 4);
            x5 |= ((lo >> 4) & 1) << i | ((hi >> 4) & 1) << (4 + i);
            x6[i / 2] |= ((lo >> 4) | (hi >> 4) << 2) << (i & 1 ? 0 : 4);
        }
        if (t == DT_Q6_K) {
            qx[4 * c + j] = (uint8_t)x6[0];
            qx[L + 4 * c + j] = (uint8_t)x6[1];
        } else {
            qx[4 * c + j] = (uint8_t)x5;
        }
    }
}

static void put_bits(uint8_t *b, int shift, int width, int v)
{
    const int m = ((1 << width) - 1) << shift;
    *b = (uint8_t)((*b & ~m) | ((v << shift) & m));
}

static void set_stored(uint32_t t, uint8_t *g, int c, int p, int v)
{
    if (t == DT_Q5_0 || t == DT_Q5_1) {
        uint8_t *blk = g + (size_t)c * block_bytes(t);
        uint8_t *qh = blk + (t == DT_Q5_1 ? 4 : 2), *qs = qh + 4;
        put_bits(&qs[p % 16], p < 16 ? 0 : 4, 4, v);
        put_bits(&qh[p / 8], p % 8, 1, v >> 4);
        return;
    }
    const int j = c % 8;
    if (t == DT_Q5_K) {
        block_q5_K *b = (block_q5_K *)g + c / 8;
        put_bits(&b->qs[32 * (j / 2) + p], (j & 1) ? 4 : 0, 4, v);
        put_bits(&b->qh[p], j, 1, v >> 4);
        return;
    }
    block_q6_K *b = (block_q6_K *)(g + (size_t)(c / 8) * sizeof(block_q6_K));
    const int h = j / 4, k = j % 4;
    put_bits(&b->ql[64 * h + (k & 1) * 32 + p], k < 2 ? 0 : 4, 4, v);
    put_bits(&b->qh[32 * h + p], 2 * k, 2, v >> 4);
}

static int code_packed(uint32_t t, int tc, const uint8_t *g, int c, int p)
{
    const int L = 4 * tc;
    const pk_pos q = pos_in_lane(p);
    const int nib = (g[qpack_qs_off(t, tc) + (size_t)L * q.i + 4 * c + q.j] >> (4 * q.h)) & 0xF;
    if (t == DT_Q6_K) {
        const uint8_t b = g[qpack_qx_off(t, tc) + (size_t)L * (q.i / 2) + 4 * c + q.j];
        return nib | ((b >> ((q.i & 1 ? 0 : 4) + 2 * q.h)) & 3) << 4;
    }
    const uint8_t b = g[qpack_qx_off(t, tc) + 4 * c + q.j];
    return nib | ((b >> (4 * q.h + q.i)) & 1) << 4;
}

static void xfer(uint8_t *st, uint8_t *pk, size_t len, int to_packed)
{
    memcpy(to_packed ? pk : st, to_packed ? st : pk, len);
}

/* The scales: stored blocks st <-> packed head pk (to_packed: direction). */
static void move_heads(uint32_t t, int tc, uint8_t *st, uint8_t *pk, int to_packed)
{
    if (t == DT_Q5_0 || t == DT_Q5_1) {
        for (int c = 0; c < tc; c++) {
            uint8_t *blk = st + (size_t)c * block_bytes(t);
            xfer(blk, pk + 2 * c, 2, to_packed);
            if (t == DT_Q5_1)
                xfer(blk + 2, pk + 2 * (tc + c), 2, to_packed);
        }
        return;
    }
    for (int sb = 0; sb < tc / 8; sb++) {
        if (t == DT_Q5_K) {
            xfer(st + (size_t)sb * sizeof(block_q5_K), pk + (size_t)sb * K4_HEAD, K4_HEAD, to_packed);
            continue;
        }
        block_q6_K *b = (block_q6_K *)(st + (size_t)sb * sizeof(block_q6_K));
        xfer((uint8_t *)&b->d, pk + 2 * sb, 2, to_packed);
        xfer((uint8_t *)b->scales, pk + 2 * (tc / 8) + 16 * sb, 16, to_packed);
    }
}

static void pack_group_wide(uint32_t t, int tc, const uint8_t *in, uint8_t *out)
{
    move_heads(t, tc, (uint8_t *)in, out, 1);
    uint8_t u[QACT_CHUNK];
    for (int c = 0; c < tc; c++) {
        codes_stored(t, in, c, u);
        put_packed_chunk(t, tc, out, c, u);
    }
}

static void unpack_group_wide(uint32_t t, int tc, const uint8_t *in, uint8_t *out)
{
    move_heads(t, tc, out, (uint8_t *)in, 0);
    for (int c = 0; c < tc; c++)
        for (int p = 0; p < QACT_CHUNK; p++)
            set_stored(t, out, c, p, code_packed(t, tc, in, c, p));
}

static int is_wide(uint32_t t)
{
    return t == DT_Q5_0 || t == DT_Q5_1 || t == DT_Q5_K || t == DT_Q6_K;
}

static void pack_group(uint32_t t, int tc, const uint8_t *in, uint8_t *out)
{
    if (is_wide(t)) {
        pack_group_wide(t, tc, in, out);
        return;
    }
    if (t == DT_Q4_K) {
        pack_group_k4(tc, in, out);
        return;
    }
    const size_t bb = block_bytes(t);
    const int L = 4 * tc;
    uint8_t *hd = out;
    uint8_t *qs = out + head_bytes(t, tc);
    for (int c = 0; c < tc; c++) {
        const uint8_t *blk = in + c * bb;
        if (t == DT_MXFP4)
            hd[c] = blk[0];
        else
            memcpy(hd + 2 * c, blk, 2);
        if (t == DT_Q4_1)
            memcpy(hd + 2 * (tc + c), blk + 2, 2);
        if (t == DT_Q8_0) {
            for (int r = 0; r < 8; r++)
                memcpy(qs + L * r + 4 * c, ((const block_q8_0 *)blk)->qs + 4 * r, 4);
            continue;
        }
        const uint8_t *q = t == DT_Q4_0    ? ((const block_q4_0 *)blk)->qs
                           : t == DT_MXFP4 ? ((const block_mxfp4 *)blk)->qs
                                           : ((const block_q4_1 *)blk)->qs;
        for (int i = 0; i < 2; i++) {
            for (int j = 0; j < 4; j++) {
                /* values 8i+j, 8i+4+j: low nibbles; 16+8i+j, 20+8i+j: high */
                const uint8_t a = q[8 * i + j], b = q[8 * i + 4 + j];
                qs[L * i + 4 * c + j] = (uint8_t)((a & 0x0F) | (b << 4));
                qs[L * (i + 2) + 4 * c + j] = (uint8_t)((a >> 4) | (b & 0xF0));
            }
        }
    }
}

static void unpack_group(uint32_t t, int tc, const uint8_t *in, uint8_t *out)
{
    if (is_wide(t)) {
        unpack_group_wide(t, tc, in, out);
        return;
    }
    if (t == DT_Q4_K) {
        unpack_group_k4(tc, in, out);
        return;
    }
    const size_t bb = block_bytes(t);
    const int L = 4 * tc;
    const uint8_t *hd = in;
    for (int c = 0; c < tc; c++) {
        if (t == DT_MXFP4)
            out[c * bb] = hd[c];
        else
            memcpy(out + c * bb, hd + 2 * c, 2);
        if (t == DT_Q4_1)
            memcpy(out + c * bb + 2, hd + 2 * (tc + c), 2);
    }
    const uint8_t *qs = in + head_bytes(t, tc);
    const int nr = t == DT_Q8_0 ? 8 : 4;
    for (int r = 0; r < nr; r++) {
        for (int b = 0; b < L; b++) {
            uint8_t *blk = out + (size_t)(b / 4) * bb;
            const uint8_t v = qs[L * r + b];
            if (t == DT_Q8_0) {
                set_code(t, blk, pos_of(t, r, 0, b), (int8_t)v);
            } else {
                set_code(t, blk, pos_of(t, r, 0, b), v & 0xF);
                set_code(t, blk, pos_of(t, r, 1, b), v >> 4);
            }
        }
    }
}

static void map_rows(uint32_t type, const void *src, void *dst, int64_t n, int64_t n_rows,
                     size_t row_bytes, void (*fn)(uint32_t, int, const uint8_t *, uint8_t *))
{
    const int64_t nc = n / QACT_CHUNK;
    uint8_t tmp[QP_GROUP_MAX];
    for (int64_t r = 0; r < n_rows; r++) {
        const uint8_t *s = (const uint8_t *)src + (size_t)r * row_bytes;
        uint8_t *d = (uint8_t *)dst + (size_t)r * row_bytes;
        for (int64_t c0 = 0; c0 < nc; c0 += QACT_LANES) {
            const int tc = (int)(nc - c0 < QACT_LANES ? nc - c0 : QACT_LANES);
            const size_t off = group_bytes(type, (int)c0), len = group_bytes(type, tc);
            memcpy(tmp, s + off, len);
            fn(type, tc, tmp, d + off);
        }
    }
}

void qpack_rows(uint32_t type, const void *src, void *dst, int64_t n, int64_t n_rows,
                size_t row_bytes)
{
    map_rows(type, src, dst, n, n_rows, row_bytes, pack_group);
}

void qpack_unpack_rows(uint32_t type, const void *src, void *dst, int64_t n, int64_t n_rows,
                       size_t row_bytes)
{
    map_rows(type, src, dst, n, n_rows, row_bytes, unpack_group);
}

void qpack_interleave_act(void *xq, int64_t n)
{
    int8_t *qs = xq;
    int8_t tmp[QACT_GROUP];
    for (int64_t g = 0; g < qact_padded(n) / QACT_GROUP; g++) {
        int8_t *q = qs + g * QACT_GROUP;
        memcpy(tmp, q, sizeof tmp);
        for (int r = 0; r < 8; r++)
            for (int c = 0; c < QACT_LANES; c++)
                memcpy(q + 64 * r + 4 * c, tmp + QACT_CHUNK * c + 4 * r, 4);
    }
}
