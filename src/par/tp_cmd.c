/* tp_cmd.c - rank 0's commands to the other ranks, and a worker receiving
 * the next one (see tp.h).  The wire: one broadcast of TP_MSG_INTS ints,
 * a header of TP_HDR_INTS (op, n_tokens, n_seqs, n_out, block-table ints,
 * KV copy dst, src, 1 when the batch follows inline) and a small batch's
 * payload; a large batch's payload follows in a second broadcast. */
#include <stdlib.h>
#include <string.h>

#include "par/tp.h"
#include "par/tp_internal.h"

static int send_cmd(tp_ctx *t, int op, int32_t a, int32_t b, kvant_err *err)
{
    memset(t->msg, 0, TP_HDR_INTS * sizeof(int32_t));
    t->msg[0] = op;
    t->msg[5] = a;
    t->msg[6] = b;
    return par_bcast(t->world, t->msg, sizeof t->msg, 0, err);
}

int tp_send_kv_copy(tp_ctx *t, int32_t dst, int32_t src, kvant_err *err)
{
    return send_cmd(t, TP_CMD_KV_COPY, dst, src, err);
}

int tp_send_quit(tp_ctx *t, kvant_err *err)
{
    return send_cmd(t, TP_CMD_QUIT, 0, 0, err);
}

/* The payload buffer of a large batch, at least n ints (grown rarely: a
 * batch larger than any before). */
static int rx_reserve(tp_ctx *t, int64_t n, kvant_err *err)
{
    if ((size_t)n <= t->rx_cap)
        return KV_OK;
    int32_t *rx = realloc(t->rx, (size_t)n * sizeof *rx);
    if (!rx)
        return kvant_err_set(err, KV_ENOMEM, "out of memory for a batch message");
    t->rx = rx;
    t->rx_cap = (size_t)n;
    return KV_OK;
}

static int64_t payload_ints(int32_t n_tokens, int32_t n_seqs, int32_t n_out, int32_t n_table)
{
    return 3 * (int64_t)n_tokens + n_out + n_seqs + (int64_t)n_table;
}

int tp_send_batch(tp_ctx *t, const fwd_batch *b, kvant_err *err)
{
    int32_t n_table = 0;
    for (int32_t s = 0; s < b->n_seqs; s++)
        n_table += b->seqs[s].n_blocks;
    const int64_t np = payload_ints(b->n_tokens, b->n_seqs, b->n_out, n_table);
    const int inl = TP_HDR_INTS + np <= TP_MSG_INTS;
    int32_t *h = t->msg;
    memset(h, 0, TP_HDR_INTS * sizeof(int32_t));
    h[0] = TP_CMD_RUN, h[1] = b->n_tokens, h[2] = b->n_seqs, h[3] = b->n_out, h[4] = n_table;
    h[7] = inl;
    int32_t *w = inl ? h + TP_HDR_INTS : NULL;
    if (!inl) {
        int rc = rx_reserve(t, np, err);
        if (rc)
            return rc;
        w = t->rx;
    }
    int32_t *p = w;
    memcpy(p, b->tokens, (size_t)b->n_tokens * 4), p += b->n_tokens;
    memcpy(p, b->pos, (size_t)b->n_tokens * 4), p += b->n_tokens;
    memcpy(p, b->seq, (size_t)b->n_tokens * 4), p += b->n_tokens;
    if (b->n_out)
        memcpy(p, b->out, (size_t)b->n_out * 4), p += b->n_out;
    for (int32_t s = 0; s < b->n_seqs; s++)
        *p++ = b->seqs[s].n_blocks;
    for (int32_t s = 0; s < b->n_seqs; s++)
        memcpy(p, b->seqs[s].block_table, (size_t)b->seqs[s].n_blocks * 4),
            p += b->seqs[s].n_blocks;
    int rc = par_bcast(t->world, t->msg, sizeof t->msg, 0, err);
    if (!rc && !inl)
        rc = par_bcast(t->world, t->rx, (size_t)np * 4, 0, err);
    return rc;
}

/* Worker: the batch of a TP_CMD_RUN command, from the message (and the
 * payload broadcast that follows a large one). */
static int recv_batch(tp_ctx *t, fwd_batch *b, kvant_err *err)
{
    const int32_t *h = t->msg;
    const int32_t nt = h[1], ns = h[2], no = h[3], ntab = h[4];
    if (nt < 1 || nt > t->cmd_max_tokens || ns < 1 || ns > nt || no < 0 ||
        no > t->cmd_max_out || ntab < 0)
        return kvant_err_set(err, KV_EINVAL, "rank %d: a malformed batch command", t->rank);
    const int64_t np = payload_ints(nt, ns, no, ntab);
    const int32_t *p = h + TP_HDR_INTS;
    if (!h[7]) {
        int rc = rx_reserve(t, np, err);
        if (rc || (rc = par_bcast(t->world, t->rx, (size_t)np * 4, 0, err)))
            return rc;
        p = t->rx;
    } else if (TP_HDR_INTS + np > TP_MSG_INTS) {
        return kvant_err_set(err, KV_EINVAL, "rank %d: a malformed batch command", t->rank);
    }
    if (ns > t->seqs_cap) {
        fwd_seq *sq = realloc(t->seqs, (size_t)ns * sizeof *sq);
        if (!sq)
            return kvant_err_set(err, KV_ENOMEM, "out of memory");
        t->seqs = sq;
        t->seqs_cap = ns;
    }
    *b = (fwd_batch){.n_tokens = nt, .tokens = p, .pos = p + nt, .seq = p + 2 * nt,
                     .n_seqs = ns, .seqs = t->seqs, .n_out = no, .out = p + 3 * nt};
    const int32_t *nb = p + 3 * nt + no, *tab = nb + ns;
    int64_t used = 0;
    for (int32_t s = 0; s < ns; s++) {
        if (nb[s] < 0 || used + nb[s] > ntab)
            return kvant_err_set(err, KV_EINVAL, "rank %d: a malformed block table", t->rank);
        t->seqs[s] = (fwd_seq){.block_table = tab + used, .n_blocks = nb[s]};
        used += nb[s];
    }
    return KV_OK;
}

int tp_recv_cmd(tp_ctx *t, tp_cmd *cmd, fwd_batch *b, kvant_err *err)
{
    int rc = par_bcast(t->world, t->msg, sizeof t->msg, 1, err);
    if (rc)
        return rc;
    *cmd = (tp_cmd){.op = (tp_cmd_op)t->msg[0]};
    switch (t->msg[0]) {
    case TP_CMD_RUN:
        return recv_batch(t, b, err);
    case TP_CMD_KV_COPY:
        cmd->dst = t->msg[5];
        cmd->src = t->msg[6];
        return KV_OK;
    case TP_CMD_QUIT:
        return KV_OK;
    default:
        return kvant_err_set(err, KV_EINVAL, "rank %d: unknown command %d", t->rank, t->msg[0]);
    }
}
