/* cmd_info_mem.c - `kvant info --memory`: where the memory of a model goes,
 * largest consumers first: weights per layer and per tensor kind, KV bytes
 * per token per layer, and the activation workspace by buffer (the planner's
 * layout for the default batch shape).  Header only. */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "kernels/dtype.h"
#include "mem/plan.h"

#define INFO_MAX_KINDS 64

typedef struct mem_item {
    char name[64];
    uint64_t bytes;
} mem_item;

static int item_cmp(const void *a, const void *b)
{
    const mem_item *x = a, *y = b;
    return x->bytes < y->bytes ? 1 : x->bytes > y->bytes ? -1 : strcmp(x->name, y->name);
}

static void add_item(mem_item *items, int *n, int cap, const char *name, uint64_t bytes)
{
    for (int i = 0; i < *n; i++) {
        if (!strcmp(items[i].name, name)) {
            items[i].bytes += bytes;
            return;
        }
    }
    if (*n < cap) {
        snprintf(items[*n].name, sizeof items[*n].name, "%s", name);
        items[(*n)++].bytes = bytes;
    }
}

/* "blk.12.attn_q.weight" -> layer 12, kind "attn_q"; globals: layer -1. */
static int split_name(gguf_str s, char *kind, size_t cap)
{
    char name[GGUF_MAX_NAME + 1];
    snprintf(name, sizeof name, "%.*s", (int)s.len, s.ptr);
    int layer = -1;
    const char *k = name;
    if (!strncmp(name, "blk.", 4)) {
        char *end;
        layer = (int)strtol(name + 4, &end, 10);
        k = *end == '.' ? end + 1 : end;
    }
    snprintf(kind, cap, "%s", k);
    char *dot = strrchr(kind, '.');
    if (dot && !strcmp(dot, ".weight"))
        *dot = '\0';
    return layer;
}

static void print_items(const char *title, mem_item *items, int n, int json, int last)
{
    char buf[32];
    qsort(items, (size_t)n, sizeof *items, item_cmp);
    if (json) {
        printf("\"%s\": [", title);
        for (int i = 0; i < n; i++)
            printf("%s{\"name\": \"%s\", \"bytes\": %" PRIu64 "}", i ? ", " : "", items[i].name,
                   items[i].bytes);
        printf("]%s", last ? "" : ", ");
        return;
    }
    printf("\n%s (largest first):\n", title);
    for (int i = 0; i < n; i++)
        printf("  %-24s %12s\n", items[i].name, mem_format_size(items[i].bytes, buf, 32));
}

int info_memory(const gguf_ctx *g, const model_hparams *hp, int json)
{
    static mem_item layers[MODEL_MAX_LAYERS + 1], kinds[INFO_MAX_KINDS], acts[16];
    int n_layers = 0, n_kinds = 0, n_acts = 0;
    for (int64_t i = 0; i < gguf_n_tensors(g); i++) {
        const gguf_tensor_info *ti = gguf_tensor(g, i);
        char kind[GGUF_MAX_NAME + 1], lname[64];
        int layer = split_name(ti->name, kind, sizeof kind);
        if (layer >= 0)
            snprintf(lname, sizeof lname, "layer %d", layer);
        else
            snprintf(lname, sizeof lname, "%.63s", kind);
        add_item(layers, &n_layers, MODEL_MAX_LAYERS + 1, lname, ti->nbytes);
        kind[63] = '\0';
        add_item(kinds, &n_kinds, INFO_MAX_KINDS, kind, ti->nbytes);
    }
    plan_config pc = plan_config_default();
    plan_model pm;
    model_plan_shape(hp, 1, &pm);
    plan_act_layout l;
    plan_activation_layout(&pm, pc.max_num_batched_tokens, pc.max_num_seqs, 1, &l);
    struct { const char *n; uint64_t off, end; } buf[] = {
        {"x (residual)", l.x, l.xn}, {"xn (normed / matmul out)", l.xn, l.q},
        {"q", l.q, l.k}, {"k", l.k, l.v}, {"v", l.v, l.att}, {"attention out", l.att, l.gate},
        {"ffn gate", l.gate, l.up}, {"ffn up", l.up, l.logits},
        {"logits", l.logits, l.scratch}, {"attention scratch", l.scratch, l.total},
    };
    for (size_t i = 0; i < sizeof buf / sizeof buf[0]; i++)
        add_item(acts, &n_acts, 16, buf[i].n, buf[i].end - buf[i].off);
    uint64_t kv_layer = 2ull * hp->n_head_kv * hp->head_dim * sizeof(float);
    if (json) {
        printf("{\"kv_bytes_per_token_per_layer\": %" PRIu64 ", \"kv_bytes_per_token\": %" PRIu64
               ", \"activation_batch_tokens\": %d, \"activation_bytes\": %" PRIu64 ", ",
               kv_layer, kv_layer * (uint64_t)hp->n_layers, pc.max_num_batched_tokens, l.total);
    } else {
        char b1[32], b2[32];
        printf("KV cache (f32): %s per token per layer, %s per token for %d layers\n",
               mem_format_size(kv_layer, b1, 32),
               mem_format_size(kv_layer * (uint64_t)hp->n_layers, b2, 32), hp->n_layers);
        printf("activation workspace for %d tokens x %d sequences: %s\n",
               pc.max_num_batched_tokens, pc.max_num_seqs, mem_format_size(l.total, b1, 32));
    }
    print_items("weights_by_layer", layers, n_layers, json, 0);
    print_items("weights_by_kind", kinds, n_kinds, json, 0);
    print_items("activations_by_buffer", acts, n_acts, json, 1);
    if (json)
        printf("}\n");
    return 0;
}
