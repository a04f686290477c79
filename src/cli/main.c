/* main.c - the kvant binary: dispatches to one subcommand per file. */
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"
#include "kernels/dtype.h"

typedef struct cli_cmd {
    const char *name;
    int (*fn)(int argc, char **argv);
    const char *help;
} cli_cmd;

static const cli_cmd cmds[] = {
    {"serve", cmd_serve, "OpenAI-compatible HTTP server"},
    {"run", cmd_run, "generate text from a prompt"},
    {"tokenize", cmd_tokenize, "print the token ids of a text"},
    {"perplexity", cmd_perplexity, "perplexity of a text file (llama.cpp convention)"},
    {"info", cmd_info, "model metadata and tensors (--memory: memory profile)"},
    {"bench", cmd_bench, "prompt/generation speed, batched decode, roofline"},
    {"quantize", cmd_quantize, "write a quantized GGUF (RTN, calibrated, recipes)"},
    {"kl", cmd_kl, "perplexity and KL divergence against a base model"},
    {"plan", cmd_plan, "what fits in a memory budget (reads the GGUF header only)"},
    {"logits", cmd_logits, "dump teacher-forced logits (for reference tests)"},
};

static void usage(FILE *f)
{
    fprintf(f, "usage: kvant <command> [options]\n\ncommands:\n");
    for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++)
        fprintf(f, "  %-12s %s\n", cmds[i].name, cmds[i].help);
    fprintf(f, "\ncommon options: -m MODEL (default %s), -t THREADS, --json\n", CLI_DEFAULT_MODEL);
}

int main(int argc, char **argv)
{
    const char *isa_err = dtype_isa_error();
    if (isa_err) {
        fprintf(stderr, "kvant: %s\n", isa_err);
        return 2;
    }
    if (argc < 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++)
        if (!strcmp(argv[1], cmds[i].name))
            return cmds[i].fn(argc - 1, argv + 1);
    fprintf(stderr, "kvant: unknown command '%s'\n", argv[1]);
    usage(stderr);
    return 2;
}
