/* cmd_run.c - `kvant run`: generate from a prompt (optionally through the
 * model's chat template), streaming text to stdout as it is produced. */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli/cli.h"
#include "engine/engine_draft.h"
#include "engine/engine_spec.h"
#include "text/chat.h"
#include "text/sampler.h"
#include "text/tokenizer.h"

typedef struct run_opts {
    const char *prompt;
    long n_predict;
    long ctx;
    int chat;
    const char *chat_template; /* --chat-template FILE or NULL */
    sampler_params sp;
    engine_config spec;        /* --spec options (cli_spec_parse) */
} run_opts;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int parse_sampling(int argc, char **argv, int *i, sampler_params *sp)
{
    const char *a = argv[*i], *v;
    double f;
    long n;
    if (!strcmp(a, "--temp")) {
        if (!(v = cli_value(argc, argv, i)) || cli_parse_float(a, v, 0, 100, &f))
            return -1;
        sp->temperature = (float)f;
    } else if (!strcmp(a, "--top-k")) {
        if (!(v = cli_value(argc, argv, i)) || cli_parse_int(a, v, 0, 1 << 24, &n))
            return -1;
        sp->top_k = (int32_t)n;
    } else if (!strcmp(a, "--top-p")) {
        if (!(v = cli_value(argc, argv, i)) || cli_parse_float(a, v, 1e-9, 1, &f))
            return -1;
        sp->top_p = (float)f;
    } else if (!strcmp(a, "--min-p")) {
        if (!(v = cli_value(argc, argv, i)) || cli_parse_float(a, v, 0, 1, &f))
            return -1;
        sp->min_p = (float)f;
    } else if (!strcmp(a, "--repeat-penalty")) {
        if (!(v = cli_value(argc, argv, i)) || cli_parse_float(a, v, 1e-3, 100, &f))
            return -1;
        sp->repetition_penalty = (float)f;
    } else if (!strcmp(a, "--presence-penalty")) {
        if (!(v = cli_value(argc, argv, i)) || cli_parse_float(a, v, -2, 2, &f))
            return -1;
        sp->presence_penalty = (float)f;
    } else if (!strcmp(a, "--frequency-penalty")) {
        if (!(v = cli_value(argc, argv, i)) || cli_parse_float(a, v, -2, 2, &f))
            return -1;
        sp->frequency_penalty = (float)f;
    } else if (!strcmp(a, "--seed")) {
        if (!(v = cli_value(argc, argv, i)) || cli_parse_int(a, v, 0, INT64_MAX, &n))
            return -1;
        sp->seed = (uint64_t)n;
    } else {
        return 0;
    }
    return 1;
}

static void run_help(void)
{
    sampler_params d = sampler_params_default();
    char temp[32], topk[32], topp[32], minp[32], rep[32], pres[32], freq[32], seed[32];
    snprintf(temp, sizeof temp, "%g = greedy", (double)d.temperature);
    snprintf(topk, sizeof topk, "%d = off", d.top_k);
    snprintf(topp, sizeof topp, "%g", (double)d.top_p);
    snprintf(minp, sizeof minp, "%g", (double)d.min_p);
    snprintf(rep, sizeof rep, "%g = off", (double)d.repetition_penalty);
    snprintf(pres, sizeof pres, "%g", (double)d.presence_penalty);
    snprintf(freq, sizeof freq, "%g", (double)d.frequency_penalty);
    snprintf(seed, sizeof seed, "%llu", (unsigned long long)d.seed);
    const cli_opt t[] = {
        {"-p, --prompt", "TEXT", "the prompt (required)", NULL},
        {"-n, --n-predict", "N", "tokens to generate at most", "128"},
        {"-c, --ctx-size", "N", "context in tokens, 16..", "the model's, at most 4096"},
        {"--chat", NULL, "wrap the prompt in the model's chat template", "off"},
        {"--chat-template", "FILE", "with --chat: this Jinja template instead of the model's", "the model's"},
        {"--temp", "T", "sampling temperature, 0..100", temp},
        {"--top-k", "K", "keep the K most likely tokens", topk},
        {"--top-p", "P", "nucleus sampling, (0, 1]", topp},
        {"--min-p", "P", "drop tokens below P x the top probability", minp},
        {"--repeat-penalty", "F", "penalty on recent tokens", rep},
        {"--presence-penalty", "F", "OpenAI presence penalty, -2..2", pres},
        {"--frequency-penalty", "F", "OpenAI frequency penalty, -2..2", freq},
        {"--seed", "S", "sampling seed", seed},
    };
    cli_help("kvant run -p PROMPT [options]",
             "Generates text from a prompt, streaming it to stdout (with --json: one object\n"
             "at the end).",
             t, CLI_N_OPTS(t));
    cli_spec_help(stdout);
}

/* 0: run; 1: help printed; CLI_EXIT_USAGE: a mistake (one line printed). */
static int parse_run(int argc, char **argv, cli_common *c, run_opts *o)
{
    memset(o, 0, sizeof *o);
    o->n_predict = 128;
    o->sp = sampler_params_default();
    o->spec = engine_config_default();
    for (int i = 1; i < argc; i++) {
        if (cli_is_help(argv[i])) {
            run_help();
            return 1;
        }
        int r = cli_common_parse(c, argc, argv, &i);
        if (r == 0)
            r = parse_sampling(argc, argv, &i, &o->sp);
        if (r == 0)
            r = cli_spec_parse(&o->spec, argc, argv, &i);
        if (r < 0)
            return CLI_EXIT_USAGE;
        if (r)
            continue;
        const char *v;
        if (!strcmp(argv[i], "-p") || !strcmp(argv[i], "--prompt")) {
            if (!(o->prompt = cli_value(argc, argv, &i)))
                return CLI_EXIT_USAGE;
        } else if (!strcmp(argv[i], "-n") || !strcmp(argv[i], "--n-predict")) {
            if (!(v = cli_value(argc, argv, &i)) || cli_parse_int("-n", v, 0, 1 << 20, &o->n_predict))
                return CLI_EXIT_USAGE;
        } else if (!strcmp(argv[i], "-c") || !strcmp(argv[i], "--ctx-size")) {
            if (!(v = cli_value(argc, argv, &i)) || cli_parse_int("-c", v, 16, 1 << 20, &o->ctx))
                return CLI_EXIT_USAGE;
        } else if (!strcmp(argv[i], "--chat-template")) {
            if (!(o->chat_template = cli_value(argc, argv, &i)))
                return CLI_EXIT_USAGE;
        } else if (!strcmp(argv[i], "--chat")) {
            o->chat = 1;
        } else {
            return cli_err_unknown("run", argv[i]);
        }
    }
    if (!o->prompt)
        return cli_err_usage("run", "missing -p PROMPT");
    if (o->chat_template && !o->chat)
        return cli_err_usage("run", "--chat-template needs --chat");
    return cli_spec_check(&o->spec, "run");
}

/* Tokenizes the prompt (through the chat template when asked). */
static int32_t *prompt_tokens(const model *m, const run_opts *o, int64_t *n, kvant_err *err)
{
    char *rendered = NULL;
    const char *text = o->prompt;
    if (o->chat) {
        if (!m->has_chat) {
            kvant_err_set(err, KV_EUNSUP, "--chat: %s", m->chat_err);
            return NULL;
        }
        chat_msg msg = {"user", o->prompt};
        rendered = chat_render(&m->chat, &msg, 1, 1, err);
        if (!rendered)
            return NULL;
        text = rendered;
    }
    size_t len = strlen(text);
    int add_bos = tok_add_bos(m->tok);
    int64_t cnt = tok_encode(m->tok, text, len, add_bos, o->chat, NULL, 0, err);
    int32_t *ids = cnt > 0 ? malloc((size_t)cnt * sizeof *ids) : NULL;
    if (ids)
        cnt = tok_encode(m->tok, text, len, add_bos, o->chat, ids, cnt, err);
    free(rendered);
    if (!ids || cnt <= 0) {
        if (cnt == 0)
            kvant_err_set(err, KV_EINVAL, "the prompt is empty");
        free(ids);
        return NULL;
    }
    *n = cnt;
    return ids;
}

typedef struct gen_out {
    char *text;
    size_t len, cap;
    int64_t n_gen;
    int64_t drafted, accepted; /* --spec */
    double t_prompt, t_gen;
    const char *finish;
} gen_out;

static void out_append(gen_out *g, const char *s, int n, int json)
{
    if (!json) {
        fwrite(s, 1, (size_t)n, stdout);
        fflush(stdout);
        return;
    }
    if (g->len + (size_t)n + 1 > g->cap) {
        size_t cap = (g->cap + (size_t)n + 64) * 2;
        char *nb = realloc(g->text, cap);
        if (!nb)
            return;
        g->text = nb;
        g->cap = cap;
    }
    memcpy(g->text + g->len, s, (size_t)n);
    g->len += (size_t)n;
    g->text[g->len] = '\0';
}

/* --spec draft: the draft model's session, opened first with the whole
 * budget; the target's then gets what it left (one budget for both, as
 * kvant serve plans them).  ds->m stays NULL without --spec draft. */
static int open_draft(cli_session *ds, cli_common *c, const run_opts *o, kvant_err *err)
{
    if (o->spec.spec != ENGINE_SPEC_DRAFT)
        return KV_OK;
    if (c->tp * c->pp > 1 || c->weights_memory || c->weights_memory_frac > 0)
        return kvant_err_set(err, KV_EUNSUP, "--draft-model: not with %s",
                             c->tp * c->pp > 1 ? "--tp/--pp" : "--weights-memory");
    cli_common dc = *c;
    dc.model_path = o->spec.spec_draft_model;
    dc.weights_dtype = -1;
    kvant_err de = {0};
    if (cli_session_open(ds, &dc, (int32_t)o->ctx, 512, 1, &de))
        return kvant_err_set(err, de.code ? de.code : KV_EINVAL, "draft model %s: %s",
                             dc.model_path, de.msg);
    const uint64_t left = mem_budget(ds->mem) - mem_used(ds->mem);
    c->device_memory = (uint64_t)((double)left / c->utilization);
    return KV_OK;
}

/* The draft model catches up over toks[*dn..n) (the prompt, the tokens the
 * target accepted; positions from n - 1 on are fed again, overwriting a
 * rejected draft's K/V), then proposes up to k tokens greedily into
 * toks[n..]; *dn becomes the positions it holds.  Returns the drafts. */
static int32_t draft_propose(cli_session *d, int64_t *dn, int32_t *toks, int64_t n, int64_t k)
{
    kvant_err err = {0};
    k = k < d->n_ctx - n ? k : d->n_ctx - n;
    if (k < 1)
        return 0;
    for (int64_t from = *dn < n - 1 ? *dn : n - 1; from < n;) {
        const int32_t len = (int32_t)(n - from < d->max_batch ? n - from : d->max_batch);
        if (cli_session_eval(d, toks + from, len, (int32_t)from, 0, d->logits, &err)) {
            *dn = from;
            return 0;
        }
        from += len;
    }
    int32_t got = 0;
    while (got < k) {
        toks[n + got] = sampler_argmax(d->logits, d->m->hp.n_vocab);
        got++;
        if (got == k || cli_session_eval(d, &toks[n + got - 1], 1, (int32_t)(n + got - 1), 0,
                                         d->logits, &err))
            break;
    }
    *dn = n + got - 1;
    return got;
}

/* --spec: drafts for the next pass into toks[n..] by prompt lookup or the
 * draft model d (*dn: its positions), within the context and -n; returns
 * how many (0: none). */
static int32_t run_draft(const cli_session *s, cli_session *d, int64_t *dn, const run_opts *o,
                         int32_t *toks, int64_t n, long n_gen)
{
    if (o->spec.spec == ENGINE_SPEC_OFF)
        return 0;
    const engine_spec_limits lim = engine_spec_resolve(&o->spec);
    int64_t k = lim.draft_max;
    k = k < o->n_predict - n_gen - 1 ? k : o->n_predict - n_gen - 1;
    k = k < s->n_ctx - n - 1 ? k : s->n_ctx - n - 1;
    if (k > 0 && d->m)
        return draft_propose(d, dn, toks, n, k);
    return k > 0 ? engine_spec_lookup(toks, n, lim.ngram_min, lim.ngram_max, toks + n, (int32_t)k)
                 : 0;
}

/* Each pass evaluates the last token and any drafts after it (--spec),
 * with a logit row at each; a drafted token is kept while the sampled one
 * equals it (speculative sampling for temperature > 0: sampler.h). */
static int generate(cli_session *s, cli_session *d, const run_opts *o, int32_t *toks,
                    int64_t n_prompt, int json, gen_out *g, kvant_err *err)
{
    sampler smp;
    if (sampler_init(&smp, &o->sp, s->m->hp.n_vocab, err))
        return KV_EINVAL;
    double t0 = now_s();
    int rc = cli_session_eval(s, toks, (int32_t)n_prompt, 0, 0, s->logits, err);
    g->t_prompt = now_s() - t0;
    tok_stream ts;
    tok_stream_init(&ts);
    int64_t n = n_prompt;
    int32_t k = 0, draft[ENGINE_SPEC_MAX];
    int64_t dn = 0; /* the draft model's positions (--spec draft) */
    int done = 0;
    g->finish = "length";
    t0 = now_s();
    while (!rc && !done && g->n_gen < o->n_predict) {
        for (int32_t j = 0; j <= k; j++) {
            float *row = s->logits + (size_t)j * s->m->hp.n_vocab;
            int32_t id = sampler_sample_draft(&smp, row, toks, n, j < k ? draft[j] : -1);
            if (tok_is_eog(s->m->tok, id)) {
                g->finish = "stop";
                done = 1;
                break;
            }
            char piece[512];
            int pl = tok_stream_feed(s->m->tok, &ts, id, piece, sizeof piece);
            if (pl > 0)
                out_append(g, piece, pl, json);
            toks[n++] = id;
            g->n_gen++;
            g->accepted += j < k && id == draft[j];
            if (n >= s->n_ctx || g->n_gen >= o->n_predict) {
                done = 1;
                break;
            }
            if (j == k || id != draft[j])
                break;
        }
        if (done)
            break;
        k = run_draft(s, d, &dn, o, toks, n, g->n_gen);
        memcpy(draft, toks + n, (size_t)k * sizeof *draft);
        g->drafted += k;
        rc = cli_session_eval(s, &toks[n - 1], 1 + k, (int32_t)(n - 1), k > 0, s->logits, err);
    }
    char tail[16];
    int tl = tok_stream_flush(&ts, tail, sizeof tail);
    if (tl > 0)
        out_append(g, tail, tl, json);
    g->t_gen = now_s() - t0;
    sampler_free(&smp);
    return rc;
}

int cmd_run(int argc, char **argv)
{
    cli_common c;
    run_opts o;
    cli_common_init(&c);
    int pr = parse_run(argc, argv, &c, &o);
    if (pr)
        return pr == 1 ? 0 : pr;
    kvant_err err = {0};
    if (sampler_params_check(&o.sp, &err)) {
        fprintf(stderr, "kvant run: %s\n", err.msg);
        return CLI_EXIT_USAGE;
    }
    cli_session s, ds = {0};
    int32_t max_out = 1;
    if (o.spec.spec != ENGINE_SPEC_OFF)
        max_out += engine_spec_resolve(&o.spec).draft_max;
    int orc = open_draft(&ds, &c, &o, &err);
    if (!orc && !(orc = cli_session_open(&s, &c, (int32_t)o.ctx, 512, max_out, &err)) && ds.m &&
        (orc = engine_draft_check_vocab(ds.m, s.m, &err)))
        cli_session_close(&s);
    if (orc) {
        if (ds.m)
            cli_session_close(&ds);
        fprintf(stderr, "kvant run: %s\n", err.msg);
        return 1;
    }
    int64_t n_prompt = 0;
    int32_t *ids = cli_chat_template(s.m, o.chat_template, "run", &err) ? NULL : prompt_tokens(s.m, &o, &n_prompt, &err);
    int32_t *toks = ids ? realloc(ids, (size_t)s.n_ctx * sizeof *toks + sizeof *toks) : NULL;
    gen_out g = {0};
    int rc = 1;
    if (!toks) {
        free(ids);
        fprintf(stderr, "kvant run: %s\n", err.msg[0] ? err.msg : "out of memory");
    } else if (n_prompt >= s.n_ctx) {
        fprintf(stderr, "kvant run: prompt of %lld tokens does not fit the context of %d\n",
                (long long)n_prompt, s.n_ctx);
    } else if (generate(&s, &ds, &o, toks, n_prompt, c.json, &g, &err)) {
        fprintf(stderr, "\nkvant run: %s\n", err.msg);
    } else {
        rc = 0;
        if (c.json) {
            printf("{\"text\": ");
            cli_json_string(stdout, g.text ? g.text : "", g.len);
            printf(", \"prompt_tokens\": %lld, \"completion_tokens\": %lld, \"finish_reason\": "
                   "\"%s\", \"draft_tokens\": %lld, \"accepted_tokens\": %lld, "
                   "\"prompt_tps\": %.2f, \"gen_tps\": %.2f, \"token_ids\": [",
                   (long long)n_prompt, (long long)g.n_gen, g.finish, (long long)g.drafted,
                   (long long)g.accepted,
                   n_prompt / (g.t_prompt > 0 ? g.t_prompt : 1e-9),
                   g.n_gen / (g.t_gen > 0 ? g.t_gen : 1e-9));
            for (int64_t i = 0; i < n_prompt + g.n_gen; i++)
                printf("%s%d", i ? ", " : "", toks[i]);
            printf("]}\n");
        } else {
            printf("\n");
            fprintf(stderr, "\n[prompt %lld tokens %.1f t/s, generated %lld tokens %.1f t/s, %s]\n",
                    (long long)n_prompt, n_prompt / (g.t_prompt > 0 ? g.t_prompt : 1e-9),
                    (long long)g.n_gen, g.n_gen / (g.t_gen > 0 ? g.t_gen : 1e-9), g.finish);
        }
    }
    free(toks ? toks : NULL);
    free(g.text);
    cli_session_close(&s);
    if (ds.m)
        cli_session_close(&ds);
    return rc;
}
