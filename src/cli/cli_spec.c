/* cli_spec.c - the speculative decoding options of `kvant serve`, `kvant
 * run` and `kvant bench --batch`: --spec ngram|draft|off, --draft-model
 * PATH, --spec-draft N, --spec-ngram-min N, --spec-ngram-max N,
 * --spec-max-batch N (engine_config.spec*, engine/engine_spec.h,
 * engine/engine_draft.h). */
#include <string.h>

#include "cli/cli.h"
#include "engine/engine_spec.h"

void cli_spec_help(FILE *f)
{
    const engine_spec_limits d = engine_spec_resolve(&(engine_config){0});
    char draft[16], draft_help[64], nmin[16], nmax[16], batch[16];
    snprintf(draft, sizeof draft, "%d", d.draft_max);
    snprintf(draft_help, sizeof draft_help, "drafted tokens per verification at most (1-%d)",
             ENGINE_SPEC_MAX);
    snprintf(nmin, sizeof nmin, "%d", d.ngram_min);
    snprintf(nmax, sizeof nmax, "%d", d.ngram_max);
    snprintf(batch, sizeof batch, "%d", d.max_batch);
    const cli_opt t[] = {
        {"--spec", "ngram|draft|off", "speculative decoding: ngram drafts by prompt lookup, "
                                      "draft by a draft model, verified in one pass (greedy: "
                                      "the same output; sampled: the same distribution)", "off"},
        {"--draft-model", "PATH", "the draft model's GGUF (same vocabulary; its weights and KV "
                                  "come out of the same budget); implies --spec draft", "none"},
        {"--spec-draft", "N", draft_help, draft},
        {"--spec-ngram-min", "N", "shortest n-gram looked up", nmin},
        {"--spec-ngram-max", "N", "longest n-gram looked up (tried first)", nmax},
        {"--spec-max-batch", "N", "no drafting while more sequences than this run", batch},
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
        if (strcmp(v, "ngram") && strcmp(v, "draft") && strcmp(v, "off")) {
            fprintf(stderr, "kvant: --spec: expected ngram, draft or off, got '%s'\n", v);
            return -1;
        }
        ec->spec = !strcmp(v, "ngram") ? ENGINE_SPEC_NGRAM
                   : !strcmp(v, "draft") ? ENGINE_SPEC_DRAFT : ENGINE_SPEC_OFF;
        return 1;
    }
    if (!strcmp(a, "--draft-model")) {
        if (!(v = cli_value(argc, argv, i)))
            return -1;
        ec->spec_draft_model = v;
        if (ec->spec == ENGINE_SPEC_OFF)
            ec->spec = ENGINE_SPEC_DRAFT;
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
    const engine_spec_limits lim = engine_spec_resolve(ec);
    if (lim.ngram_min > lim.ngram_max)
        return cli_err_usage(cmd, "--spec-ngram-min must not exceed --spec-ngram-max");
    if (ec->spec == ENGINE_SPEC_DRAFT && !ec->spec_draft_model)
        return cli_err_usage(cmd, "--spec draft needs --draft-model PATH");
    if (ec->spec_draft_model && ec->spec == ENGINE_SPEC_NGRAM)
        return cli_err_usage(cmd, "--draft-model is for --spec draft, not --spec ngram");
    return 0;
}
