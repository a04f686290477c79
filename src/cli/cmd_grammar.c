/* cmd_grammar.c - `kvant grammar`: compile a grammar (GBNF, JSON Schema,
 * json_object, regex, choice list) against a model's vocabulary and walk
 * it: at each step the token mask is computed, one allowed token is drawn
 * at random (seeded), and the state advances.  Prints each step's mask
 * (--json: hex words) and the mask times; tests compare the masks with
 * llguidance's.  Works on vocabulary-only GGUF files. */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli/cli.h"
#include "grammar/earley.h"
#include "grammar/gcache.h"
#include "grammar/tmshare.h"
#include "grammar/tokmask.h"
#include "text/tokenizer.h"

static void grammar_help(void)
{
    static const cli_opt t[] = {
        {"--gbnf", "FILE", "a GBNF grammar (llama.cpp syntax); one grammar option is required", NULL},
        {"--schema", "FILE", "a JSON Schema; one grammar option is required", NULL},
        {"--json-object", NULL, "any JSON object; one grammar option is required", NULL},
        {"--regex", "RE", "a regular expression (the whole output matches); one grammar option is required", NULL},
        {"--choice", "JSON", "a JSON array of strings, the output one of them; one grammar option is required", NULL},
        {"--walk", "SEED", "seed of the random walk over allowed tokens", "1"},
        {"--steps", "N", "most tokens in the walk (0: compile only)", "64"},
        {"--max-elems", "N", "largest grammar, in rule elements", "1000000"},
        {"--stdin", NULL, "print each mask as a JSON line, read the next token id from stdin "
         "(-2: a new sequence, shared masks kept)",
         "off"},
        {"--no-memo", NULL, "the plain trie walk (every byte parsed), the memo's reference", "off"},
        {"--vocab", NULL, "print the vocabulary's token bytes (hex) and end ids, no walk", "off"},
        {"--no-share", NULL, "no mask cache shared across walks (each walk on its own)", "off"},
        {"--bench", NULL, "time --walks walks (seeds SEED..): every mask's CPU time and "
         "the compile time (median of --compiles); --json for the numbers", "off"},
        {"--walks", "N", "walks for --bench, sharing one mask cache unless --no-share", "1"},
        {"--compiles", "N", "compilations timed for --bench", "20"},
    };
    cli_help("kvant grammar -m MODEL (--gbnf F | --schema F | --json-object | --regex RE | "
             "--choice JSON) [options]",
             "Compiles a grammar and walks it at random through the model's vocabulary, "
             "printing each step's allowed tokens (--json: masks as hex uint32 words).",
             t, CLI_N_OPTS(t));
}

typedef struct gr_opts {
    int kind;
    const char *src_arg, *file;
    uint64_t seed;
    int steps, vocab, drive, no_memo, no_share, bench, walks, compiles;
    int32_t max_elems;
} gr_opts;

static uint64_t rng_next(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

static int is_structural(const uint8_t *b, int32_t n)
{
    for (int32_t i = 0; i < n; i++)
        if (!strchr("\"{}[],:", b[i]) || !b[i])
            return 0;
    return n > 0;
}

/* Draws a token from mask: the end of sequence with odds 1/2 where
 * allowed, else with odds 3/10 a structural token (quotes, brackets,
 * commas) so walks close what they open, else any allowed token. */
static int32_t draw(const tmask_vocab *v, const uint32_t *mask, uint64_t *rng)
{
    int32_t nv = tmask_n_vocab(v), n_all = 0, n_st = 0, n_eos = 0;
    for (int32_t i = 0; i < nv; i++) {
        if (!(mask[i >> 5] >> (i & 31) & 1))
            continue;
        int32_t len;
        const uint8_t *b = tmask_token(v, i, &len);
        n_all++;
        n_eos += tmask_is_eos(v, i);
        n_st += is_structural(b, len);
    }
    if (n_all == 0)
        return -1;
    int mode = n_eos && rng_next(rng) % 2 ? 2 : n_st && rng_next(rng) % 10 < 3 ? 1 : 0;
    int32_t pool = mode == 2 ? n_eos : mode == 1 ? n_st : n_all;
    int32_t k = (int32_t)(rng_next(rng) % (uint64_t)pool);
    for (int32_t i = 0; i < nv; i++) {
        if (!(mask[i >> 5] >> (i & 31) & 1))
            continue;
        int32_t len;
        const uint8_t *b = tmask_token(v, i, &len);
        int in = mode == 2 ? tmask_is_eos(v, i) : mode == 1 ? is_structural(b, len) : 1;
        if (in && k-- == 0)
            return i;
    }
    return -1;
}

static json_t *mask_hex(const uint32_t *mask, int32_t words)
{
    char *s = malloc((size_t)words * 8 + 1);
    if (!s)
        return NULL;
    for (int32_t w = 0; w < words; w++)
        snprintf(s + 8 * w, 9, "%08x", mask[w]);
    json_t *j = json_string(s);
    free(s);
    return j;
}

static int cmp_dbl(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static void print_vocab(const tmask_vocab *v)
{
    json_t *o = json_object(), *toks = json_array(), *eos = json_array();
    for (int32_t i = 0; i < tmask_n_vocab(v); i++) {
        int32_t len;
        const uint8_t *b = tmask_token(v, i, &len);
        char *h = malloc((size_t)len * 2 + 1);
        for (int32_t k = 0; h && k < len; k++)
            snprintf(h + 2 * k, 3, "%02x", b[k]);
        if (h)
            h[2 * len] = 0;
        json_array_append_new(toks, json_string(h ? h : ""));
        free(h);
        if (tmask_is_eos(v, i))
            json_array_append_new(eos, json_integer(i));
    }
    json_object_set_new(o, "n_vocab", json_integer(tmask_n_vocab(v)));
    json_object_set_new(o, "eos", eos);
    json_object_set_new(o, "tokens", toks);
    json_dumpf(o, stdout, JSON_COMPACT);
    fputc('\n', stdout);
    json_decref(o);
}

/* One mask and the microseconds of CPU time it took; -1 (the error printed) on failure. */
static int32_t timed_mask(const tmask_vocab *v, earley *e, tmask_work *w, uint32_t *mask,
                          double *us)
{
    kvant_err err = {0};
    struct timespec t0, t1;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t0);
    const int32_t cnt = tmask_compute(v, e, w, mask, &err);
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t1);
    *us = (double)(t1.tv_sec - t0.tv_sec) * 1e6 + (double)(t1.tv_nsec - t0.tv_nsec) / 1e3;
    if (cnt < 0)
        fprintf(stderr, "kvant grammar: %s\n", err.msg);
    return cnt;
}

/* The walk; fills out (JSON) and returns 0, or 1 with a message. */
static int walk(const tmask_vocab *v, const gram *g, const gr_opts *o, tmshare *sh, json_t *out,
                int json)
{
    kvant_err err = {0};
    earley *e = earley_create(g, &err);
    tmask_work *w = o->no_memo ? NULL : tmask_work_create(v, &err);
    if (w)
        tmask_work_share(w, sh);
    uint32_t *mask = malloc((size_t)tmask_n_words(v) * sizeof *mask);
    double *us = malloc(((size_t)o->steps + 1) * sizeof *us);
    json_t *steps = json_array();
    char *text = malloc((size_t)o->steps * TMASK_MAX_TOKEN_BYTES + 1);
    size_t tl = 0;
    uint64_t rng = o->seed * 2654435761u + 88172645463325252ull;
    const char *end = "steps";
    int rc = 0, n = 0;
    if (!e || !mask || !us || !text || (!w && !o->no_memo)) {
        fprintf(stderr, "kvant grammar: %s\n", e ? "out of memory" : err.msg);
        rc = 1;
        goto out;
    }
    for (; n < o->steps; n++) {
        int32_t cnt = timed_mask(v, e, w, mask, &us[n]);
        if (cnt < 0) {
            rc = 1;
            goto out;
        }
        int32_t tok = draw(v, mask, &rng);
        json_t *st = json_pack("{s:i,s:i,s:b,s:f}", "step", n, "n_allowed", cnt, "accepting",
                               earley_accepting(e), "us", us[n]);
        if (json)
            json_object_set_new(st, "mask", mask_hex(mask, tmask_n_words(v)));
        json_object_set_new(st, "token", json_integer(tok));
        json_array_append_new(steps, st);
        if (!json && !o->bench)
            printf("step %d: %d allowed, %.1f us, token %d\n", n, cnt, us[n], tok);
        if (tok < 0) {
            end = "stuck";
            n++;
            break;
        }
        if (tmask_is_eos(v, tok)) {
            end = "eos";
            n++;
            break;
        }
        int32_t len;
        const uint8_t *b = tmask_token(v, tok, &len);
        if (tmask_advance(v, e, tok) != 1) {
            fprintf(stderr, "kvant grammar: token %d was allowed but not consumed\n", tok);
            rc = 1;
            goto out;
        }
        memcpy(text + tl, b, (size_t)len);
        tl += (size_t)len;
    }
    qsort(us, (size_t)n, sizeof *us, cmp_dbl);
    json_object_set_new(out, "steps", steps);
    steps = NULL;
    json_object_set_new(out, "end", json_string(end));
    json_t *txt = json_stringn(text, tl);   /* NULL if not valid UTF-8 */
    json_object_set_new(out, "text", txt ? txt : json_null());
    char *hex = malloc(tl * 2 + 1);
    for (size_t k = 0; hex && k < tl; k++)
        snprintf(hex + 2 * k, 3, "%02x", (uint8_t)text[k]);
    if (hex)
        hex[2 * tl] = 0;
    json_object_set_new(out, "text_hex", hex ? json_string(hex) : json_null());
    free(hex);
    json_object_set_new(out, "accepting", json_boolean(earley_accepting(e)));
    json_object_set_new(out, "state_bytes", json_integer((json_int_t)earley_mem_bytes(e)));
    json_object_set_new(out, "mask_us_p50", json_real(n ? us[n / 2] : 0));
    json_object_set_new(out, "mask_us_p99", json_real(n ? us[(n * 99) / 100] : 0));
out:
    json_decref(steps);
    tmask_work_destroy(w);
    earley_destroy(e);
    free(mask);
    free(us);
    free(text);
    return rc;
}

/* --stdin: prints each step's mask as one JSON line, then reads the next
 * token id from stdin (a line; -2 starts a new sequence of the same grammar,
 * the masks shared across sequences kept; EOF or another negative id ends). */
static int drive(const tmask_vocab *v, const gram *g, int no_memo, tmshare *sh)
{
    kvant_err err = {0};
    earley *e = earley_create(g, &err);
    tmask_work *w = no_memo ? NULL : tmask_work_create(v, &err);
    if (w)
        tmask_work_share(w, sh);
    uint32_t *mask = malloc((size_t)tmask_n_words(v) * sizeof *mask);
    int rc = 0;
    char line[64];
    if (!e || !mask || (!w && !no_memo)) {
        fprintf(stderr, "kvant grammar: %s\n", e ? "out of memory" : err.msg);
        rc = 1;
        goto out;
    }
    for (;;) {
        double us;
        int32_t cnt = timed_mask(v, e, w, mask, &us);
        if (cnt < 0) {
            rc = 1;
            break;
        }
        json_t *st = json_pack("{s:i,s:b,s:f,s:i}", "n_allowed", cnt, "accepting", earley_accepting(e),
                               "us", us, "state_bytes", (json_int_t)earley_mem_bytes(e));
        json_object_set_new(st, "mask", mask_hex(mask, tmask_n_words(v)));
        if (sh) {
            int64_t hits, misses;
            int32_t n_masks;
            tmshare_stats(sh, &hits, &misses, &n_masks);
            json_object_set_new(st, "shared_hits", json_integer((json_int_t)hits));
        }
        json_dumpf(st, stdout, JSON_COMPACT);
        json_decref(st);
        fputc('\n', stdout);
        fflush(stdout);
        if (!fgets(line, sizeof line, stdin))
            break;
        long tok = strtol(line, NULL, 10);
        if (tok == -2) {   /* a new sequence: the state from the start, the shared masks kept */
            earley_reset(e);
            if (w)
                tmask_work_reset(w);
            continue;
        }
        if (tok < 0)
            break;
        if (tok >= tmask_n_vocab(v) || tmask_advance(v, e, (int32_t)tok) != 1) {
            fprintf(stderr, "kvant grammar: token %ld refused\n", tok);
            rc = 1;
            break;
        }
    }
out:
    tmask_work_destroy(w);
    earley_destroy(e);
    free(mask);
    return rc;
}

static double cpu_us(void)
{
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return (double)t.tv_sec * 1e6 + (double)t.tv_nsec / 1e3;
}

/* --bench: the median CPU time of --compiles compilations, then --walks
 * walks (seeds seed, seed + 1, ...; one mask cache shared unless
 * --no-share) with every mask's CPU time.  0, or 1 with a message. */
static int bench(const tmask_vocab *v, const gram *g, const gr_opts *o, tmshare *sh,
                 const char *src, size_t len, int json)
{
    double *cus = malloc((size_t)o->compiles * sizeof *cus);
    json_t *out = json_object(), *times = json_array(), *ends = json_array();
    int rc = 1;
    for (int i = 0; cus && i < o->compiles; i++) {
        kvant_err err = {0};
        gram_limits lim = gram_limits_default();
        lim.max_elems = o->max_elems;
        double t0 = cpu_us();
        gram *x = gcache_compile(o->kind, src, len, lim, &err);
        cus[i] = cpu_us() - t0;
        gram_destroy(x);
    }
    if (!cus)
        goto out;
    qsort(cus, (size_t)o->compiles, sizeof *cus, cmp_dbl);
    json_object_set_new(out, "compile_us_median", json_real(cus[o->compiles / 2]));
    gr_opts wo = *o;
    for (int k = 0; k < o->walks; k++) {
        json_t *wj = json_object();
        wo.seed = o->seed + (uint64_t)k;
        if (walk(v, g, &wo, sh, wj, 0)) {
            json_decref(wj);
            goto out;
        }
        size_t i;
        json_t *st;
        json_array_foreach(json_object_get(wj, "steps"), i, st)
            json_array_append(times, json_object_get(st, "us"));
        json_array_append(ends, json_object_get(wj, "end"));
        json_decref(wj);
    }
    json_object_set_new(out, "walks", json_integer(o->walks));
    json_object_set_new(out, "ends", ends);
    ends = NULL;
    if (sh) {
        int64_t hits, misses;
        int32_t n_masks;
        tmshare_stats(sh, &hits, &misses, &n_masks);
        json_object_set_new(out, "shared", json_pack("{s:I,s:I,s:i,s:I}", "hits", (json_int_t)hits,
                                                     "misses", (json_int_t)misses, "masks", n_masks,
                                                     "bytes", (json_int_t)tmshare_mem_bytes(sh)));
    }
    json_object_set_new(out, "mask_us", times);
    times = NULL;
    if (json) {
        json_dumpf(out, stdout, JSON_COMPACT);
        fputc('\n', stdout);
    } else {
        printf("compile %.0f us (median of %d); %d walks\n", cus[o->compiles / 2], o->compiles,
               o->walks);
    }
    rc = 0;
out:
    json_decref(out);
    json_decref(times);
    json_decref(ends);
    free(cus);
    return rc;
}

static int parse_opts(int argc, char **argv, cli_common *c, gr_opts *o)
{
    for (int i = 1; i < argc; i++) {
        int r = cli_common_step(c, argc, argv, &i, grammar_help);
        if (r != CLI_STEP_OWN) {
            if (r == CLI_STEP_TAKEN)
                continue;
            return r == CLI_STEP_HELP ? -1 : CLI_EXIT_USAGE;
        }
        static const char *const src_opts[] = {"--gbnf", "--schema", "--regex", "--choice"};
        static const int kinds[] = {GRAM_KIND_GBNF, GRAM_KIND_JSON_SCHEMA, GRAM_KIND_REGEX,
                                    GRAM_KIND_CHOICE};
        int k = -1;
        for (int j = 0; j < 4; j++)
            if (!strcmp(argv[i], src_opts[j]))
                k = j;
        const char *val;
        if (k >= 0) {
            if (o->kind >= 0)
                return cli_err_usage("grammar", "give one grammar");
            if (!(val = cli_value(argc, argv, &i)))
                return CLI_EXIT_USAGE;
            o->kind = kinds[k];
            if (k < 2)
                o->file = val;
            else
                o->src_arg = val;
        } else if (!strcmp(argv[i], "--json-object")) {
            if (o->kind >= 0)
                return cli_err_usage("grammar", "give one grammar");
            o->kind = GRAM_KIND_JSON_OBJECT;
            o->src_arg = "";
        } else if (!strcmp(argv[i], "--walk") || !strcmp(argv[i], "--steps") ||
                   !strcmp(argv[i], "--max-elems") || !strcmp(argv[i], "--walks") ||
                   !strcmp(argv[i], "--compiles")) {
            const char *name = argv[i];
            if (!(val = cli_value(argc, argv, &i)))
                return CLI_EXIT_USAGE;
            char *endp;
            long long x = strtoll(val, &endp, 10);
            if (*endp || x < 0 || x > 100000000)
                return cli_err_usage("grammar", "%s: expecting a number, got '%s'", name, val);
            if (!strcmp(name, "--walk"))
                o->seed = (uint64_t)x;
            else if (!strcmp(name, "--steps"))
                o->steps = (int)x;
            else if (!strcmp(name, "--walks"))
                o->walks = (int)x;
            else if (!strcmp(name, "--compiles"))
                o->compiles = (int)x;
            else
                o->max_elems = (int32_t)x;
        } else if (!strcmp(argv[i], "--vocab")) {
            o->vocab = 1;
        } else if (!strcmp(argv[i], "--stdin")) {
            o->drive = 1;
        } else if (!strcmp(argv[i], "--no-memo")) {
            o->no_memo = 1;
        } else if (!strcmp(argv[i], "--no-share")) {
            o->no_share = 1;
        } else if (!strcmp(argv[i], "--bench")) {
            o->bench = 1;
        } else {
            return cli_err_unknown("grammar", argv[i]);
        }
    }
    if (o->kind < 0 && !o->vocab)
        return cli_err_usage("grammar", "missing a grammar (--gbnf, --schema, --json-object, --regex, --choice)");
    if (o->steps > 100000)
        return cli_err_usage("grammar", "--steps: at most 100000");
    if (o->walks < 1 || o->walks > 10000 || o->compiles < 1 || o->compiles > 10000)
        return cli_err_usage("grammar", "--walks, --compiles: 1 to 10000");
    return 0;
}

int cmd_grammar(int argc, char **argv)
{
    cli_common c;
    cli_common_init(&c);
    gr_opts o = {.kind = -1, .seed = 1, .steps = 64, .walks = 1, .compiles = 20,
                 .max_elems = gram_limits_default().max_elems};
    int r = parse_opts(argc, argv, &c, &o);
    if (r)
        return r < 0 ? 0 : r;
    kvant_err err = {0};
    char *buf = NULL;
    size_t len = o.src_arg ? strlen(o.src_arg) : 0;
    gguf_ctx *g = NULL;
    tokenizer *t = NULL;
    tmask_vocab *v = NULL;
    gram *gr = NULL;
    tmshare *sh = NULL;
    json_t *out = json_object();
    int rc = 1;
    if (o.file && !(buf = cli_read_file(o.file, &len, &err)))
        goto fail;
    if (!(g = gguf_open(c.model_path, &err)) || !(t = tok_create(g, &err)) ||
        !(v = tmask_vocab_from_tok(t, &err)))
        goto fail;
    if (o.vocab) {
        print_vocab(v);
        rc = 0;
        goto done;
    }
    gram_limits lim = gram_limits_default();
    lim.max_elems = o.max_elems;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    if (!(gr = gcache_compile(o.kind, buf ? buf : o.src_arg, len, lim, &err)))
        goto fail;
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double cus = (double)(t1.tv_sec - t0.tv_sec) * 1e6 + (double)(t1.tv_nsec - t0.tv_nsec) / 1e3;
    json_object_set_new(out, "compile_us", json_real(cus));
    json_object_set_new(out, "grammar_bytes", json_integer((json_int_t)gram_mem_bytes(gr)));
    json_object_set_new(out, "vocab_bytes", json_integer((json_int_t)tmask_vocab_mem_bytes(v)));
    if (!o.no_share && !o.no_memo &&
        !(sh = tmshare_create(gr, tmask_n_words(v), TMSHARE_DEFAULT_MASKS, &err)))
        goto fail;
    if (o.bench) {
        rc = bench(v, gr, &o, sh, buf ? buf : o.src_arg, len, c.json);
        goto done;
    }
    if (o.drive) {
        rc = drive(v, gr, o.no_memo, sh);
        goto done;
    }
    if (o.steps && walk(v, gr, &o, sh, out, c.json))
        goto done;
    if (c.json) {
        json_dumpf(out, stdout, JSON_COMPACT);
        fputc('\n', stdout);
    } else {
        json_t *x = json_object_get(out, "text");
        printf("compiled in %.0f us (%lld grammar bytes); end: %s; mask p50 %.1f us, p99 %.1f us\n"
               "text: %s\n", cus, (long long)gram_mem_bytes(gr),
               json_string_value(json_object_get(out, "end")) ? json_string_value(json_object_get(out, "end")) : "-",
               json_real_value(json_object_get(out, "mask_us_p50")),
               json_real_value(json_object_get(out, "mask_us_p99")), x ? json_string_value(x) : "");
    }
    rc = 0;
    goto done;
fail:
    fprintf(stderr, "kvant grammar: %s\n", err.msg);
done:
    json_decref(out);
    tmshare_destroy(sh);
    gram_destroy(gr);
    tmask_vocab_destroy(v);
    tok_destroy(t);
    gguf_close(g);
    free(buf);
    return rc;
}
