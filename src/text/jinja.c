/* jinja.c - compiling a template and running its statements.
 *
 * Scoping follows jinja2: each loop iteration and each macro call runs in
 * a fresh frame (a {% set %} inside does not leak out, which is why
 * templates use namespace()); if blocks share their parent's frame; a
 * macro's frame sits on the template's top-level frame, so it sees the
 * top-level variables set before it is called.
 */
#include "text/jinja.h"

#include <stdlib.h>
#include <string.h>

#include "text/jinja_expr.h"
#include "text/jinja_json.h"
#include "text/jinja_lex.h"
#include "text/jinja_parse.h"

#define JINJA_TPL_BUDGET ((size_t)256 << 20)

struct jinja_tpl {
    jv_arena *a;
    jnode *root;
};

enum { FLOW_BREAK = 1, FLOW_CONTINUE = 2 };

jinja_limits jinja_limits_default(void)
{
    jinja_limits l = {
        .max_output = (size_t)16 << 20,
        .max_iters = 1000000,
        .arena_budget = (size_t)512 << 20,
        .max_depth = 64,
    };
    return l;
}

int jinja_compile(const char *src, size_t len, jinja_tpl **out, kvant_err *err)
{
    *out = NULL;
    jinja_tpl *t = calloc(1, sizeof *t);
    if (!t || !(t->a = jv_arena_create(JINJA_TPL_BUDGET))) {
        free(t);
        return kvant_err_set(err, KV_ENOMEM, "chat template: out of memory");
    }
    jtok *toks = NULL;
    size_t nt = 0;
    int rc = jlex_run(t->a, src, len, &toks, &nt, err);
    if (rc == KV_OK)
        rc = jparse_run(t->a, toks, nt, &t->root, err);
    if (rc) {
        jinja_free(t);
        return rc;
    }
    *out = t;
    return KV_OK;
}

void jinja_free(jinja_tpl *t)
{
    if (!t)
        return;
    jv_arena_destroy(t->a);
    free(t);
}

static int exec_body(jexpr_ctx *E, jnode *const *items, size_t n, jscope *s, jv_buf *out);

static jscope *new_scope(jexpr_ctx *E, jscope *parent)
{
    jscope *sc = jv_alloc(E->a, sizeof *sc);
    if (!sc)
        return NULL;
    sc->parent = parent;
    sc->vars = jv_dict_new(E->a, 4);
    return sc->vars.t == JV_DICT ? sc : NULL;
}

static int out_check(jexpr_ctx *E, jv_buf *out, int line)
{
    if (out->fail == 2)
        return jexpr_fail(E, line, "output larger than %zu bytes", E->max_output);
    if (out->fail)
        return jexpr_fail(E, line, "out of memory");
    return KV_OK;
}

/* Binds targets (one name, or a tuple to unpack) in s. */
static int assign(jexpr_ctx *E, const jnode *n, jscope *s, jv v)
{
    if (n->n_names == 1)
        return jv_dict_set_str(E->a, s->vars, n->names[0], v) ? jexpr_fail(E, n->line, "out of memory") : KV_OK;
    jv items;
    if (jexpr_iterable(E, v, n->line, &items))
        return KV_EINVAL;
    if (items.u.l->n != n->n_names)
        return jexpr_fail(E, n->line, "%s values to unpack (expected %zu, got %zu)",
                          items.u.l->n > n->n_names ? "too many" : "not enough", n->n_names, items.u.l->n);
    for (size_t i = 0; i < n->n_names; i++)
        if (jv_dict_set_str(E->a, s->vars, n->names[i], items.u.l->v[i]))
            return jexpr_fail(E, n->line, "out of memory");
    return KV_OK;
}

static int exec_set(jexpr_ctx *E, const jnode *n, jscope *s)
{
    jv v;
    if (jexpr_eval(E, n->a, s, &v))
        return KV_EINVAL;
    if (!n->op)
        return assign(E, n, s, v);
    jv ns = jexpr_lookup(E, s, n->names[0]);
    if (ns.t != JV_DICT || !ns.u.d->ns)
        return jexpr_fail(E, n->line, "cannot assign attribute on non-namespace object");
    return jv_dict_set_str(E->a, ns, n->name, v) ? jexpr_fail(E, n->line, "out of memory") : KV_OK;
}

/* Renders a body into a fresh string (macro calls, block sets, filter blocks). */
static int render_to_str(jexpr_ctx *E, jnode *const *items, size_t n, jscope *s, int line, jv *out)
{
    jv_buf b;
    jv_buf_init(&b, E->a, E->max_output);
    int rc = exec_body(E, items, n, s, &b);
    if (rc < 0)
        return rc;
    if ((rc = out_check(E, &b, line)))
        return rc;
    *out = jv_buf_take(&b);
    return out->t == JV_STR ? KV_OK : jexpr_fail(E, line, "out of memory");
}

static int exec_setblock(jexpr_ctx *E, const jnode *n, jscope *s)
{
    jscope *inner = new_scope(E, s);
    jv v;
    if (!inner)
        return jexpr_fail(E, n->line, "out of memory");
    if (render_to_str(E, n->items, n->n_items, inner, n->line, &v))
        return KV_EINVAL;
    if (n->b && jexpr_filter_chain(E, n->b, s, v, &v))
        return KV_EINVAL;
    return assign(E, n, s, v);
}

static int exec_filterblock(jexpr_ctx *E, const jnode *n, jscope *s, jv_buf *out)
{
    jv v;
    if (render_to_str(E, n->items, n->n_items, s, n->line, &v) || jexpr_filter_chain(E, n->b, s, v, &v))
        return KV_EINVAL;
    jv str = jv_to_str(E->a, v);
    if (str.t == JV_STR)
        jv_buf_add(out, str.u.s->s, str.u.s->n);
    return out_check(E, out, n->line);
}

static jv loop_object(jexpr_ctx *E, jv items, size_t i)
{
    size_t n = items.u.l->n;
    jv d = jv_dict_new(E->a, 12);
    jv_func *cyc = jv_alloc(E->a, sizeof *cyc);
    if (d.t != JV_DICT || !cyc)
        return jv_undef_named(E->a, "loop", "out of memory");
    cyc->kind = JF_CYCLE;
    cyc->name = "cycle";
    cyc->self = jv_int((int64_t)i);
    jv cv = {.t = JV_FUNC, .u.fn = cyc};
    jv_dict_set_str(E->a, d, "index", jv_int((int64_t)i + 1));
    jv_dict_set_str(E->a, d, "index0", jv_int((int64_t)i));
    jv_dict_set_str(E->a, d, "revindex", jv_int((int64_t)(n - i)));
    jv_dict_set_str(E->a, d, "revindex0", jv_int((int64_t)(n - i - 1)));
    jv_dict_set_str(E->a, d, "first", jv_bool(i == 0));
    jv_dict_set_str(E->a, d, "last", jv_bool(i + 1 == n));
    jv_dict_set_str(E->a, d, "length", jv_int((int64_t)n));
    jv_dict_set_str(E->a, d, "depth", jv_int(1));
    jv_dict_set_str(E->a, d, "depth0", jv_int(0));
    jv_dict_set_str(E->a, d, "cycle", cv);
    if (i > 0)
        jv_dict_set_str(E->a, d, "previtem", items.u.l->v[i - 1]);
    if (i + 1 < n)
        jv_dict_set_str(E->a, d, "nextitem", items.u.l->v[i + 1]);
    return d;
}

static int count_iter(jexpr_ctx *E, int line)
{
    if (++E->iters > E->max_iters)
        return jexpr_fail(E, line, "more than %zu loop iterations", E->max_iters);
    return KV_OK;
}

/* The items a loop walks, after its "if" filter. */
static int loop_items(jexpr_ctx *E, const jnode *n, jscope *s, jv *out)
{
    jv it, items = jv_none();
    if (jexpr_eval(E, n->a, s, &it) || jexpr_iterable(E, it, n->line, &items))
        return KV_EINVAL;
    if (!n->b) {
        *out = items;
        return KV_OK;
    }
    jv kept = jv_list_new(E->a, items.u.l->n);
    for (size_t i = 0; i < items.u.l->n; i++) {
        jscope *sc = new_scope(E, s);
        jv c;
        if (!sc || count_iter(E, n->line) || assign(E, n, sc, items.u.l->v[i]) || jexpr_eval(E, n->b, sc, &c))
            return sc ? KV_EINVAL : jexpr_fail(E, n->line, "out of memory");
        if (jv_truthy(c) && jv_list_push(E->a, kept, items.u.l->v[i]))
            return jexpr_fail(E, n->line, "out of memory");
    }
    *out = kept;
    return KV_OK;
}

static int exec_for(jexpr_ctx *E, const jnode *n, jscope *s, jv_buf *out)
{
    jv items = jv_none();
    if (loop_items(E, n, s, &items))
        return KV_EINVAL;
    for (size_t i = 0; i < items.u.l->n; i++) {
        jscope *sc = new_scope(E, s);
        if (!sc)
            return jexpr_fail(E, n->line, "out of memory");
        if (count_iter(E, n->line) || assign(E, n, sc, items.u.l->v[i]))
            return KV_EINVAL;
        jv lo = loop_object(E, items, i);
        if (lo.t != JV_DICT || jv_dict_set_str(E->a, sc->vars, "loop", lo))
            return jexpr_fail(E, n->line, "out of memory");
        int rc = exec_body(E, n->items, n->n_items, sc, out);
        if (rc < 0)
            return rc;
        if (rc == FLOW_BREAK)
            break;
    }
    if (items.u.l->n == 0 && n->n_items2) {
        int rc = exec_body(E, n->items2, n->n_items2, s, out);
        return rc < 0 ? rc : KV_OK;
    }
    return KV_OK;
}

static int call_macro(jexpr_ctx *E, const jv_func *fn, const jv_args *args, int line, jv *out)
{
    const jnode *m = fn->node;
    if (E->depth >= E->max_depth)
        return jexpr_fail(E, line, "macro calls nested deeper than %d", E->max_depth);
    if (args->n_pos > m->n_names)
        return jexpr_fail(E, line, "macro '%s' takes not more than %zu argument(s)", m->name, m->n_names);
    jscope *sc = new_scope(E, E->root);
    if (!sc)
        return jexpr_fail(E, line, "out of memory");
    for (size_t k = 0; k < args->n_kw; k++) {
        size_t i = 0;
        while (i < m->n_names && strcmp(m->names[i], args->kwn[k]))
            i++;
        if (i == m->n_names)
            return jexpr_fail(E, line, "macro '%s' has no argument '%s'", m->name, args->kwn[k]);
    }
    for (size_t i = 0; i < m->n_names; i++) {
        jv v = jv_undef_named(E->a, m->names[i], NULL);
        int have = 0;
        if (i < args->n_pos) {
            v = args->pos[i];
            have = 1;
        }
        for (size_t k = 0; k < args->n_kw && !have; k++)
            if (!strcmp(args->kwn[k], m->names[i])) {
                v = args->kwv[k];
                have = 1;
            }
        if (!have && m->items2[i] && jexpr_eval(E, m->items2[i], sc, &v))
            return KV_EINVAL;
        if (jv_dict_set_str(E->a, sc->vars, m->names[i], v))
            return jexpr_fail(E, line, "out of memory");
    }
    E->depth++;
    int rc = render_to_str(E, m->items, m->n_items, sc, line, out);
    E->depth--;
    return rc;
}

static int exec_stmt(jexpr_ctx *E, const jnode *n, jscope *s, jv_buf *out)
{
    jv v;
    switch (n->kind) {
    case JS_TEXT: jv_buf_add(out, n->val.u.s->s, n->val.u.s->n); return out_check(E, out, n->line);
    case JS_OUTPUT:
        if (jexpr_eval(E, n->a, s, &v))
            return KV_EINVAL;
        v = jv_to_str(E->a, v);
        if (v.t == JV_STR)
            jv_buf_add(out, v.u.s->s, v.u.s->n);
        return out_check(E, out, n->line);
    case JS_IF:
        if (jexpr_eval(E, n->a, s, &v))
            return KV_EINVAL;
        return jv_truthy(v) ? exec_body(E, n->items, n->n_items, s, out) : exec_body(E, n->items2, n->n_items2, s, out);
    case JS_FOR: return exec_for(E, n, s, out);
    case JS_SET: return exec_set(E, n, s);
    case JS_SETBLOCK: return exec_setblock(E, n, s);
    case JS_FILTERBLOCK: return exec_filterblock(E, n, s, out);
    case JS_BODY: return exec_body(E, n->items, n->n_items, s, out);
    case JS_BREAK: return FLOW_BREAK;
    case JS_CONTINUE: return FLOW_CONTINUE;
    case JS_MACRO: {
        jv_func *f = jv_alloc(E->a, sizeof *f);
        if (!f)
            return jexpr_fail(E, n->line, "out of memory");
        f->kind = JF_MACRO;
        f->name = n->name;
        f->node = n;
        jv fv = {.t = JV_FUNC, .u.fn = f};
        return jv_dict_set_str(E->a, s->vars, n->name, fv) ? jexpr_fail(E, n->line, "out of memory") : KV_OK;
    }
    default: return jexpr_fail(E, n->line, "node kind %d is not a statement", (int)n->kind);
    }
}

static int exec_body(jexpr_ctx *E, jnode *const *items, size_t n, jscope *s, jv_buf *out)
{
    if (n && E->nest >= JEXPR_MAX_NEST)
        return jexpr_fail(E, items[0]->line, "template nested deeper than %d levels at run time", JEXPR_MAX_NEST);
    E->nest++;
    int rc = KV_OK;
    for (size_t i = 0; i < n && !rc; i++)
        rc = exec_stmt(E, items[i], s, out);
    E->nest--;
    return rc;
}

char *jinja_render(const jinja_tpl *t, const json_t *vars, int64_t now, const jinja_limits *lim, kvant_err *err)
{
    jinja_limits dl = jinja_limits_default();
    if (!lim)
        lim = &dl;
    if (!t || (vars && !json_is_object(vars))) {
        kvant_err_set(err, KV_EINVAL, "jinja_render: no template, or the variables are not an object");
        return NULL;
    }
    jv_arena *a = jv_arena_create(lim->arena_budget);
    if (!a) {
        kvant_err_set(err, KV_ENOMEM, "chat template: out of memory");
        return NULL;
    }
    jexpr_ctx E = {.a = a, .err = err, .now = now, .max_depth = lim->max_depth, .max_iters = lim->max_iters,
                   .max_output = lim->max_output, .call_macro = call_macro};
    jscope *ctx = new_scope(&E, NULL);
    jscope *root = ctx ? new_scope(&E, ctx) : NULL;
    char *res = NULL;
    if (!root) {
        kvant_err_set(err, KV_ENOMEM, "chat template: out of memory");
    } else {
        if (vars)
            ctx->vars = jjson_from(a, vars);
        E.root = root;
        E.filter_input = jv_undef_named(a, "", NULL);
        jv_buf out;
        jv_buf_init(&out, a, lim->max_output);
        jv_buf_add(&out, "", 0);
        int rc = ctx->vars.t == JV_DICT ? exec_body(&E, t->root->items, t->root->n_items, root, &out)
                                        : kvant_err_set(err, KV_ENOMEM, "chat template: out of memory");
        if (rc >= 0 && out_check(&E, &out, 0) == KV_OK) {
            res = malloc(out.n + 1);
            if (res) {
                if (out.n)
                    memcpy(res, out.p, out.n);
                res[out.n] = '\0';
            } else {
                kvant_err_set(err, KV_ENOMEM, "chat template: out of memory");
            }
        }
    }
    jv_arena_destroy(a);
    return res;
}
