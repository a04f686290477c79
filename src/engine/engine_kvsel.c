/* engine_kvsel.c - what a KV budget's snapkv and h2o policies keep
 * (engine_kvbudget.c resolves the budget and owns the sinks mask).
 *
 * Both compute the prompt with the whole cache while the backend's
 * kv_score adds attention probabilities into a score row per (layer, KV
 * head) (the request's storage, kvb.snap_row floats each): snapkv those of
 * the prompt's last ENGINE_KV_SNAP_WINDOW tokens, h2o those of every
 * token.  When the prompt is in (a chunk never crosses its end), each row
 * keeps the keep = sink_blocks * bs highest positions before the window
 * (snapkv max-pooled over ENGINE_KV_SNAP_POOL positions; ties: the lower
 * position), copied into fresh blocks that become the sequence's sink
 * blocks (backend kv_compact, kvseq_set_head: its hashing stops).  From
 * then on the sinks mask applies: a token reads the kept rows and the
 * recent window.
 *
 * h2o goes on scoring while it decodes.  Its row is then laid out as the
 * gathered table reads: [the kept rows][the window from block kvb_wb on].
 * A step's tokens share one window (engine_kvb_chunk), and after each
 * commit that moved the window each block leaving it is merged: of the
 * kept rows and the block's rows, the keep highest accumulated scores stay
 * (ties: the lower index, kept rows first); a kept row that stays keeps its
 * slot, the block's rows that enter take the freed slots in order (an
 * in-place kv_compact once the sink blocks are the sequence's own).
 *
 * Everything is a function of the tokens alone (the scores are added in
 * position order per row), so a preempted sequence recomputes the same.
 */
#include "engine/engine_internal.h"

#include <stdlib.h>
#include <string.h>

static int cmp_u64(const void *a, const void *b)
{
    const uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

static int cmp_i32(const void *a, const void *b)
{
    const int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

/* Scores are >= 0, so their bits order as the values: the highest first,
 * ties the lower index. */
static uint64_t key_of(float v, int32_t i)
{
    uint32_t bits;
    memcpy(&bits, &v, sizeof bits);
    return (uint64_t)(~bits) << 32 | (uint32_t)i;
}

static float *row_of(const engine *e, const eng_req *r, int32_t il, int32_t h)
{
    return r->snap_score + ((int64_t)il * e->fwd.kv.n_kv_heads + h) * r->kvb.snap_row;
}

static int32_t *sel_of(const engine *e, const eng_req *r, int32_t il, int32_t h)
{
    const int64_t keep = (int64_t)r->kvb.sink_blocks * r->kvb.bs;
    return r->snap_sel + ((int64_t)il * e->fwd.kv.n_kv_heads + h) * keep;
}

/* The prompt's kept positions of one row: the keep highest of [0, n)
 * max-pooled, in position order. */
static void select_prompt(const eng_req *r, const float *row, int32_t *sel)
{
    const int32_t n = r->kvb.snap_n, keep = r->kvb.sink_blocks * r->kvb.bs;
    const int32_t half = r->kvb.pool / 2;
    for (int32_t p = 0; p < n; p++) {
        float m = 0.0f;
        for (int32_t q = p - half < 0 ? 0 : p - half; q <= p + half && q < n; q++)
            m = row[q] > m ? row[q] : m;
        r->snap_keys[p] = key_of(m, p);
    }
    qsort(r->snap_keys, (size_t)n, sizeof *r->snap_keys, cmp_u64);
    for (int32_t j = 0; j < keep; j++)
        sel[j] = (int32_t)(uint32_t)r->snap_keys[j];
    qsort(sel, (size_t)keep, sizeof *sel, cmp_i32);
}

/* h2o after the prompt's compaction: row becomes [the kept positions'
 * scores][the window's, positions from..prompt), zeros after. */
static void relayout(const eng_req *r, float *row, const int32_t *sel, int32_t from)
{
    const int32_t keep = r->kvb.sink_blocks * r->kvb.bs, n = r->kvb.snap_row;
    float *tmp = (float *)(void *)r->snap_keys; /* snap_row uint64: room for the row */
    for (int32_t j = 0; j < keep; j++)
        tmp[j] = row[sel[j]];
    const int32_t n_win = r->kvb.prompt - from;
    for (int32_t i = 0; i < n_win; i++)
        tmp[keep + i] = row[from + i];
    for (int32_t i = keep + n_win; i < n; i++)
        tmp[i] = 0.0f;
    memcpy(row, tmp, (size_t)n * sizeof *row);
}

/* At the prompt's end: the kept rows into fresh blocks (none when nothing
 * is to be chosen).  Returns 0 when the blocks were not there (the
 * sequence goes on with the whole cache and tries again after its next
 * step, whose scheduling counts them again). */
static int compact_prompt(engine *e, eng_seq *s)
{
    eng_req *r = s->req;
    const eng_kvb *k = &r->kvb;
    const int h2o = k->policy == ENGINE_KV_H2O;
    if (k->snap_n == 0) { /* the prompt fits the sink blocks and the window */
        kvseq_set_head(e->pool, &s->kv, NULL, 0); /* later blocks are read under the mask */
        s->kvb_done = 1;
        s->kvb_wb = k->sink_blocks;
        return 1;
    }
    if (kvpool_alloc_blocks(e->pool, k->sink_blocks, r->snap_blocks) != KV_OK)
        return 0;
    engine_note_kv(e, r); /* the whole prompt: the request's footprint at its largest */
    for (int32_t il = 0; il < e->m->hp.n_layers; il++)
        for (int32_t h = 0; h < kv_layout_heads(&e->fwd.kv, il); h++) {
            float *row = row_of(e, r, il, h);
            int32_t *sel = sel_of(e, r, il, h);
            select_prompt(r, row, sel);
            if (h2o)
                relayout(r, row, sel, k->snap_n);
        }
    e->be->ops->kv_compact(e->be, s->kv.blocks, r->snap_blocks, r->snap_sel,
                           k->sink_blocks * k->bs);
    kvseq_set_head(e->pool, &s->kv, r->snap_blocks, k->sink_blocks);
    if (!h2o)
        engine_kvsel_reset(e, s); /* the scores, for a recomputation */
    s->kvb_done = 1;
    s->kvb_own = 1;
    s->kvb_wb = k->snap_n / k->bs;
    return 1;
}

/* One row's merge of the block leaving the window: sel[j] is the
 * candidate (kept row j < keep, or keep + the block's row) slot j holds. */
static void merge_select(const eng_req *r, float *row, int32_t *sel)
{
    const int32_t keep = r->kvb.sink_blocks * r->kvb.bs, n = keep + r->kvb.bs;
    uint64_t *key = r->snap_keys;
    for (int32_t c = 0; c < n; c++)
        key[c] = key_of(row[c], c);
    qsort(key, (size_t)n, sizeof *key, cmp_u64);
    for (int32_t j = 0; j < keep; j++) /* the chosen, by index */
        key[j] = (uint32_t)key[j];
    qsort(key, (size_t)keep, sizeof *key, cmp_u64);
    int32_t stay = 0;
    while (stay < keep && key[stay] < (uint64_t)keep)
        stay++;
    int32_t a = 0, in = stay;
    for (int32_t j = 0; j < keep; j++) {
        if (a < stay && key[a] == (uint64_t)j) {
            sel[j] = j;
            a++;
        } else {
            sel[j] = (int32_t)key[in++];
        }
    }
    for (int32_t j = 0; j < keep; j++)
        row[j] = row[sel[j]]; /* a moved row comes from the window part, not yet shifted */
    memmove(row + keep, row + n, (size_t)(r->kvb.snap_row - n) * sizeof *row);
    memset(row + r->kvb.snap_row - r->kvb.bs, 0, (size_t)r->kvb.bs * sizeof *row);
}

/* h2o: the block at kvb_wb leaves the window into the kept rows. */
static void merge_one(engine *e, eng_seq *s)
{
    eng_req *r = s->req;
    const eng_kvb *k = &r->kvb;
    int32_t *vt = r->snap_blocks, *fresh = vt + k->sink_blocks + 1;
    memcpy(vt, s->kv.blocks, (size_t)k->sink_blocks * sizeof *vt);
    vt[k->sink_blocks] = s->kv.blocks[s->kvb_wb];
    const int own = s->kvb_own ||
                    kvpool_alloc_blocks(e->pool, k->sink_blocks, fresh) == KV_OK;
    for (int32_t il = 0; il < e->m->hp.n_layers; il++)
        for (int32_t h = 0; h < kv_layout_heads(&e->fwd.kv, il); h++) {
            float *row = row_of(e, r, il, h);
            if (own) {
                merge_select(r, row, sel_of(e, r, il, h));
            } else { /* no blocks (never when scheduled): the block goes, as under sinks */
                const int32_t keep = k->sink_blocks * k->bs;
                memmove(row + keep, row + keep + k->bs,
                        (size_t)(k->snap_row - keep - k->bs) * sizeof *row);
                memset(row + k->snap_row - k->bs, 0, (size_t)k->bs * sizeof *row);
            }
        }
    if (own) {
        e->be->ops->kv_compact(e->be, vt, s->kvb_own ? vt : fresh, r->snap_sel,
                               k->sink_blocks * k->bs);
        if (!s->kvb_own)
            kvseq_set_head(e->pool, &s->kv, fresh, k->sink_blocks);
        s->kvb_own = 1;
    }
    s->kvb_wb++;
}

void engine_kvsel_reset(const engine *e, eng_seq *s)
{
    s->kvb_done = 0;
    s->kvb_own = 0;
    s->kvb_wb = 0;
    if (s->req->snap_score)
        memset(s->req->snap_score, 0, (size_t)e->m->hp.n_layers * (size_t)e->fwd.kv.n_kv_heads *
                                          (size_t)s->req->kvb.snap_row * sizeof(float));
}

void engine_kvsel_commit(engine *e, eng_seq *s)
{
    const eng_kvb *k = &s->req->kvb;
    if (!s->kvb_done && (s->n_computed < k->prompt || !compact_prompt(e, s)))
        return;
    if (k->policy != ENGINE_KV_H2O)
        return;
    const int32_t wb = engine_kvb_first(k, s->n_computed, k->bs);
    while (s->kvb_wb < wb)
        merge_one(e, s);
}
