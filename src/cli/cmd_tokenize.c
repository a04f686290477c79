/* cmd_tokenize.c - `kvant tokenize`: token ids of a text; works on
 * vocabulary-only GGUF files (no tensors needed). */
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "text/tokenizer.h"

static void tokenize_help(void)
{
    static const cli_opt t[] = {
        {"-p, --prompt", "TEXT", "text to tokenize (this or -f is required)", NULL},
        {"-f, --file", "PATH", "tokenize a file's contents (this or -p is required)", NULL},
        {"--no-bos", NULL, "do not add the BOS token the model asks for", "off"},
        {"--parse-special", NULL, "read special tokens (<|im_start|>...) as single ids", "off"},
        {"--pieces", NULL, "print each id with its text piece, one per line", "off"},
    };
    cli_help("kvant tokenize (-p TEXT | -f FILE) [options]",
             "Prints the token ids of a text; works on vocabulary-only GGUF files.", t,
             CLI_N_OPTS(t));
}

int cmd_tokenize(int argc, char **argv)
{
    cli_common c;
    cli_common_init(&c);
    const char *text = NULL, *file = NULL;
    int no_bos = 0, parse_special = 0, show_pieces = 0;
    for (int i = 1; i < argc; i++) {
        int r = cli_common_step(&c, argc, argv, &i, tokenize_help);
        if (r != CLI_STEP_OWN) {
            if (r == CLI_STEP_TAKEN)
                continue;
            return r == CLI_STEP_HELP ? 0 : CLI_EXIT_USAGE;
        }
        if (!strcmp(argv[i], "-p") || !strcmp(argv[i], "--prompt")) {
            if (!(text = cli_value(argc, argv, &i)))
                return CLI_EXIT_USAGE;
        } else if (!strcmp(argv[i], "-f") || !strcmp(argv[i], "--file")) {
            if (!(file = cli_value(argc, argv, &i)))
                return CLI_EXIT_USAGE;
        } else if (!strcmp(argv[i], "--no-bos")) {
            no_bos = 1;
        } else if (!strcmp(argv[i], "--parse-special")) {
            parse_special = 1;
        } else if (!strcmp(argv[i], "--pieces")) {
            show_pieces = 1;
        } else {
            return cli_err_unknown("tokenize", argv[i]);
        }
    }
    if (!!text == !!file)
        return cli_err_usage("tokenize", "%s", text ? "give -p TEXT or -f FILE, not both"
                                                    : "missing -p TEXT or -f FILE");
    kvant_err err = {0};
    size_t len = text ? strlen(text) : 0;
    char *buf = NULL;
    if (file && !(buf = cli_read_file(file, &len, &err))) {
        fprintf(stderr, "kvant tokenize: %s\n", err.msg);
        return 1;
    }
    const char *src = buf ? buf : text;
    gguf_ctx *g = gguf_open(c.model_path, &err);
    tokenizer *t = g ? tok_create(g, &err) : NULL;
    int rc = 1;
    int32_t *ids = NULL;
    if (!t) {
        fprintf(stderr, "kvant tokenize: %s\n", err.msg);
        goto out;
    }
    int add_bos = no_bos ? 0 : tok_add_bos(t);
    int64_t n = tok_encode(t, src, len, add_bos, parse_special, NULL, 0, &err);
    if (n >= 0 && !(ids = malloc((size_t)(n + 1) * sizeof *ids)))
        n = kvant_err_set(&err, KV_ENOMEM, "out of memory");
    if (n >= 0)
        n = tok_encode(t, src, len, add_bos, parse_special, ids, n, &err);
    if (n < 0) {
        fprintf(stderr, "kvant tokenize: %s\n", err.msg);
        goto out;
    }
    if (c.json)
        fputc('[', stdout);
    for (int64_t i = 0; i < n; i++) {
        if (c.json) {
            printf("%s%d", i ? ", " : "", ids[i]);
        } else if (show_pieces) {
            char piece[256];
            int pl = tok_piece(t, ids[i], 1, piece, sizeof piece);
            printf("%6d -> '%.*s'\n", ids[i], pl > 0 && pl < 256 ? pl : 0, piece);
        } else {
            printf("%s%d", i ? " " : "", ids[i]);
        }
    }
    if (c.json || !show_pieces)
        printf(c.json ? "]\n" : "\n");
    rc = 0;
out:
    free(ids);
    tok_destroy(t);
    gguf_close(g);
    free(buf);
    return rc;
}
