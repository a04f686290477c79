/* cli_spec.c - the speculative decoding options of `kvant serve` and
 * `kvant bench --batch`: --spec ngram|off, --spec-draft N,
 * --spec-ngram-min N, --spec-ngram-max N, --spec-max-batch N
 * (engine_config.spec*, engine/engine_spec.h). */
#include <string.h>

#include "cli/cli.h"

void cli_spec_help(FILE *f)
{
    static const cli_opt t[] = {
        {"--spec", "ngram|off", "speculative decoding of greedy requests: ngram drafts by "
                                "prompt lookup, verified in one pass (same output)", "off"},
        {"--spec-draft", "N", "drafted tokens per verification at most (1-16)", "8"},
        {"--spec-ngram-min", "N", "shortest n-gram looked up", "2"},
        {"--spec-ngram-max", "N", "longest n-gram looked up (tried first)", "4"},
        {"--spec-max-batch", "N", "no drafting while more sequences than this run", "4"},
    };
    cli_help_table(f, "speculative decoding", t, CLI_N_OPTS(t));
}

int cli_spec_parse(engine_config *ec, int argc, char **argv, int *i)
{
    static const struct { const char *name; long lo, hi; } t[] = {
        {"--spec-draft", 1, ENGINE_SPEC_MAX},
        {"--spec-ngram-min", 1, 64},
        {"--spec-ngram-max", 1, 64},
        {"--spec-max-batch", 1, 1 << 16},
    };
    const char *a = argv[*i], *v;
    if (!strcmp(a, "--spec")) {
        if (!(v = cli_value(argc, argv, i)))
            return -1;
        if (strcmp(v, "ngram") && strcmp(v, "off")) {
            fprintf(stderr, "kvant: --spec: expected ngram or off, got '%s' (a draft model is "
                            "not implemented)\n", v);
            return -1;
        }
        ec->spec = !strcmp(v, "ngram") ? ENGINE_SPEC_NGRAM : ENGINE_SPEC_OFF;
        return 1;
    }
    for (size_t k = 0; k < sizeof t / sizeof t[0]; k++) {
        if (strcmp(a, t[k].name))
            continue;
        long x;
        if (!(v = cli_value(argc, argv, i)) || cli_parse_int(t[k].name, v, t[k].lo, t[k].hi, &x))
            return -1;
        int32_t *dst[] = {&ec->spec_draft_max, &ec->spec_ngram_min, &ec->spec_ngram_max,
                          &ec->spec_max_batch};
        *dst[k] = (int32_t)x;
        return 1;
    }
    return 0;
}

int cli_spec_check(const engine_config *ec, const char *cmd)
{
    int32_t lo = ec->spec_ngram_min > 0 ? ec->spec_ngram_min : 2;
    int32_t hi = ec->spec_ngram_max > 0 ? ec->spec_ngram_max : 4;
    if (lo > hi)
        return cli_err_usage(cmd, "--spec-ngram-min must not exceed --spec-ngram-max");
    return 0;
}
