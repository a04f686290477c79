/* cmd_info.c - `kvant info`: metadata, hyper-parameters and a table of
 * tensors with type and bytes.  Reads only the GGUF header. */
#include <inttypes.h>
#include <string.h>

#include "cli/cli.h"
#include "kernels/dtype.h"

/* Prints a scalar or a short description of an array value. */
static void print_value(const gguf_ctx *g, int64_t i, int json)
{
    gguf_type t = gguf_kv_type(g, i);
    const char *key = NULL;
    gguf_str k = gguf_key(g, i);
    char kbuf[GGUF_MAX_NAME + 1];
    snprintf(kbuf, sizeof kbuf, "%.*s", (int)k.len, k.ptr);
    key = kbuf;
    kvant_err err = {0};
    if (t == GGUF_TYPE_STRING) {
        gguf_str s;
        gguf_get_str(g, key, &s, &err);
        size_t n = s.len > 200 ? 200 : s.len;
        if (json)
            cli_json_string(stdout, s.ptr, n);
        else
            printf("%.*s%s", (int)n, s.ptr, s.len > n ? "..." : "");
    } else if (t == GGUF_TYPE_ARRAY) {
        if (json)
            printf("{\"array\": \"%s\", \"n\": %" PRIu64 "}", gguf_type_name(gguf_arr_type(g, i)),
                   gguf_arr_n(g, i));
        else
            printf("[%s x %" PRIu64 "]", gguf_type_name(gguf_arr_type(g, i)), gguf_arr_n(g, i));
    } else if (t == GGUF_TYPE_FLOAT32 || t == GGUF_TYPE_FLOAT64) {
        float f = 0;
        gguf_get_f32(g, key, &f, &err);
        printf("%g", (double)f);
    } else if (t == GGUF_TYPE_BOOL) {
        int b = 0;
        gguf_get_bool(g, key, &b, &err);
        printf("%s", b ? "true" : "false");
    } else {
        int64_t v = 0;
        gguf_get_i64(g, key, &v, &err);
        printf("%" PRId64, v);
    }
}

static void print_tensors(const gguf_ctx *g, int json)
{
    int64_t n = gguf_n_tensors(g);
    uint64_t total = 0;
    if (!json)
        printf("\n%-32s %-6s %22s %12s\n", "tensor", "type", "shape", "bytes");
    for (int64_t i = 0; i < n; i++) {
        const gguf_tensor_info *ti = gguf_tensor(g, i);
        const dtype_traits *tr = dtype_get(ti->type);
        char shape[64];
        if (ti->n_dims > 2) /* stacked experts: [cols, rows, n_expert] */
            snprintf(shape, sizeof shape, "[%" PRIu64 ", %" PRIu64 ", %" PRIu64 "]", ti->ne[0],
                     ti->ne[1], ti->ne[2]);
        else
            snprintf(shape, sizeof shape, "[%" PRIu64 ", %" PRIu64 "]", ti->ne[0], ti->ne[1]);
        total += ti->nbytes;
        if (json) {
            printf("%s{\"name\": ", i ? ", " : "");
            cli_json_string(stdout, ti->name.ptr, ti->name.len);
            printf(", \"type\": \"%s\", \"ne\": [%" PRIu64 ", %" PRIu64 ", %" PRIu64 ", %" PRIu64
                   "], \"bytes\": %" PRIu64 "}",
                   tr ? tr->name : "?", ti->ne[0], ti->ne[1], ti->ne[2], ti->ne[3], ti->nbytes);
        } else {
            printf("%-32.*s %-6s %22s %12" PRIu64 "\n", (int)ti->name.len, ti->name.ptr,
                   tr ? tr->name : "?", shape, ti->nbytes);
        }
    }
    if (json)
        printf("], \"tensor_bytes\": %" PRIu64, total);
    else
        printf("%d tensors, %" PRIu64 " bytes\n", (int)n, total);
}

static void info_help(void)
{
    static const cli_opt t[] = {
        {"--memory", NULL, "memory profile: which layers and buffers use the memory", "off"},
    };
    cli_help("kvant info [options]",
             "Prints the model's metadata, hyper-parameters and tensors (reads the GGUF\n"
             "header only).",
             t, CLI_N_OPTS(t));
}

/* A hybrid's recurrent layers: "kind": [layers] and the state per sequence,
 * as JSON members or a text line. */
static void print_recr(const model_hparams *hp, int json)
{
    static const char *const kind[] = {"none", "shortconv", "mamba2", "gated_deltanet"};
    const model_family_hp *f = &hp->fam;
    char lay[2048];
    int n = 0;
    for (int il = 0; il < hp->n_layers && n < (int)sizeof lay - 8; il++)
        if (f->is_recr[il])
            n += snprintf(lay + n, sizeof lay - (size_t)n, "%s%d", n ? (json ? ", " : ",") : "",
                          il);
    const unsigned long long b = (unsigned long long)model_recr_state_bytes(f, hp->n_embd);
    const char *k = f->recr >= 0 && f->recr <= RECR_GDN ? kind[f->recr] : "?";
    if (json)
        printf(", \"recurrent\": \"%s\", \"recurrent_layers\": [%s], \"state_bytes\": %llu", k,
               f->recr ? lay : "", b);
    else if (f->recr)
        printf("  recurrent layers (%s): %s; state %llu bytes per sequence\n", k, lay, b);
}

/* The family's layer recipe (model/model_arch.h) and the values this file
 * gives it: text, or the members of a JSON "recipe" object. */
static void print_recipe(const model_hparams *hp, int json)
{
    const model_recipe *r = hp->recipe;
    const model_family_hp *f = &hp->fam;
    char swa[160] = "none";
    int n = 0;
    for (int il = 0; f->n_swa && il < hp->n_layers && n < (int)sizeof swa - 8; il++)
        if (f->is_swa[il])
            n += snprintf(swa + n, sizeof swa - (size_t)n, "%s%d", n ? "," : "", il);
    if (json) {
        printf(", \"recipe\": {\"rope\": \"%s\", \"ffn\": \"%s\", \"qk_norm\": %s, "
               "\"post_norms\": %s, \"fused_qkv\": %s, \"fused_gate_up\": %s, "
               "\"q_scale\": %g, \"attn_softcap\": %g, \"final_softcap\": %g, "
               "\"emb_scale\": %g, \"rope_attn_factor\": %g, \"window\": %u, "
               "\"window_layers\": [%s], \"rope_base_swa\": %g, \"rope_scale_swa\": %g, "
               "\"experts\": %u, \"experts_used\": %u, \"expert_ff\": %u, \"shared_ff\": %u, "
               "\"experts_norm_w\": %s",
               r->rope == ROPE_NEOX ? "neox" : "norm",
               r->act == FFN_GELU_TANH ? "geglu" : r->act == FFN_RELU_SQR ? "relu2" : "swiglu",
               r->qk_norm ? "true" : "false", r->post_norms ? "true" : "false",
               r->fused_qkv ? "true" : "false", r->fused_gate_up ? "true" : "false",
               (double)f->q_scale, (double)f->attn_softcap, (double)f->final_softcap,
               (double)f->emb_scale, (double)f->rope_attn_factor, f->n_swa,
               f->n_swa ? swa : "", (double)f->rope_base_swa, (double)f->rope_scale_swa,
               f->n_expert, f->n_expert_used, f->n_ff_exp, f->n_ff_shexp,
               f->n_expert && r->moe_norm_w ? "true" : "false");
        print_recr(hp, json);
        printf("}");
        return;
    }
    printf("recipe %s: %s\n", r->arch, r->notes);
    printf("  query scale %g, attention soft-cap %g, final soft-cap %g, embedding scale %g, "
           "rope scale %g, rope attn_factor %g%s\n",
           (double)f->q_scale, (double)f->attn_softcap, (double)f->final_softcap,
           (double)f->emb_scale, (double)hp->rope_freq_scale, (double)f->rope_attn_factor,
           f->longrope ? (f->use_long ? ", LongRoPE long factors" : ", LongRoPE short factors")
                       : "");
    if (f->n_expert)
        printf("  experts: %u, %u per token, %u wide%s; shared expert %u wide\n", f->n_expert,
               f->n_expert_used, f->n_ff_exp, r->moe_norm_w ? ", weights normalised" : "",
               f->n_ff_shexp);
    if (f->n_swa)
        printf("  sliding window %u on layers %s (rope base %g, scale %g); other layers global\n",
               f->n_swa, swa, (double)f->rope_base_swa, (double)f->rope_scale_swa);
    print_recr(hp, json);
}

int cmd_info(int argc, char **argv)
{
    cli_common c;
    int memory = 0;
    cli_common_init(&c);
    for (int i = 1; i < argc; i++) {
        if (cli_is_help(argv[i])) {
            info_help();
            return 0;
        }
        int r = cli_common_parse(&c, argc, argv, &i);
        if (r < 0)
            return CLI_EXIT_USAGE;
        if (r == 0 && !strcmp(argv[i], "--memory"))
            memory = 1;
        else if (r == 0)
            return cli_err_unknown("info", argv[i]);
    }
    kvant_err err = {0};
    gguf_ctx *g = gguf_open(c.model_path, &err);
    if (!g) {
        fprintf(stderr, "kvant info: %s\n", err.msg);
        return 1;
    }
    model_hparams hp;
    int hp_ok = model_hparams_from_gguf(g, &hp, &err) == KV_OK;
    if (memory) {
        int rc = hp_ok ? info_memory(g, &hp, c.json) : 1;
        if (!hp_ok)
            fprintf(stderr, "kvant info: %s\n", err.msg);
        gguf_close(g);
        return rc;
    }
    if (c.json) {
        printf("{\"path\": ");
        cli_json_string(stdout, c.model_path, strlen(c.model_path));
        printf(", \"version\": %u, \"metadata\": {", gguf_version(g));
    } else {
        printf("%s: GGUF v%u, %" PRId64 " keys, %" PRId64 " tensors\n", c.model_path,
               gguf_version(g), gguf_n_kv(g), gguf_n_tensors(g));
    }
    for (int64_t i = 0; i < gguf_n_kv(g); i++) {
        gguf_str k = gguf_key(g, i);
        if (c.json) {
            printf("%s", i ? ", " : "");
            cli_json_string(stdout, k.ptr, k.len);
            printf(": ");
        } else {
            printf("  %-40.*s = ", (int)k.len, k.ptr);
        }
        print_value(g, i, c.json);
        if (!c.json)
            printf("\n");
    }
    if (c.json) {
        printf("}, \"supported\": %s", hp_ok ? "true" : "false");
        if (hp_ok)
            printf(", \"arch\": \"%s\", \"n_layers\": %d, \"n_embd\": %d, \"n_head\": %d, "
                   "\"n_head_kv\": %d, \"head_dim\": %d, \"n_ff\": %d, \"n_vocab\": %d, "
                   "\"n_ctx_train\": %lld",
                   model_arch_name(hp.arch), hp.n_layers, hp.n_embd, hp.n_head, hp.n_head_kv,
                   hp.head_dim, hp.n_ff, hp.n_vocab, (long long)hp.n_ctx_train);
        if (hp_ok)
            print_recipe(&hp, 1);
        else
            printf(", \"error\": "), cli_json_string(stdout, err.msg, strlen(err.msg));
        printf(", \"tensors\": [");
    } else if (hp_ok) {
        printf("\narch %s: %d layers, n_embd %d, %d heads (%d kv, dim %d), n_ff %d, vocab %d, "
               "ctx %lld, rope base %g\n",
               model_arch_name(hp.arch), hp.n_layers, hp.n_embd, hp.n_head, hp.n_head_kv,
               hp.head_dim, hp.n_ff, hp.n_vocab, (long long)hp.n_ctx_train, (double)hp.rope_base);
        print_recipe(&hp, 0);
    } else {
        printf("\nnot runnable by kvant: %s\n", err.msg);
    }
    print_tensors(g, c.json);
    if (c.json)
        printf("}\n");
    gguf_close(g);
    return 0;
}
