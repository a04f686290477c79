/* server_gen.c - generation requests: submit to the engine, turn engine
 * events into OpenAI responses (one JSON body, or SSE chunks), hold back
 * text that may begin a stop string, cancel on client disconnect.
 *
 * Invariants: all validation happens before engine_submit, so a streamed
 * response never starts with an error status; after the final engine event
 * (or a stop-string finish of every sequence) the stream ends with
 * "data: [DONE]".  A srv_gen is on the server's active list from submit
 * until its HTTP response is finished (streaming: the response free
 * callback; otherwise the handler's return), and only its HTTP thread
 * touches it, except the list links (s->mu).
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "server/server_internal.h"
#include "server/server_reply.h"
#include "server/server_modelapi.h"

#define GEN_WAIT_MS 100          /* event wait slice (keep-alive and drain checks);
                                  * a disconnect wakes the wait at once */
#define GEN_KEEPALIVE_S 5.0      /* SSE comment when nothing was sent this long */

typedef struct gen_seq {
    tok_stream ts;
    srv_buf held;        /* text that may still be the start of a stop string */
    srv_buf text;        /* non-streaming: the whole completion */
    json_t *lp;          /* non-streaming logprobs entries (array) */
    int done;
    engine_finish finish;
    int64_t n_tok;
    int64_t text_off;    /* completions logprobs text_offset */
    size_t tools_sent;   /* streaming with tools: bytes of text streamed as content */
    int tools_hold;      /* streaming with tools: a call may have begun; the rest waits */
    int tools_role;      /* streaming with tools: the role's chunk went out */
} gen_seq;

/* One prompt's engine request (a /v1/completions list has several). */
typedef struct gen_prompt {
    int64_t rid;            /* > 0 once submitted */
    int final;              /* its final engine event handled */
    int counted;            /* its finish metric recorded */
    int echoed;             /* echo: the prompt was put at the head of its choices */
    int we_cancelled;       /* every choice of this prompt hit a stop string */
    json_t *echo_lp;        /* echo + logprobs: entries of its prompt tokens after the
                             * first (ENGINE_EV_PROMPT events), until echoed */
    int64_t prompt_tokens, cached_tokens;
    int64_t kv_tokens, kv_blocks; /* its KV footprint at its largest */
    uint64_t kv_bytes;
    int64_t draft_tokens, accepted_tokens; /* speculative decoding */
} gen_prompt;

struct srv_gen {
    srv *s;
    model *m;               /* the request's model and engine: the server's, or */
    engine *e;              /* the registry's (held through ref until gen_free) */
    const char *name;       /* served name */
    reg_ref ref;      /* several models: the reference held (ref.e != NULL) */
    srv_gen_req req;
    srv_chan *chan;         /* one source per prompt */
    gen_prompt *pr;         /* [req.n_prompts] */
    int n_final;            /* prompts whose final event was handled */
    int fd;                 /* the client socket, for disconnect checks */
    char id[48];
    long long created;
    gen_seq *seq;           /* [n_choices]: choice prompt * n + i, as OpenAI indexes them */
    int n_choices;
    srv_buf out;            /* SSE bytes not yet handed to MHD */
    size_t out_off;
    int ended;              /* [DONE] queued */
    int failed;             /* ERROR event (not ours) */
    int on_active;          /* on s->active (some prompt submitted) */
    int submit_failed;      /* a later prompt's submit failed: the earlier ones are
                             * cancelled and not counted as finished */
    char err[256];
    double last_out;
    gcache_entry *gent;     /* structured outputs: the compiled grammar's reference
                             * until prompt 0's engine request takes it */
    srv_gen *next, *prev;   /* active list (s->mu) */
};

/* ---- UTF-8-safe JSON strings ------------------------------------------ */

static size_t utf8_valid_len(const unsigned char *p, size_t n)
{
    unsigned c = p[0];
    size_t L = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (L == 0 || L > n || (L == 2 && c < 0xC2) || (L == 4 && c > 0xF4))
        return 0;
    for (size_t i = 1; i < L; i++)
        if ((p[i] & 0xC0) != 0x80)
            return 0;
    return L;
}

/* A JSON string of s[0..n) with invalid UTF-8 bytes replaced by U+FFFD. */
static json_t *jstr(const char *s, size_t n)
{
    json_t *j = json_stringn(s, n);
    if (j)
        return j;
    srv_buf b = {0};
    for (size_t i = 0; i < n;) {
        size_t L = utf8_valid_len((const unsigned char *)s + i, n - i);
        if (L) {
            srv_buf_append(&b, s + i, L);
            i += L;
        } else {
            srv_buf_append(&b, "\xEF\xBF\xBD", 3);
            i++;
        }
    }
    j = json_stringn(b.s ? b.s : "", b.len);
    srv_buf_free(&b);
    return j ? j : json_string("");
}

/* ---- response pieces ---------------------------------------------------- */

/* Summed over the prompts (each one's KV footprint at its largest). */
static json_t *usage_json(const srv_gen *g)
{
    int64_t comp = 0, prompt = 0, cached = 0, kv_tok = 0, kv_blk = 0, drafted = 0, accepted = 0;
    uint64_t kv_bytes = 0;
    for (int i = 0; i < g->n_choices; i++)
        comp += g->seq[i].n_tok;
    for (int k = 0; k < g->req.n_prompts; k++) {
        const gen_prompt *p = &g->pr[k];
        prompt += p->prompt_tokens;
        cached += p->cached_tokens;
        kv_tok += p->kv_tokens;
        kv_blk += p->kv_blocks;
        kv_bytes += p->kv_bytes;
        drafted += p->draft_tokens;
        accepted += p->accepted_tokens;
    }
    json_t *u = json_pack("{s:I, s:I, s:I, s:{s:I}, s:I, s:I, s:I}", "prompt_tokens",
                          (json_int_t)prompt, "completion_tokens", (json_int_t)comp,
                          "total_tokens", (json_int_t)(prompt + comp),
                          "prompt_tokens_details", "cached_tokens", (json_int_t)cached,
                          "kv_tokens", (json_int_t)kv_tok, "kv_blocks", (json_int_t)kv_blk,
                          "kv_bytes", (json_int_t)kv_bytes);
    if (u && engine_spec_mode(g->e) != ENGINE_SPEC_OFF) { /* --spec: what it did */
        json_object_set_new(u, "draft_tokens", json_integer((json_int_t)drafted));
        json_object_set_new(u, "accepted_tokens", json_integer((json_int_t)accepted));
    }
    return u;
}

static const char *finish_str(engine_finish f)
{
    return f == ENGINE_FINISH_STOP ? "stop" : f == ENGINE_FINISH_LENGTH ? "length" : "abort";
}

static json_t *token_json(const model *m, int32_t id)
{
    char buf[256];
    int n = tok_piece(m->tok, id, 0, buf, sizeof buf);
    return jstr(buf, n > 0 && n <= (int)sizeof buf ? (size_t)n : 0);
}

/* The token's UTF-8 bytes (chat logprobs' "bytes": a token may hold part
 * of a character, which "token" can only show as U+FFFD). */
static json_t *token_bytes(const model *m, int32_t id)
{
    char buf[256];
    int n = tok_piece(m->tok, id, 0, buf, sizeof buf);
    json_t *a = json_array();
    for (int i = 0; a && n > 0 && n <= (int)sizeof buf && i < n; i++)
        json_array_append_new(a, json_integer((unsigned char)buf[i]));
    return a ? a : json_null();
}

/* One token's logprob entry.  Chat: {"token","logprob","bytes","top_logprobs"};
 * completions: {"token","logprob","top":{tok: lp}} (split apart later). */
static json_t *lp_entry(const srv_gen *g, const engine_event *ev)
{
    const model *m = g->m;
    json_t *tok = token_json(m, ev->token);
    if (g->req.api == SRV_API_CHAT) {
        json_t *tops = json_array();
        for (int k = 0; k < ev->n_top && k < g->req.top_logprobs; k++)
            json_array_append_new(tops, json_pack("{s:o, s:f, s:o}", "token",
                                                  token_json(m, ev->top_ids[k]), "logprob",
                                                  (double)ev->top_logprobs[k], "bytes",
                                                  token_bytes(m, ev->top_ids[k])));
        return json_pack("{s:o, s:f, s:o, s:o}", "token", tok, "logprob", (double)ev->logprob,
                         "bytes", token_bytes(m, ev->token), "top_logprobs", tops);
    }
    json_t *top = json_object();
    for (int k = 0; k < ev->n_top && k < g->req.top_logprobs; k++) {
        json_t *t = token_json(m, ev->top_ids[k]);
        json_object_set_new(top, json_string_value(t), json_real(ev->top_logprobs[k]));
        json_decref(t);
    }
    return json_pack("{s:o, s:f, s:o}", "token", tok, "logprob", (double)ev->logprob, "top", top);
}

/* Converts an array of lp_entry objects to the API's logprobs object. */
static json_t *lp_object(const srv_gen *g, json_t *entries, int64_t off0)
{
    if (!entries)
        return json_null();
    if (g->req.api == SRV_API_CHAT)
        return json_pack("{s:O}", "content", entries);
    json_t *toks = json_array(), *lps = json_array(), *tops = json_array(), *offs = json_array();
    int64_t off = off0;
    size_t i;
    json_t *e;
    json_array_foreach(entries, i, e) {
        json_t *t = json_object_get(e, "token");
        json_array_append(toks, t);
        json_array_append(lps, json_object_get(e, "logprob"));
        json_array_append(tops, g->req.top_logprobs > 0 ? json_object_get(e, "top") : json_null());
        json_array_append_new(offs, json_integer(off));
        off += (int64_t)json_string_length(t);
    }
    return json_pack("{s:o, s:o, s:o, s:o}", "tokens", toks, "token_logprobs", lps,
                     "top_logprobs", tops, "text_offset", offs);
}

static json_t *choice_base(const srv_gen *g, int index, const char *text, size_t n,
                           json_t *logprobs, const char *finish, int first)
{
    json_t *fin = finish ? json_string(finish) : json_null();
    if (g->req.api == SRV_API_COMPLETIONS)
        return json_pack("{s:i, s:o, s:o, s:o}", "index", index, "text", jstr(text, n),
                         "logprobs", logprobs, "finish_reason", fin);
    json_t *delta = json_object();
    if (first)
        json_object_set_new(delta, "role", json_string("assistant"));
    if (text && (n || first))
        json_object_set_new(delta, "content", jstr(text, n));
    return json_pack("{s:i, s:o, s:o, s:o}", "index", index, "delta", delta, "logprobs",
                     logprobs, "finish_reason", fin);
}

static json_t *envelope(const srv_gen *g, json_t *choices, int chunk)
{
    const char *obj = g->req.api == SRV_API_CHAT
                          ? (chunk ? "chat.completion.chunk" : "chat.completion")
                          : "text_completion";
    return json_pack("{s:s, s:s, s:I, s:s, s:o}", "id", g->id, "object", obj, "created",
                     (json_int_t)g->created, "model", g->name, "choices", choices);
}

static void sse_json(srv_gen *g, json_t *o)
{
    char *s = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    if (!s)
        return;
    srv_buf_append(&g->out, "data: ", 6);
    srv_buf_append(&g->out, s, strlen(s));
    srv_buf_append(&g->out, "\n\n", 2);
    free(s);
}

static void sse_choice(srv_gen *g, int index, const char *text, size_t n, json_t *lp_entries,
                       const char *finish)
{
    json_t *lp = lp_entries ? lp_object(g, lp_entries, g->seq[index].text_off) : json_null();
    json_decref(lp_entries);
    int first = g->req.api == SRV_API_CHAT && g->seq[index].n_tok <= 1 && !finish &&
                g->seq[index].text_off == 0;
    json_t *arr = json_array();
    json_array_append_new(arr, choice_base(g, index, text, n, lp, finish, first));
    g->seq[index].text_off += (int64_t)n;
    json_t *o = envelope(g, arr, 1);
    if (g->req.continuous_usage && o) /* vLLM's continuous_usage_stats: the usage so far */
        json_object_set_new(o, "usage", usage_json(g));
    sse_json(g, o);
}

/* ---- event handling ----------------------------------------------------- */

static void count_finish(srv_gen *g, int k, engine_finish f)
{
    if (!g->pr[k].counted) {
        g->pr[k].counted = 1;
        srv_metrics_count_finish(g->s->metrics, f);
    }
}

/* Stops every prompt's engine request not finished yet. */
static void cancel_prompts(srv_gen *g)
{
    for (int k = 0; k < g->req.n_prompts; k++)
        if (g->pr[k].rid > 0 && !g->pr[k].final)
            engine_cancel(g->e, g->pr[k].rid);
}

/* Whether replies are parsed for tool calls (a stream sends the content
 * before any possible call as it comes, and the calls, with the rest of
 * the content, in one delta when the choice ends: a call is known only
 * then). */
static int tools_parse(const srv_gen *g)
{
    return g->req.api == SRV_API_CHAT && g->req.tools.mode >= SRV_TOOLS_AUTO;
}

/* The reply message of choice i, and its finish reason ("tool_calls" when
 * it holds calls and the model finished). */
static json_t *tools_message(const srv_gen *g, int i, const char **finish)
{
    const gen_seq *q = &g->seq[i];
    int n_calls = 0;
    json_t *m = srv_tools_message(&g->req.tools, q->text.s ? q->text.s : "", q->text.len, g->id,
                                  i, &n_calls);
    *finish = n_calls && q->finish == ENGINE_FINISH_STOP ? "tool_calls" : finish_str(q->finish);
    return m;
}

/* Streaming with tools: choice i ended: the calls and the content not
 * streamed yet as one delta, then the finish chunk. */
static void sse_tools_final(srv_gen *g, int i)
{
    const char *finish;
    json_t *m = tools_message(g, i, &finish);
    if (!m)
        return;
    const size_t sent = g->seq[i].tools_sent;
    json_t *c = json_object_get(m, "content");
    if (g->seq[i].tools_role)
        json_object_del(m, "role");
    if (sent) { /* content[0..sent) went out already (a prefix of it) */
        if (json_is_string(c) && json_string_length(c) > sent)
            json_object_set_new(m, "content", json_stringn(json_string_value(c) + sent,
                                                           json_string_length(c) - sent));
        else
            json_object_del(m, "content");
    }
    json_t *tc = json_object_get(m, "tool_calls");
    for (size_t k = 0; k < json_array_size(tc); k++)
        json_object_set_new(json_array_get(tc, k), "index", json_integer((json_int_t)k));
    json_t *arr = json_array();
    json_array_append_new(arr, json_pack("{s:i, s:o, s:n, s:n}", "index", i, "delta", m,
                                         "logprobs", "finish_reason"));
    sse_json(g, envelope(g, arr, 1));
    arr = json_array();
    json_array_append_new(arr, json_pack("{s:i, s:{}, s:n, s:s}", "index", i, "delta",
                                         "logprobs", "finish_reason", finish));
    json_t *o = envelope(g, arr, 1);
    if (g->req.continuous_usage && o)
        json_object_set_new(o, "usage", usage_json(g));
    sse_json(g, o);
}

/* Emits (stream) or appends (non-stream) text for sequence i. */
static void seq_out(srv_gen *g, int i, const srv_buf *emit, json_t *lp_entry_or_null,
                    const char *finish)
{
    gen_seq *q = &g->seq[i];
    if (g->req.stream && tools_parse(g)) { /* logprobs dropped */
        json_decref(lp_entry_or_null);
        srv_buf_append(&q->text, emit->s ? emit->s : "", emit->len);
        if (finish) {
            sse_tools_final(g, i);
            return;
        }
        /* the content that cannot be part of a call goes out now (the role
         * with the first chunk, as without tools) */
        size_t safe = q->tools_hold ? q->tools_sent
                                    : srv_tools_stream_safe(q->text.s ? q->text.s : "",
                                                            q->text.len, &q->tools_hold);
        if (safe > q->tools_sent || !q->tools_role) {
            json_t *d = json_object();
            if (!q->tools_role)
                json_object_set_new(d, "role", json_string("assistant"));
            if (safe > q->tools_sent)
                json_object_set_new(d, "content", jstr(q->text.s + q->tools_sent,
                                                       safe - q->tools_sent));
            json_t *arr = json_array();
            json_array_append_new(arr, json_pack("{s:i, s:o, s:n, s:n}", "index", i, "delta", d,
                                                 "logprobs", "finish_reason"));
            json_t *o = envelope(g, arr, 1);
            if (g->req.continuous_usage && o)
                json_object_set_new(o, "usage", usage_json(g));
            sse_json(g, o);
            q->tools_role = 1;
            q->tools_sent = safe;
        }
        return;
    }
    if (!g->req.stream) {
        srv_buf_append(&q->text, emit->s ? emit->s : "", emit->len);
        if (lp_entry_or_null) {
            if (!q->lp)
                q->lp = json_array();
            json_array_append_new(q->lp, lp_entry_or_null);
        }
        return;
    }
    json_t *lps = NULL;
    if (lp_entry_or_null) {
        lps = json_array();
        json_array_append_new(lps, lp_entry_or_null);
    }
    if (emit->len || lps || (g->req.api == SRV_API_CHAT && q->text_off == 0 && !finish))
        sse_choice(g, i, emit->s ? emit->s : "", emit->len, lps, NULL);
    if (finish)
        sse_choice(g, i, NULL, 0, NULL, finish);
}

/* Ends sequence i.  Bytes of an incomplete UTF-8 sequence still held by the
 * decoder are dropped when the sequence was cut at its length limit (the
 * rest of the character was never generated), and shown as U+FFFD when the
 * model itself ended inside a character. */
static void seq_finish(srv_gen *g, int i, engine_finish f)
{
    gen_seq *q = &g->seq[i];
    if (q->done)
        return;
    if (g->req.max_tokens_zero) /* echo of the prompt alone: cut at 0 tokens */
        f = ENGINE_FINISH_LENGTH;
    char tail[16];
    srv_buf emit = {0};
    int tl = tok_stream_flush(&q->ts, tail, sizeof tail);
    if (f == ENGINE_FINISH_LENGTH)
        tl = 0;
    int hit = srv_stops_feed(&g->req.stops, &q->held, tail, tl > 0 ? (size_t)tl : 0, &emit);
    if (hit != 1 && q->held.len) /* the rest can no longer become a stop string */
        srv_buf_append(&emit, q->held.s, q->held.len);
    q->held.len = 0;
    q->done = 1;
    q->finish = hit == 1 ? ENGINE_FINISH_STOP : f;
    seq_out(g, i, &emit, NULL, finish_str(q->finish));
    srv_buf_free(&emit);
}

/* Whether every choice of prompt k has ended. */
static int prompt_done(const srv_gen *g, int k)
{
    for (int i = k * g->req.er.n; i < (k + 1) * g->req.er.n; i++)
        if (!g->seq[i].done)
            return 0;
    return 1;
}

static void on_token(srv_gen *g, int src, const engine_event *ev)
{
    if (ev->index < 0 || ev->index >= g->req.er.n || g->req.max_tokens_zero)
        return;
    int ci = src * g->req.er.n + ev->index;
    gen_seq *q = &g->seq[ci];
    /* End-of-generation tokens are not text; with ignore_eos they are
     * ordinary generated tokens (counted, rendering as ""). */
    if (q->done || (!g->req.er.ignore_eos && tok_is_eog(g->m->tok, ev->token)))
        return;
    q->n_tok++;
    char piece[512];
    int pl = tok_stream_feed(g->m->tok, &q->ts, ev->token, piece, sizeof piece);
    if (pl == 0 && tools_parse(g) && tok_attr_of(g->m->tok, ev->token) == TOK_CONTROL) {
        /* a tool-call syntax's control token stays in the text its parser reads */
        int n = tok_piece(g->m->tok, ev->token, 1, piece, sizeof piece);
        pl = n > 0 && n <= (int)sizeof piece && srv_tools_marker(piece, (size_t)n) ? n : 0;
    }
    srv_buf emit = {0};
    int hit = srv_stops_feed(&g->req.stops, &q->held, piece, pl > 0 ? (size_t)pl : 0, &emit);
    json_t *lp = g->req.logprobs ? lp_entry(g, ev) : NULL;
    if (hit == 1) {
        q->done = 1;
        q->finish = ENGINE_FINISH_STOP;
        seq_out(g, ci, &emit, lp, "stop");
    } else {
        seq_out(g, ci, &emit, lp, NULL);
    }
    srv_buf_free(&emit);
    gen_prompt *p = &g->pr[src];
    if (hit == 1 && prompt_done(g, src) && !p->we_cancelled && !p->final) {
        p->we_cancelled = 1; /* nothing more is needed from this engine request */
        engine_cancel(g->e, p->rid);
    }
}

static void end_stream(srv_gen *g)
{
    if (g->req.stream && g->req.include_usage && !g->failed) {
        json_t *o = envelope(g, json_array(), 1);
        json_object_set_new(o, "usage", usage_json(g));
        sse_json(g, o);
    }
    if (g->req.stream)
        srv_buf_append(&g->out, "data: [DONE]\n\n", 14);
    g->ended = 1;
}

/* The final event of prompt k's engine request; the response ends with
 * the last prompt's, or at the first failure (the others are cancelled). */
static void on_final(srv_gen *g, const srv_ev *e)
{
    const engine_event *ev = &e->ev;
    int k = e->src, n = g->req.er.n;
    if (g->pr[k].final)
        return;
    g->pr[k].final = 1;
    g->n_final++;
    if (g->ended) /* a failure of another prompt ended the response */
        return;
    if (ev->type == ENGINE_EV_ERROR && !(g->pr[k].we_cancelled && prompt_done(g, k))) {
        g->failed = 1;
        snprintf(g->err, sizeof g->err, "%s", ev->error ? ev->error : "request failed");
        count_finish(g, k, ENGINE_FINISH_ABORT);
        cancel_prompts(g);
        if (g->req.stream) {
            srv_error er;
            srv_error_set(&er, 500, NULL, "%s", g->err);
            char *s = srv_error_json(&er);
            if (s) {
                srv_buf_append(&g->out, "data: ", 6);
                srv_buf_append(&g->out, s, strlen(s));
                srv_buf_append(&g->out, "\n\n", 2);
                free(s);
            }
        }
        end_stream(g);
        return;
    }
    for (int i = 0; i < n; i++)
        seq_finish(g, k * n + i, ENGINE_FINISH_LENGTH);
    count_finish(g, k, g->seq[k * n].finish);
    if (g->n_final == g->req.n_prompts)
        end_stream(g);
}

/* echo + logprobs: a prompt token's entry, kept until the prompt is echoed. */
static void on_prompt_token(srv_gen *g, gen_prompt *p, const engine_event *ev)
{
    if (!g->req.logprobs || p->echoed)
        return;
    if (!p->echo_lp)
        p->echo_lp = json_array();
    json_array_append_new(p->echo_lp, lp_entry(g, ev));
}

/* echo: puts prompt k's text (and logprobs: its tokens' entries, the first
 * with a null logprob as OpenAI gives it) at the head of its choices. */
static void echo_prompt(srv_gen *g, int k)
{
    gen_prompt *p = &g->pr[k];
    if (!g->req.echo || p->echoed)
        return;
    p->echoed = 1;
    const int32_t *ids = g->req.tokens + g->req.prompt_off[k];
    int64_t n_ids = g->req.prompt_off[k + 1] - g->req.prompt_off[k];
    srv_buf text = {0};
    tok_stream ts;
    tok_stream_init(&ts);
    char piece[512];
    for (int64_t j = 0; j < n_ids; j++) {
        int pl = tok_stream_feed(g->m->tok, &ts, ids[j], piece, sizeof piece);
        srv_buf_append(&text, piece, pl > 0 ? (size_t)pl : 0);
    }
    int tl = tok_stream_flush(&ts, piece, sizeof piece);
    srv_buf_append(&text, piece, tl > 0 ? (size_t)tl : 0);
    json_t *lps = NULL;
    if (g->req.logprobs) {
        lps = json_array();
        json_array_append_new(lps, json_pack("{s:o, s:n, s:n}", "token",
                                             token_json(g->m, ids[0]), "logprob", "top"));
        json_array_extend(lps, p->echo_lp ? p->echo_lp : json_array());
    }
    for (int i = 0; i < g->req.er.n; i++) {
        int ci = k * g->req.er.n + i;
        gen_seq *q = &g->seq[ci];
        if (!g->req.stream) {
            srv_buf_append(&q->text, text.s ? text.s : "", text.len);
            if (lps && !q->lp)
                q->lp = json_array();
            if (lps)
                json_array_extend(q->lp, lps);
        } else {
            sse_choice(g, ci, text.s ? text.s : "", text.len, lps ? json_copy(lps) : NULL,
                       NULL);
        }
    }
    json_decref(lps);
    json_decref(p->echo_lp);
    p->echo_lp = NULL;
    srv_buf_free(&text);
}

static void gen_on_event(srv_gen *g, const srv_ev *e)
{
    const engine_event *ev = &e->ev;
    if (e->src < 0 || e->src >= g->req.n_prompts)
        return;
    gen_prompt *p = &g->pr[e->src];
    if (ev->type == ENGINE_EV_PROMPT) {
        on_prompt_token(g, p, ev);
        return;
    }
    if (ev->type != ENGINE_EV_ERROR)
        echo_prompt(g, e->src);
    if (ev->kv_blocks > p->kv_blocks) {
        p->kv_blocks = ev->kv_blocks;
        p->kv_bytes = ev->kv_bytes;
    }
    if (ev->kv_tokens > p->kv_tokens)
        p->kv_tokens = ev->kv_tokens;
    if (ev->cached_tokens > p->cached_tokens)
        p->cached_tokens = ev->cached_tokens;
    if (ev->draft_tokens > p->draft_tokens) {
        p->draft_tokens = ev->draft_tokens;
        p->accepted_tokens = ev->accepted_tokens;
    }
    if (ev->prompt_tokens > 0)
        p->prompt_tokens = ev->prompt_tokens;
    switch (ev->type) {
    case ENGINE_EV_TOKEN: on_token(g, e->src, ev); break;
    case ENGINE_EV_FINISH:
        if (ev->index >= 0 && ev->index < g->req.er.n)
            seq_finish(g, e->src * g->req.er.n + ev->index,
                       ev->finish == ENGINE_FINISH_NONE ? ENGINE_FINISH_STOP : ev->finish);
        break;
    default: on_final(g, e); break;
    }
}

/* ---- life cycle ----------------------------------------------------------- */

/* Caller holds s->mu. */
static void active_add_locked(srv *s, srv_gen *g)
{
    g->next = s->active;
    g->prev = NULL;
    if (s->active)
        s->active->prev = g;
    s->active = g;
    s->n_active++;
}

static void active_remove(srv *s, srv_gen *g)
{
    pthread_mutex_lock(&s->mu);
    if (g->prev)
        g->prev->next = g->next;
    else
        s->active = g->next;
    if (g->next)
        g->next->prev = g->prev;
    s->n_active--;
    pthread_mutex_unlock(&s->mu);
}

void srv_gen_cancel_all(srv *s)
{
    pthread_mutex_lock(&s->mu);
    for (srv_gen *g = s->active; g; g = g->next)
        for (int k = 0; k < g->req.n_prompts; k++)
            if (g->pr[k].rid > 0)
                engine_cancel(g->e, g->pr[k].rid);
    pthread_mutex_unlock(&s->mu);
}

int srv_gen_active(srv *s)
{
    pthread_mutex_lock(&s->mu);
    int n = s->n_active;
    pthread_mutex_unlock(&s->mu);
    return n;
}

static void gen_free(srv_gen *g)
{
    if (!g)
        return;
    if (g->on_active) {
        for (int k = 0; k < g->req.n_prompts; k++)
            if (g->pr[k].rid > 0 && !g->pr[k].final) { /* client went away (or fault) */
                engine_cancel(g->e, g->pr[k].rid);
                if (!g->submit_failed)
                    count_finish(g, k, ENGINE_FINISH_ABORT);
            }
        active_remove(g->s, g);
    }
    srv_chan_unref(g->chan);
    if (g->gent)
        gcache_release(g->s->gcache, g->gent);
    if (g->ref.e)
        reg_release(g->s->reg, &g->ref);
    for (int i = 0; g->seq && i < g->n_choices; i++) {
        srv_buf_free(&g->seq[i].held);
        srv_buf_free(&g->seq[i].text);
        json_decref(g->seq[i].lp);
    }
    free(g->seq);
    for (int k = 0; g->pr && k < g->req.n_prompts; k++)
        json_decref(g->pr[k].echo_lp);
    free(g->pr);
    srv_buf_free(&g->out);
    srv_gen_req_free(&g->req);
    free(g);
}

static ssize_t gen_reader(void *cls, uint64_t pos, char *buf, size_t max)
{
    srv_gen *g = cls;
    for (;;) {
        if (g->out_off < g->out.len) {
            size_t n = g->out.len - g->out_off;
            n = n < max ? n : max;
            memcpy(buf, g->out.s + g->out_off, n);
            g->out_off += n;
            if (g->out_off == g->out.len)
                g->out_off = g->out.len = 0;
            g->last_out = srv_now();
            return (ssize_t)n;
        }
        if (g->ended)
            return MHD_CONTENT_READER_END_OF_STREAM;
        srv_ev ev;
        int got = srv_chan_wait(g->chan, &ev, GEN_WAIT_MS, g->fd);
        if (got > 0) {
            gen_on_event(g, &ev);
            continue;
        }
        if (got < 0) /* the client left: gen_reader_free cancels at once */
            return MHD_CONTENT_READER_END_WITH_ERROR;
        if (srv_now() - g->last_out > GEN_KEEPALIVE_S)
            srv_buf_append(&g->out, ": keep-alive\n\n", 14);
    }
}

static void gen_reader_free(void *cls)
{
    gen_free(cls);
}

static enum MHD_Result send_whole(srv_gen *g, struct MHD_Connection *c)
{
    json_t *choices = json_array();
    for (int i = 0; i < g->n_choices; i++) {
        gen_seq *q = &g->seq[i];
        json_t *lp = q->lp ? lp_object(g, q->lp, 0) : json_null();
        json_t *ch;
        const char *fin;
        json_t *tm = tools_parse(g) ? tools_message(g, i, &fin) : NULL;
        if (tm)
            ch = json_pack("{s:i, s:o, s:o, s:s}", "index", i, "message", tm, "logprobs", lp,
                           "finish_reason", fin);
        else if (g->req.api == SRV_API_CHAT)
            ch = json_pack("{s:i, s:{s:s, s:o}, s:o, s:s}", "index", i, "message", "role",
                           "assistant", "content", jstr(q->text.s ? q->text.s : "", q->text.len),
                           "logprobs", lp, "finish_reason", finish_str(q->finish));
        else
            ch = choice_base(g, i, q->text.s ? q->text.s : "", q->text.len, lp,
                             finish_str(q->finish), 0);
        json_array_append_new(choices, ch);
    }
    json_t *o = envelope(g, choices, 0);
    json_object_set_new(o, "usage", usage_json(g));
    char *s = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    if (!s) {
        srv_error er;
        srv_error_set(&er, 500, NULL, "out of memory building the response");
        return srv_send_error(c, &er);
    }
    return srv_send_json(c, 200, s);
}

/* Non-streaming: waits for the final event on this HTTP thread. */
static enum MHD_Result gen_blocking(srv_gen *g, struct MHD_Connection *c)
{
    while (!g->ended) {
        srv_ev ev;
        int got = srv_chan_wait(g->chan, &ev, GEN_WAIT_MS, g->fd);
        if (got > 0)
            gen_on_event(g, &ev);
        else if (got < 0) { /* the client left while its tokens kept coming, or waiting */
            gen_free(g);
            return MHD_NO; /* closes the connection */
        }
    }
    enum MHD_Result r;
    if (g->failed) {
        srv_error er;
        int draining = atomic_load(&g->s->state) == SRV_DRAINING;
        srv_error_set(&er, draining ? 503 : 500, NULL, "%s", g->err);
        r = srv_send_error(c, &er);
    } else {
        r = send_whole(g, c);
    }
    gen_free(g);
    return r;
}

/* Structured outputs: a reference to the compiled grammar for prompt k's
 * engine request (prompt 0 takes the one srv_gen_handle got; later prompts
 * of a /v1/completions list get theirs from the cache). */
static int attach_grammar(srv_gen *g, int k, engine_request *er, kvant_err *ke)
{
    gcache_entry *ent = g->gent;
    g->gent = NULL;
    if (!ent) {
        srv_error se;
        if (!(ent = srv_constraint_get(g->s->gcache, &g->req.cons, &se)))
            return kvant_err_set(ke, KV_ENOMEM, "%s", se.msg);
    }
    srv_gref *ref = srv_gref_create(g->s->gcache, ent);
    if (!ref)
        return kvant_err_set(ke, KV_ENOMEM, "out of memory");
    er->grammar = gcache_gram(ent);
    er->grammar_release = srv_gref_release;
    er->grammar_ctx = ref;
    const int32_t words = engine_mask_words(g->e);
    kvant_err me = {0}; /* sharing is an optimisation: without it each sequence walks alone */
    er->grammar_masks = words > 0 ? gcache_masks(g->s->gcache, ent, words, &me) : NULL;
    (void)k;
    return 0;
}

/* Submits every prompt (one engine request each) under s->mu, so the ids
 * are on the active list before a drain cancels; *rid0: the first id.  On
 * a failure the prompts already submitted are cancelled (not counted) and
 * the rest's channel references dropped. */
static int submit_prompts(srv_gen *g, int64_t *rid0, kvant_err *ke)
{
    srv *s = g->s;
    int rc = 0;
    srv_chan_submitted(g->chan, srv_now());
    pthread_mutex_lock(&s->mu);
    for (int k = 0; k < g->req.n_prompts; k++) {
        engine_request er = srv_gen_req_prompt(&g->req, k);
        g->pr[k].prompt_tokens = er.n_prompt;
        if (!rc && g->req.cons.kind >= 0 && (rc = attach_grammar(g, k, &er, ke)))
            rc = rc > 0 ? -rc : rc;
        int64_t rid = rc ? 0 : engine_submit(g->e, &er, srv_chan_on_event,
                                             srv_chan_src(g->chan, k), ke);
        if (rid <= 0 && er.grammar)
            srv_gref_release(er.grammar_ctx); /* a failed submit leaves it with us */
        if (rid <= 0) {
            rc = rc ? rc : (int)rid;
            srv_chan_unref_engine(g->chan, k);
            continue;
        }
        g->pr[k].rid = rid;
        if (k == 0)
            *rid0 = rid;
        if (!g->on_active) {
            g->on_active = 1;
            active_add_locked(s, g);
        }
        if (g->req.stream)
            srv_chan_set_backlog(g->chan, k, g->e, rid, s->cfg.stream_backlog, s->guard);
    }
    pthread_mutex_unlock(&s->mu);
    if (rc)
        g->submit_failed = 1;
    return rc;
}

/* engine_submit or engine_grammar_prepare failed (g is freed here): KV_EBUSY
 * is a full waiting queue (--max-waiting) or a drain, both 503 with
 * Retry-After. */
static enum MHD_Result submit_error(srv *s, struct MHD_Connection *c, int rc, const kvant_err *ke,
                                    srv_gen *g)
{
    gen_free(g);
    srv_error er;
    if (rc == KV_EBUSY) {
        int draining = atomic_load(&s->state) == SRV_DRAINING;
        srv_error_set(&er, 503, NULL, "%s%s",
                      draining ? "the server is shutting down" : ke->msg[0] ? ke->msg
                                                                            : "queue full",
                      draining ? "" : " (--max-waiting); retry later");
        if (!draining) {
            er.code = "server_overloaded";
            srv_guard_count(s->guard, SRV_GUARD_QUEUE_FULL);
        }
        return srv_send_error_retry(c, &er, "1", 0);
    }
    srv_error_set(&er, rc == KV_EINVAL || rc == KV_ERANGE ? 400 : 500, NULL, "%s",
                  ke->msg[0] ? ke->msg : kvant_status_str(rc));
    if (er.status == 400)
        srv_error_param_from_msg(&er);
    return srv_send_error(c, &er);
}

/* The events a request's channel must hold (srv_chan_create): the stream
 * backlog (a non-streaming request's reader drains as the engine emits),
 * one final event per prompt, and with prompt logprobs (echo) one event per
 * prompt token. */
static size_t chan_cap(const srv *s, const srv_gen_req *r)
{
    size_t cap = (size_t)(s->cfg.stream_backlog > 0 ? s->cfg.stream_backlog : 1) +
                 (size_t)r->n_prompts;
    if (r->echo)
        for (int32_t k = 0; k < r->n_prompts; k++)
            cap += (size_t)srv_gen_req_prompt(r, k).n_prompt;
    return cap;
}

/* Several models: acquires the model the body names (loading it if
 * needed) into g->ref; fills e on error. */
static int gen_route(srv_gen *g, const char *body, size_t len, srv_error *e)
{
    char name[REG_NAME_MAX];
    if (srv_modelapi_body_name(body, len, name, sizeof name, e))
        return -1;
    kvant_err ke = {0};
    int rc = reg_acquire(g->s->reg, name, &g->ref, &ke);
    if (rc)
        return srv_modelapi_error(e, rc, &ke);
    g->m = g->ref.m;
    g->e = g->ref.e;
    g->name = g->ref.name;
    return 0;
}

enum MHD_Result srv_gen_handle(srv *s, struct MHD_Connection *c, srv_api api, const char *body,
                               size_t len, double t_arrival)
{
    srv_error er;
    kvant_err ke_out = {0};
    srv_gen *g = calloc(1, sizeof *g);
    if (!g) {
        srv_error_set(&er, 500, NULL, "out of memory");
        return srv_send_error(c, &er);
    }
    g->s = s;
    g->m = s->m;
    g->e = s->e;
    g->name = s->served_name;
    const srv_oai_ctx *oai = &s->oai;
    srv_oai_ctx routed;
    if (s->reg) { /* several models: route by the body's "model" */
        if (gen_route(g, body, len, &er)) {
            gen_free(g);
            return srv_send_error(c, &er);
        }
        routed = (srv_oai_ctx){g->ref.m, g->ref.name, g->ref.max_model_len,
                               g->ref.max_piece_bytes, s->oai.allow_unknown,
                               s->oai.unknown_log, s->oai.grammar_max_bytes};
        oai = &routed;
    }
    if (srv_oai_parse(oai, api, body, len, srv_request_id(c), &g->req, &er)) {
        gen_free(g);
        return srv_send_error(c, &er);
    }
    if (g->req.cons.kind >= 0) { /* compiled here, on this HTTP thread, never the engine's */
        double t0 = srv_now();
        g->gent = srv_constraint_get(s->gcache, &g->req.cons, &er);
        srv_metrics_observe(s->metrics, SRV_H_GRAMMAR_COMPILE, srv_now() - t0);
        if (!g->gent) {
            gen_free(g);
            return srv_send_error(c, &er);
        }
        /* the engine's token trie, built on its first constrained request:
         * here, before submit_prompts takes s->mu (about 25 ms, once) */
        int vrc = engine_grammar_prepare(g->e, &ke_out);
        if (vrc)
            return submit_error(s, c, vrc, &ke_out, g);
    }
    g->n_choices = g->req.n_prompts * g->req.er.n;
    g->chan = srv_chan_create(s->metrics, t_arrival, g->req.n_prompts, chan_cap(s, &g->req));
    g->pr = calloc((size_t)g->req.n_prompts, sizeof *g->pr);
    g->seq = calloc((size_t)g->n_choices, sizeof *g->seq);
    if (!g->chan || !g->pr || !g->seq) {
        if (g->chan) /* nothing submitted: drop the engine's references too */
            for (int k = 0; k < g->req.n_prompts; k++)
                srv_chan_unref_engine(g->chan, k);
        gen_free(g);
        srv_error_set(&er, 500, NULL, "out of memory");
        return srv_send_error(c, &er);
    }
    for (int i = 0; i < g->n_choices; i++)
        tok_stream_init(&g->seq[i].ts);
    g->created = (long long)time(NULL);
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    g->fd = ci ? ci->connect_fd : -1;
    int64_t rid0 = 0;
    int rc = submit_prompts(g, &rid0, &ke_out);
    if (rc)
        return submit_error(s, c, rc, &ke_out, g);
    snprintf(g->id, sizeof g->id, "%s-%lld", api == SRV_API_CHAT ? "chatcmpl" : "cmpl",
             (long long)rid0);
    if (!g->req.stream)
        return gen_blocking(g, c);
    g->last_out = srv_now();
    struct MHD_Response *r =
        MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16 * 1024, gen_reader, g,
                                          gen_reader_free);
    if (!r) {
        gen_free(g);
        return MHD_NO;
    }
    MHD_add_response_header(r, "Content-Type", "text/event-stream");
    MHD_add_response_header(r, "Cache-Control", "no-cache");
    enum MHD_Result res = srv_queue(c, 200, r);
    MHD_destroy_response(r);
    return res;
}
