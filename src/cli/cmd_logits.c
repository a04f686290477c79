/* cmd_logits.c - `kvant logits`: teacher-forced logits of a token list,
 * written as raw little-endian float32 [n_tokens][n_vocab].  Used by the
 * reference tests to compare kvant with an independent implementation. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"

static int32_t *parse_ids(const char *s, int32_t *n_out)
{
    int32_t cap = 256, n = 0;
    int32_t *ids = malloc((size_t)cap * sizeof *ids);
    while (ids && *s) {
        char *end;
        while (*s == ' ' || *s == '\n' || *s == '\t' || *s == ',' || *s == '\r')
            s++;
        if (!*s)
            break;
        errno = 0;
        long v = strtol(s, &end, 10);
        if (end == s || errno || v < 0 || v > INT32_MAX) {
            free(ids);
            return NULL;
        }
        if (n == cap) {
            cap *= 2;
            int32_t *nb = realloc(ids, (size_t)cap * sizeof *ids);
            if (!nb) {
                free(ids);
                return NULL;
            }
            ids = nb;
        }
        ids[n++] = (int32_t)v;
        s = end;
    }
    *n_out = n;
    return ids;
}

static void logits_help(void)
{
    static const cli_opt t[] = {
        {"--tokens-file", "PATH", "token ids, separated by spaces, commas or newlines (required)",
         NULL},
        {"--out", "PATH", "where to write float32 [n_tokens][n_vocab] (required)", NULL},
        {"-b, --batch", "N", "tokens per forward pass, 1..4096", "64"},
    };
    cli_help("kvant logits --tokens-file IDS --out FILE [options]",
             "Writes the teacher-forced logits of a token list (for the reference tests).", t,
             CLI_N_OPTS(t));
}

int cmd_logits(int argc, char **argv)
{
    cli_common c;
    cli_common_init(&c);
    const char *ids_file = NULL, *out_path = NULL;
    long ubatch = 64;
    for (int i = 1; i < argc; i++) {
        int r = cli_common_step(&c, argc, argv, &i, logits_help);
        if (r != CLI_STEP_OWN) {
            if (r == CLI_STEP_TAKEN)
                continue;
            return r == CLI_STEP_HELP ? 0 : CLI_EXIT_USAGE;
        }
        const char *v;
        if (!strcmp(argv[i], "--tokens-file")) {
            if (!(ids_file = cli_value(argc, argv, &i)))
                return CLI_EXIT_USAGE;
        } else if (!strcmp(argv[i], "--out")) {
            if (!(out_path = cli_value(argc, argv, &i)))
                return CLI_EXIT_USAGE;
        } else if (!strcmp(argv[i], "-b") || !strcmp(argv[i], "--batch")) {
            if (!(v = cli_value(argc, argv, &i)) || cli_parse_int(argv[i - 1], v, 1, 4096, &ubatch))
                return CLI_EXIT_USAGE;
        } else {
            return cli_err_unknown("logits", argv[i]);
        }
    }
    if (!ids_file || !out_path)
        return cli_err_usage("logits", "missing %s", ids_file ? "--out FILE" : "--tokens-file IDS");
    kvant_err err = {0};
    size_t len;
    char *text = cli_read_file(ids_file, &len, &err);
    int32_t n = 0;
    int32_t *ids = text ? parse_ids(text, &n) : NULL;
    free(text);
    if (!ids || n == 0) {
        fprintf(stderr, "kvant logits: %s\n", err.msg[0] ? err.msg : "no valid token ids");
        free(ids);
        return 1;
    }
    cli_session s;
    int rc = 1;
    float *all = NULL;
    if (cli_session_open(&s, &c, n, (int32_t)ubatch, (int32_t)ubatch, &err)) {
        fprintf(stderr, "kvant logits: %s\n", err.msg);
        free(ids);
        return 1;
    }
    all = malloc((size_t)n * s.m->hp.n_vocab * sizeof(float));
    if (!all) {
        fprintf(stderr, "kvant logits: out of memory\n");
    } else if (cli_session_eval(&s, ids, n, 0, 1, all, &err)) {
        fprintf(stderr, "kvant logits: %s\n", err.msg);
    } else {
        FILE *f = fopen(out_path, "wb");
        size_t cnt = (size_t)n * s.m->hp.n_vocab;
        if (!f || fwrite(all, sizeof(float), cnt, f) != cnt || fclose(f)) {
            fprintf(stderr, "kvant logits: cannot write %s\n", out_path);
        } else {
            rc = 0;
            if (c.json)
                printf("{\"n_tokens\": %d, \"n_vocab\": %d}\n", n, s.m->hp.n_vocab);
        }
    }
    free(all);
    free(ids);
    cli_session_close(&s);
    return rc;
}
