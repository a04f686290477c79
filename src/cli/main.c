/* main.c - the kvant binary: dispatches to one subcommand per file. */
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"
#include "kernels/dtype.h"

typedef struct cli_cmd {
    const char *name;
    int (*fn)(int argc, char **argv);
    const char *help;
    int parallel; /* takes --tp / --pp (docs/PARALLEL.md) */
} cli_cmd;

static const cli_cmd cmds[] = {
    {"serve", cmd_serve, "OpenAI-compatible HTTP server", 1},
    {"top", cmd_top, "terminal view of a running server's memory and requests", 0},
    {"run", cmd_run, "generate text from a prompt", 1},
    {"tokenize", cmd_tokenize, "print the token ids of a text", 0},
    {"grammar", cmd_grammar, "compile a grammar / JSON schema and walk its token masks", 0},
    {"template", cmd_template, "print the prompt a chat template renders for a conversation", 0},
    {"perplexity", cmd_perplexity, "perplexity of a text file (llama.cpp convention)", 1},
    {"info", cmd_info, "model metadata and tensors (--memory: memory profile)", 0},
    {"bench", cmd_bench, "prompt/generation speed, batched decode, roofline", 1},
    {"quantize", cmd_quantize, "write a quantized GGUF (RTN, calibrated, recipes)", 0},
    {"prune", cmd_prune, "remove layers / FFN channels / KV heads chosen by calibration", 0},
    {"kl", cmd_kl, "perplexity and KL divergence against a base model", 0},
    {"plan", cmd_plan, "what fits in a memory budget (reads the GGUF header only)", 1},
    {"logits", cmd_logits, "dump teacher-forced logits (for reference tests)", 1},
};

#define N_CMDS (sizeof cmds / sizeof cmds[0])

static void usage(void)
{
    printf("usage: kvant <command> [options]\n"
           "       kvant <command> --help   (that command's options and defaults)\n"
           "\ncommands:\n");
    for (size_t i = 0; i < N_CMDS; i++)
        printf("  %-12s %s\n", cmds[i].name, cmds[i].help);
    cli_common_help(stdout);
}

static const cli_cmd *find_cmd(const char *name)
{
    for (size_t i = 0; i < N_CMDS; i++)
        if (!strcmp(name, cmds[i].name))
            return &cmds[i];
    return NULL;
}

/* One line naming the commands: "kvant: WHAT 'ARG' (commands: ...)". */
static int usage_error(const char *what, const char *arg)
{
    fprintf(stderr, "kvant: %s", what);
    if (arg)
        fprintf(stderr, " '%s'", arg);
    fputs(" (commands:", stderr);
    for (size_t i = 0; i < N_CMDS; i++)
        fprintf(stderr, " %s", cmds[i].name);
    fputs("; see 'kvant --help')\n", stderr);
    return CLI_EXIT_USAGE;
}

int main(int argc, char **argv)
{
    const char *isa_err = dtype_isa_error();
    if (isa_err) {
        fprintf(stderr, "kvant: %s\n", isa_err);
        return 2;
    }
    if (argc == 2 && !strcmp(argv[1], "--isa")) { /* the CPU kernels' instruction set */
        printf("%s\n", dtype_isa());
        return 0;
    }
    if (argc < 2)
        return usage_error("missing command", NULL);
    const char *a = argv[1];
    if (cli_is_help(a) || (!strcmp(a, "help") && argc == 2)) {
        usage();
        return 0;
    }
    if (!strcmp(a, "help")) { /* kvant help CMD = kvant CMD --help */
        const cli_cmd *c = find_cmd(argv[2]);
        char *hargv[] = {argv[2], "--help", NULL};
        return c ? c->fn(2, hargv) : usage_error("unknown command", argv[2]);
    }
    const cli_cmd *c = find_cmd(a);
    if (c && !c->parallel) /* one process only: its sessions would not agree with workers */
        for (int i = 2; i + 1 < argc; i++)
            if ((!strcmp(argv[i], "--tp") || !strcmp(argv[i], "--pp")) && strcmp(argv[i + 1], "1"))
                return cli_err_usage(a, "%s: runs in one process (--tp/--pp: serve, run, bench, "
                                     "perplexity, logits, plan)", argv[i]);
    if (c)
        return c->fn(argc - 1, argv + 1);
    if (a[0] == '-')
        return usage_error("unknown option", a);
    return usage_error("unknown command", a);
}
