/* cmd_template.c - `kvant template`: the prompt a chat template renders
 * for a conversation (what a chat request would feed the model); reads
 * only the GGUF's metadata, so vocabulary-only files work. */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "text/chat.h"

static void template_help(void)
{
    static const cli_opt t[] = {
        {"--messages", "FILE", "the conversation: a JSON array of messages (required)", NULL},
        {"--tools", "FILE", "a JSON array of tools, passed to the template as `tools`", "none"},
        {"--add-generation-prompt", NULL, "end with the assistant turn opener", "off"},
        {"--chat-template", "FILE", "render this Jinja template instead of the model's", "the model's"},
    };
    cli_help("kvant template -m MODEL --messages FILE [options]",
             "Prints the prompt the model's chat template renders (--json: {\"prompt\": ...}).\n"
             "KVANT_TEMPLATE_TIME=SECONDS pins the time strftime_now() formats.",
             t, CLI_N_OPTS(t));
}

/* A JSON array read from path; NULL with err filled. */
static json_t *read_json_array(const char *path, const char *what, kvant_err *err)
{
    json_error_t je;
    json_t *j = json_load_file(path, 0, &je);
    if (!j) {
        kvant_err_set(err, KV_EINVAL, "%s %s: %s (line %d)", what, path, je.text, je.line);
        return NULL;
    }
    if (!json_is_array(j)) {
        kvant_err_set(err, KV_EINVAL, "%s %s: not a JSON array", what, path);
        json_decref(j);
        return NULL;
    }
    return j;
}

typedef struct template_opts {
    const char *messages, *tools, *tpl_file;
    int add_gen;
} template_opts;

static int parse_template_args(int argc, char **argv, cli_common *c, template_opts *o)
{
    for (int i = 1; i < argc; i++) {
        int r = cli_common_step(c, argc, argv, &i, template_help);
        if (r != CLI_STEP_OWN) {
            if (r == CLI_STEP_TAKEN)
                continue;
            return r == CLI_STEP_HELP ? -1 : CLI_EXIT_USAGE;
        }
        if (!strcmp(argv[i], "--messages")) {
            if (!(o->messages = cli_value(argc, argv, &i)))
                return CLI_EXIT_USAGE;
        } else if (!strcmp(argv[i], "--tools")) {
            if (!(o->tools = cli_value(argc, argv, &i)))
                return CLI_EXIT_USAGE;
        } else if (!strcmp(argv[i], "--chat-template")) {
            if (!(o->tpl_file = cli_value(argc, argv, &i)))
                return CLI_EXIT_USAGE;
        } else if (!strcmp(argv[i], "--add-generation-prompt")) {
            o->add_gen = 1;
        } else {
            return cli_err_unknown("template", argv[i]);
        }
    }
    if (!o->messages)
        return cli_err_usage("template", "missing --messages FILE");
    return 0;
}

int cmd_template(int argc, char **argv)
{
    cli_common c;
    cli_common_init(&c);
    template_opts o = {0};
    int pr = parse_template_args(argc, argv, &c, &o);
    if (pr)
        return pr < 0 ? 0 : pr;
    kvant_err err = {0};
    json_t *msgs = read_json_array(o.messages, "--messages", &err);
    json_t *tools = msgs && o.tools ? read_json_array(o.tools, "--tools", &err) : NULL;
    size_t src_len = 0;
    char *src = msgs && (!o.tools || tools) && o.tpl_file ? cli_read_file(o.tpl_file, &src_len, &err) : NULL;
    gguf_ctx *g = msgs && (!o.tools || tools) && (!o.tpl_file || src) ? gguf_open(c.model_path, &err) : NULL;
    chat_template tpl = {0};
    char *prompt = NULL;
    if (g && chat_template_from_gguf(g, src, src_len, &tpl, &err) == KV_OK)
        prompt = chat_render_json(&tpl, msgs, tools, o.add_gen, &err);
    int rc = prompt ? 0 : 1;
    if (!prompt) {
        fprintf(stderr, "kvant template: %s\n", err.msg);
    } else if (c.json) {
        json_t *out = json_pack("{s:s}", "prompt", prompt);
        char *s = out ? json_dumps(out, 0) : NULL;
        if (s)
            printf("%s\n", s);
        else
            rc = 1;
        free(s);
        json_decref(out);
    } else {
        fputs(prompt, stdout);
    }
    free(prompt);
    chat_template_free(&tpl);
    gguf_close(g);
    free(src);
    json_decref(tools);
    json_decref(msgs);
    return rc;
}
