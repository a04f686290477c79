/* jinja_parse.c - recursive-descent Jinja parser (see jinja_parse.h).
 *
 * Each parse_* function mirrors the jinja2 Parser method of the same name
 * so precedence questions can be settled by reading jinja2/parser.py.
 * Every error names the construct and the line it is on.
 */
#include "text/jinja_parse.h"

#include <stdio.h>
#include <string.h>

#include "text/jinja_filt.h"
#include "text/jinja_meth.h"

typedef struct parser {
    jv_arena *a;
    const jtok *t;
    size_t pos, n;
    int depth;
    kvant_err *err;
} parser;

typedef struct nvec {
    jnode **v;
    size_t n, cap;
} nvec;

static const jtok *cur(parser *P) { return &P->t[P->pos < P->n ? P->pos : P->n - 1]; }
static const jtok *peek(parser *P, size_t k) { return &P->t[P->pos + k < P->n ? P->pos + k : P->n - 1]; }
static void next(parser *P) { P->pos += P->pos + 1 < P->n; }

static int tok_is(const jtok *t, jtok_type ty, const char *s)
{
    return t->t == ty && (!s || (t->n == strlen(s) && memcmp(t->s, s, t->n) == 0));
}
static int is_op(parser *P, const char *s) { return tok_is(cur(P), JT_OP, s); }
static int is_name(parser *P, const char *s) { return tok_is(cur(P), JT_NAME, s); }

static int fail(parser *P, const char *what)
{
    const jtok *t = cur(P);
    const char *desc = t->t == JT_EOF ? "end of template" : t->t == JT_BLOCK_END ? "'%}'" : t->t == JT_VAR_END ? "'}}'" : NULL;
    if (desc)
        return kvant_err_set(P->err, KV_EINVAL, "chat template: %s at line %d (found %s)", what, t->line, desc);
    return kvant_err_set(P->err, KV_EINVAL, "chat template: %s at line %d (found '%.*s')", what, t->line,
                         (int)(t->n > 40 ? 40 : t->n), t->s ? t->s : "");
}

static int oom(parser *P) { return kvant_err_set(P->err, KV_ENOMEM, "chat template: out of memory"); }

static jnode *mk(parser *P, jn_kind k)
{
    jnode *n = jv_alloc(P->a, sizeof *n);
    if (n) {
        n->kind = k;
        n->line = cur(P)->line;
    }
    return n;
}

static int vpush(parser *P, nvec *v, jnode *n)
{
    if (v->n == v->cap) {
        size_t nc = v->cap ? v->cap * 2 : 8;
        jnode **p = jv_alloc(P->a, nc * sizeof *p);
        if (!p)
            return oom(P);
        if (v->n)
            memcpy(p, v->v, v->n * sizeof *p);
        v->v = p;
        v->cap = nc;
    }
    v->v[v->n++] = n;
    return KV_OK;
}

static const char *tok_str(parser *P, const jtok *t)
{
    char *s = jv_alloc(P->a, t->n + 1);
    if (s)
        memcpy(s, t->s, t->n);
    return s;
}

static int expect_op(parser *P, const char *op)
{
    char what[48];
    snprintf(what, sizeof what, "expected '%s'", op);
    return is_op(P, op) ? (next(P), KV_OK) : fail(P, what);
}

static int expect_end(parser *P, const char *tag)
{
    char what[80];
    snprintf(what, sizeof what, "expected end of '%s' tag", tag);
    return cur(P)->t == JT_BLOCK_END ? (next(P), KV_OK) : fail(P, what);
}

static int parse_expr(parser *P, jnode **out);
static int parse_or(parser *P, jnode **out);
static int parse_tuple(parser *P, int with_cond, jnode **out);

/* (args): positional and keyword arguments into n's items / names+items2. */
static int parse_call_args(parser *P, jnode *n)
{
    nvec pos = {0}, kwv = {0};
    const char *kwn[64];
    size_t nkw = 0;
    int rc = expect_op(P, "(");
    while (rc == KV_OK && !is_op(P, ")")) {
        if (is_op(P, "*") || is_op(P, "**"))
            return fail(P, "unsupported construct: *args / **kwargs in a call");
        jnode *e = NULL;
        if (cur(P)->t == JT_NAME && tok_is(peek(P, 1), JT_OP, "=")) {
            if (nkw == 64)
                return fail(P, "too many keyword arguments");
            kwn[nkw++] = tok_str(P, cur(P));
            next(P);
            next(P);
            rc = parse_expr(P, &e);
            if (rc == KV_OK)
                rc = vpush(P, &kwv, e);
        } else {
            if (nkw)
                return fail(P, "positional argument after keyword argument");
            rc = parse_expr(P, &e);
            if (rc == KV_OK)
                rc = vpush(P, &pos, e);
        }
        if (rc == KV_OK && !is_op(P, ")"))
            rc = expect_op(P, ",");
    }
    if (rc)
        return rc;
    next(P);
    n->items = pos.v;
    n->n_items = pos.n;
    n->items2 = kwv.v;
    n->n_items2 = kwv.n;
    if (nkw) {
        n->names = jv_alloc(P->a, nkw * sizeof *n->names);
        if (!n->names)
            return oom(P);
        memcpy(n->names, kwn, nkw * sizeof *kwn);
        n->n_names = nkw;
    }
    return KV_OK;
}

/* A dotted name after | or is. */
static int parse_dotted(parser *P, const char **out)
{
    if (cur(P)->t != JT_NAME)
        return fail(P, "expected a filter or test name");
    const char *s = tok_str(P, cur(P));
    next(P);
    if (is_op(P, "."))
        return fail(P, "unsupported construct: dotted filter or test name");
    *out = s;
    return s ? KV_OK : oom(P);
}

static int parse_filter(parser *P, jnode *operand, jnode **out)
{
    jnode *n = mk(P, JN_FILTER);
    if (!n)
        return oom(P);
    n->a = operand;
    int rc = parse_dotted(P, &n->name);
    if (rc)
        return rc;
    if (jfilt_filter_status(n->name) == 0)
        return kvant_err_set(P->err, KV_EUNSUP, "chat template: unsupported filter '%s' at line %d", n->name,
                             n->line);
    if (is_op(P, "(") && (rc = parse_call_args(P, n)))
        return rc;
    *out = n;
    return KV_OK;
}

static int test_arg_start(parser *P)
{
    const jtok *t = cur(P);
    if (t->t == JT_NAME)
        return !is_name(P, "else") && !is_name(P, "or") && !is_name(P, "and");
    return t->t == JT_STRING || t->t == JT_INT || t->t == JT_FLOAT || is_op(P, "[") || is_op(P, "{");
}

static int parse_primary(parser *P, jnode **out);
static int parse_postfix(parser *P, jnode *node, jnode **out);
static int parse_test(parser *P, jnode *operand, jnode **out)
{
    jnode *n = mk(P, JN_TEST);
    if (!n)
        return oom(P);
    n->a = operand;
    next(P); /* is */
    if (is_name(P, "not")) {
        n->op = 1;
        next(P);
    }
    int rc = parse_dotted(P, &n->name);
    if (rc)
        return rc;
    if (jfilt_test_status(n->name) == 0)
        return kvant_err_set(P->err, KV_EUNSUP, "chat template: unsupported test '%s' at line %d", n->name,
                             n->line);
    if (is_op(P, "(")) {
        rc = parse_call_args(P, n);
    } else if (test_arg_start(P)) {
        jnode *arg = NULL;
        rc = parse_primary(P, &arg);
        if (rc == KV_OK)
            rc = parse_postfix(P, arg, &arg);
        if (rc == KV_OK) {
            n->items = jv_alloc(P->a, sizeof *n->items);
            if (!n->items)
                return oom(P);
            n->items[0] = arg;
            n->n_items = 1;
        }
    }
    *out = n;
    return rc;
}

static int parse_subscript(parser *P, jnode *obj, jnode **out)
{
    jnode *parts[3] = {NULL, NULL, NULL};
    int nparts = 0, rc = KV_OK;
    next(P); /* [ */
    for (;;) {
        if (!is_op(P, ":") && !is_op(P, "]") && (rc = parse_expr(P, &parts[nparts])))
            return rc;
        if (is_op(P, ":") && nparts < 2) {
            nparts++;
            next(P);
            continue;
        }
        break;
    }
    if ((rc = expect_op(P, "]")))
        return rc;
    jnode *n = mk(P, nparts ? JN_SLICE : JN_ITEM);
    if (!n)
        return oom(P);
    n->a = obj;
    n->b = parts[0];
    n->c = parts[1];
    n->d = parts[2];
    if (!nparts && !parts[0])
        return fail(P, "empty subscript");
    *out = n;
    return KV_OK;
}

/* 'literal'.format(...) with a format spec ({:>5}, {0.attr}) is refused:
 * kvant's str.format has plain fields and !r / !s only. */
static int check_format(parser *P, const jnode *callee)
{
    size_t n = 0;
    const char *f = callee->kind == JN_ATTR && !strcmp(callee->name, "format") && callee->a->kind == JN_CONST &&
                    callee->a->val.t == JV_STR ? jmeth_format_unsupported(callee->a->val.u.s->s, &n) : NULL;
    return f ? kvant_err_set(P->err, KV_EUNSUP, "chat template: unsupported construct: str.format spec '%.*s' at "
                             "line %d", (int)(n > 40 ? 40 : n), f, callee->line) : KV_OK;
}

static int parse_postfix(parser *P, jnode *node, jnode **out)
{
    int rc = KV_OK;
    for (;;) {
        if (is_op(P, ".")) {
            next(P);
            const jtok *t = cur(P);
            jnode *n = mk(P, t->t == JT_INT ? JN_ITEM : JN_ATTR);
            if (!n)
                return oom(P);
            n->a = node;
            if (t->t == JT_NAME) {
                n->name = tok_str(P, t);
            } else if (t->t == JT_INT) {
                if (!(n->b = mk(P, JN_CONST)))
                    return oom(P);
                n->b->val = jv_int(t->i);
            } else {
                return fail(P, "expected an attribute name after '.'");
            }
            next(P);
            node = n;
        } else if (is_op(P, "[")) {
            if ((rc = parse_subscript(P, node, &node)))
                return rc;
        } else if (is_op(P, "(")) {
            jnode *n = mk(P, JN_CALL);
            if (!n)
                return oom(P);
            n->a = node;
            if ((rc = parse_call_args(P, n)) || (rc = check_format(P, node)))
                return rc;
            node = n;
        } else {
            break;
        }
    }
    *out = node;
    return KV_OK;
}

static int parse_filter_expr(parser *P, jnode *node, jnode **out)
{
    int rc = KV_OK;
    for (;;) {
        if (is_op(P, "|")) {
            next(P);
            rc = parse_filter(P, node, &node);
        } else if (is_name(P, "is")) {
            rc = parse_test(P, node, &node);
        } else if (is_op(P, "(")) {
            jnode *n = mk(P, JN_CALL);
            if (!n)
                return oom(P);
            n->a = node;
            rc = parse_call_args(P, n);
            node = n;
        } else {
            break;
        }
        if (rc)
            return rc;
    }
    *out = node;
    return KV_OK;
}

/* [a, b] or {k: v} */
static int parse_list_or_dict(parser *P, int dict, jnode **out)
{
    jnode *n = mk(P, dict ? JN_DICT : JN_LIST);
    if (!n)
        return oom(P);
    nvec keys = {0}, vals = {0};
    const char *close = dict ? "}" : "]";
    next(P);
    int rc = KV_OK;
    while (rc == KV_OK && !is_op(P, close)) {
        jnode *k = NULL, *v = NULL;
        rc = parse_expr(P, &k);
        if (rc == KV_OK && dict) {
            rc = expect_op(P, ":");
            if (rc == KV_OK)
                rc = parse_expr(P, &v);
            if (rc == KV_OK)
                rc = vpush(P, &vals, v);
        }
        if (rc == KV_OK)
            rc = vpush(P, &keys, k);
        if (rc == KV_OK && !is_op(P, close))
            rc = expect_op(P, ",");
    }
    if (rc)
        return rc;
    next(P);
    n->items = keys.v;
    n->n_items = keys.n;
    n->items2 = vals.v;
    n->n_items2 = vals.n;
    *out = n;
    return KV_OK;
}

static int parse_name_const(parser *P, jnode *n, const jtok *t)
{
    static const char *const names[] = {"true", "True", "false", "False", "none", "None"};
    for (int i = 0; i < 6; i++) {
        if (tok_is(t, JT_NAME, names[i])) {
            n->kind = JN_CONST;
            n->val = i < 2 ? jv_bool(1) : i < 4 ? jv_bool(0) : jv_none();
            return KV_OK;
        }
    }
    n->kind = JN_NAME;
    n->name = tok_str(P, t);
    return n->name ? KV_OK : oom(P);
}

static int parse_primary(parser *P, jnode **out)
{
    const jtok *t = cur(P);
    if (is_op(P, "(")) {
        next(P);
        jnode *e = NULL;
        int rc;
        if (is_op(P, ")")) {
            if (!(e = mk(P, JN_TUPLE)))
                return oom(P);
        } else if ((rc = parse_tuple(P, 1, &e))) {
            return rc;
        }
        *out = e;
        return expect_op(P, ")");
    }
    if (is_op(P, "[") || is_op(P, "{"))
        return parse_list_or_dict(P, is_op(P, "{"), out);
    jnode *n = mk(P, JN_CONST);
    if (!n)
        return oom(P);
    *out = n;
    if (t->t == JT_NAME) {
        next(P);
        return parse_name_const(P, n, t);
    }
    if (t->t == JT_INT || t->t == JT_FLOAT) {
        n->val = t->t == JT_INT ? jv_int(t->i) : jv_float(t->f);
        next(P);
        return KV_OK;
    }
    if (t->t == JT_STRING) {
        jv_buf b;
        jv_buf_init(&b, P->a, (size_t)1 << 28);
        while (cur(P)->t == JT_STRING) {
            jv_buf_add(&b, cur(P)->s, cur(P)->n);
            next(P);
        }
        n->val = jv_buf_take(&b);
        return n->val.t == JV_STR ? KV_OK : oom(P);
    }
    return fail(P, "expected an expression");
}

static int parse_unary(parser *P, int with_filter, jnode **out)
{
    if (++P->depth > JPARSE_MAX_DEPTH)
        return kvant_err_set(P->err, KV_ERANGE, "chat template: expression nested deeper than %d at line %d",
                             JPARSE_MAX_DEPTH, cur(P)->line);
    int rc;
    jnode *node = NULL;
    if (is_op(P, "-") || is_op(P, "+")) {
        if (!(node = mk(P, JN_UNARY)))
            return oom(P);
        node->op = is_op(P, "-") ? JOP_NEG : JOP_POS;
        next(P);
        rc = parse_unary(P, 0, &node->a);
    } else {
        rc = parse_primary(P, &node);
    }
    if (rc == KV_OK)
        rc = parse_postfix(P, node, &node);
    if (rc == KV_OK && with_filter)
        rc = parse_filter_expr(P, node, &node);
    P->depth--;
    *out = node;
    return rc;
}

typedef struct binop_row {
    const char *tok;
    int op;
} binop_row;

/* Left-associative levels, lowest first, below comparisons. */
static const binop_row LVL_MATH1[] = {{"+", JOP_ADD}, {"-", JOP_SUB}, {NULL, 0}};
static const binop_row LVL_CONCAT[] = {{"~", JOP_CONCAT}, {NULL, 0}};
static const binop_row LVL_MATH2[] = {{"*", JOP_MUL}, {"/", JOP_DIV}, {"//", JOP_FLOORDIV}, {"%", JOP_MOD}, {NULL, 0}};
static const binop_row LVL_POW[] = {{"**", JOP_POW}, {NULL, 0}};
static const binop_row *const LEVELS[] = {LVL_MATH1, LVL_CONCAT, LVL_MATH2, LVL_POW};

static jnode *mk_bin(parser *P, int op, jnode *l, jnode *r)
{
    jnode *n = mk(P, JN_BINOP);
    if (n) {
        n->op = op;
        n->a = l;
        n->b = r;
    }
    return n;
}

static int parse_level(parser *P, int lvl, jnode **out)
{
    if (lvl == 4)
        return parse_unary(P, 1, out);
    jnode *l = NULL;
    int rc = parse_level(P, lvl + 1, &l);
    while (rc == KV_OK) {
        const binop_row *r = LEVELS[lvl];
        while (r->tok && !is_op(P, r->tok))
            r++;
        if (!r->tok)
            break;
        next(P);
        jnode *rhs = NULL;
        if ((rc = parse_level(P, lvl + 1, &rhs)))
            break;
        if (r->op == JOP_MOD && l->kind == JN_CONST && l->val.t == JV_STR)
            return kvant_err_set(P->err, KV_EUNSUP, "chat template: unsupported construct: printf-style "
                                 "'...' %% x formatting at line %d", l->line);
        if (!(l = mk_bin(P, r->op, l, rhs)))
            return oom(P);
    }
    *out = l;
    return rc;
}

static int cmp_op(parser *P)
{
    static const binop_row ops[] = {{"==", JOP_EQ}, {"!=", JOP_NE}, {"<", JOP_LT}, {"<=", JOP_LE}, {">", JOP_GT}, {">=", JOP_GE}};
    for (size_t i = 0; i < sizeof ops / sizeof ops[0]; i++)
        if (is_op(P, ops[i].tok))
            return ops[i].op;
    if (is_name(P, "in"))
        return JOP_IN;
    if (is_name(P, "not") && tok_is(peek(P, 1), JT_NAME, "in"))
        return JOP_NOTIN;
    return 0;
}

/* a < b < c is (a < b) and (b < c), as Python chains comparisons. */
static int parse_compare(parser *P, jnode **out)
{
    jnode *l = NULL, *chain = NULL;
    int rc = parse_level(P, 0, &l), op;
    while (rc == KV_OK && (op = cmp_op(P))) {
        next(P);
        if (op == JOP_NOTIN)
            next(P);
        jnode *r = NULL;
        if ((rc = parse_level(P, 0, &r)))
            break;
        jnode *c = mk_bin(P, op, l, r);
        if (!c || (chain && !(c = mk_bin(P, JOP_AND, chain, c))))
            return oom(P);
        chain = c;
        l = r;
    }
    *out = chain ? chain : l;
    return rc;
}

static int parse_not(parser *P, jnode **out)
{
    if (!is_name(P, "not"))
        return parse_compare(P, out);
    jnode *n = mk(P, JN_UNARY);
    if (!n)
        return oom(P);
    n->op = JOP_NOT;
    next(P);
    if (++P->depth > JPARSE_MAX_DEPTH)
        return fail(P, "expression nested too deep");
    int rc = parse_not(P, &n->a);
    P->depth--;
    *out = n;
    return rc;
}

static int parse_andor(parser *P, int is_or, jnode **out)
{
    jnode *l = NULL;
    int rc = is_or ? parse_andor(P, 0, &l) : parse_not(P, &l);
    while (rc == KV_OK && is_name(P, is_or ? "or" : "and")) {
        next(P);
        jnode *r = NULL;
        if ((rc = is_or ? parse_andor(P, 0, &r) : parse_not(P, &r)))
            break;
        if (!(l = mk_bin(P, is_or ? JOP_OR : JOP_AND, l, r)))
            return oom(P);
    }
    *out = l;
    return rc;
}

static int parse_or(parser *P, jnode **out) { return parse_andor(P, 1, out); }

static int parse_expr(parser *P, jnode **out)
{
    jnode *e = NULL;
    int rc = parse_or(P, &e);
    while (rc == KV_OK && is_name(P, "if")) {
        jnode *c = mk(P, JN_COND);
        if (!c)
            return oom(P);
        next(P);
        c->b = e;
        if ((rc = parse_or(P, &c->a)))
            return rc;
        if (is_name(P, "else")) {
            next(P);
            if (++P->depth > JPARSE_MAX_DEPTH)
                return fail(P, "expression nested too deep");
            rc = parse_expr(P, &c->c);
            P->depth--;
        }
        e = c;
    }
    *out = e;
    return rc;
}

static int tuple_end(parser *P)
{
    const jtok *t = cur(P);
    return t->t == JT_BLOCK_END || t->t == JT_VAR_END || t->t == JT_EOF || is_op(P, ")") || is_op(P, "]") ||
           is_op(P, "}") || is_op(P, "=") || is_name(P, "if") || is_name(P, "in");
}

static int parse_tuple(parser *P, int with_cond, jnode **out)
{
    jnode *first = NULL;
    int rc = with_cond ? parse_expr(P, &first) : parse_or(P, &first);
    if (rc || !is_op(P, ","))
        return *out = first, rc;
    nvec items = {0};
    if ((rc = vpush(P, &items, first)))
        return rc;
    while (is_op(P, ",")) {
        next(P);
        if (tuple_end(P))
            break;
        jnode *e = NULL;
        if ((rc = with_cond ? parse_expr(P, &e) : parse_or(P, &e)) || (rc = vpush(P, &items, e)))
            return rc;
    }
    jnode *t = mk(P, JN_TUPLE);
    if (!t)
        return oom(P);
    t->items = items.v;
    t->n_items = items.n;
    *out = t;
    return KV_OK;
}

/* ---- statements ---- */

static int parse_body(parser *P, const char *const *ends, nvec *body);

static int tag_is(parser *P, const char *name)
{
    return cur(P)->t == JT_BLOCK_BEGIN && tok_is(peek(P, 1), JT_NAME, name);
}

/* Parses a body up to one of ends; *which gets the index of the end tag
 * found (its name is consumed, the tag's end is not). */
static int parse_until(parser *P, const char *const *ends, nvec *body, int *which, int open_line, const char *tag)
{
    int rc = parse_body(P, ends, body);
    if (rc)
        return rc;
    if (cur(P)->t == JT_EOF)
        return kvant_err_set(P->err, KV_EINVAL, "chat template: '%s' tag at line %d is never closed (expected '%s')",
                             tag, open_line, ends[0]);
    for (int i = 0; ends[i]; i++) {
        if (tag_is(P, ends[i])) {
            *which = i;
            next(P);
            next(P);
            return KV_OK;
        }
    }
    return fail(P, "unexpected tag");
}

static void set_body(jnode *n, nvec *v, int second)
{
    *(second ? &n->items2 : &n->items) = v->v;
    *(second ? &n->n_items2 : &n->n_items) = v->n;
}

/* After "if" / "elif": condition, body, then elif / else / endif. */
static int parse_if(parser *P, jnode **out, int open_line)
{
    static const char *const ends[] = {"endif", "elif", "else", NULL};
    static const char *const end_only[] = {"endif", NULL};
    jnode *n = mk(P, JS_IF);
    if (!n)
        return oom(P);
    int rc = parse_tuple(P, 0, &n->a), which = 0;
    if (rc == KV_OK)
        rc = expect_end(P, "if");
    nvec body = {0}, els = {0};
    if (rc == KV_OK)
        rc = parse_until(P, ends, &body, &which, open_line, "if");
    if (rc)
        return rc;
    set_body(n, &body, 0);
    if (which == 1) {
        jnode *e = NULL;
        if (++P->depth > JPARSE_MAX_DEPTH)
            return fail(P, "if/elif chain nested too deep");
        rc = parse_if(P, &e, open_line);
        P->depth--;
        if (rc == KV_OK)
            rc = vpush(P, &els, e);
    } else if (which == 2) {
        rc = expect_end(P, "else");
        if (rc == KV_OK)
            rc = parse_until(P, end_only, &els, &which, open_line, "if");
        if (rc == KV_OK)
            rc = expect_end(P, "endif");
    } else {
        rc = expect_end(P, "endif");
    }
    set_body(n, &els, 1);
    *out = n;
    return rc;
}

/* Targets of for / set: a, b  or  (a, b). */
static int parse_targets(parser *P, jnode *n, const char *tag)
{
    const char *names[16];
    size_t k = 0;
    int paren = is_op(P, "(");
    if (paren)
        next(P);
    for (;;) {
        if (cur(P)->t != JT_NAME || k == 16) {
            char what[64];
            snprintf(what, sizeof what, "expected a name to assign in '%s'", tag);
            return fail(P, what);
        }
        if (!(names[k++] = tok_str(P, cur(P))))
            return oom(P);
        next(P);
        if (!is_op(P, ","))
            break;
        next(P);
    }
    if (paren && expect_op(P, ")"))
        return KV_EINVAL;
    n->names = jv_alloc(P->a, k * sizeof *names);
    if (!n->names)
        return oom(P);
    memcpy(n->names, names, k * sizeof *names);
    n->n_names = k;
    return KV_OK;
}

static int parse_for(parser *P, jnode **out, int open_line)
{
    static const char *const ends[] = {"endfor", "else", NULL};
    static const char *const end_only[] = {"endfor", NULL};
    jnode *n = mk(P, JS_FOR);
    if (!n)
        return oom(P);
    int rc = parse_targets(P, n, "for"), which = 0;
    if (rc)
        return rc;
    if (!is_name(P, "in"))
        return fail(P, "expected 'in' in 'for'");
    next(P);
    if ((rc = parse_tuple(P, 0, &n->a)))
        return rc;
    if (is_name(P, "if")) {
        next(P);
        if ((rc = parse_expr(P, &n->b)))
            return rc;
    }
    if (is_name(P, "recursive"))
        return kvant_err_set(P->err, KV_EUNSUP, "chat template: unsupported construct 'recursive' loop at line %d",
                             cur(P)->line);
    nvec body = {0}, els = {0};
    rc = expect_end(P, "for");
    if (rc == KV_OK)
        rc = parse_until(P, ends, &body, &which, open_line, "for");
    if (rc == KV_OK && which == 1) {
        rc = expect_end(P, "else");
        if (rc == KV_OK)
            rc = parse_until(P, end_only, &els, &which, open_line, "for");
    }
    if (rc == KV_OK)
        rc = expect_end(P, "endfor");
    set_body(n, &body, 0);
    set_body(n, &els, 1);
    *out = n;
    return rc;
}

/* | f(args) | g ... applied to a block's output (operand NULL). */
static int parse_filter_chain(parser *P, jnode **out)
{
    jnode *node = NULL;
    int rc = parse_filter(P, NULL, &node);
    while (rc == KV_OK && is_op(P, "|")) {
        next(P);
        rc = parse_filter(P, node, &node);
    }
    *out = node;
    return rc;
}

static int parse_set(parser *P, jnode **out, int open_line)
{
    static const char *const ends[] = {"endset", NULL};
    jnode *n = mk(P, JS_SET);
    if (!n)
        return oom(P);
    *out = n;
    int rc, which;
    if (cur(P)->t == JT_NAME && tok_is(peek(P, 1), JT_OP, ".")) {
        if (!(n->names = jv_alloc(P->a, sizeof *n->names)) || !(n->names[0] = tok_str(P, cur(P))))
            return oom(P);
        n->n_names = 1;
        n->op = 1;
        next(P);
        next(P);
        if (cur(P)->t != JT_NAME)
            return fail(P, "expected an attribute name in 'set'");
        n->name = tok_str(P, cur(P));
        next(P);
    } else if ((rc = parse_targets(P, n, "set"))) {
        return rc;
    }
    if (is_op(P, "=")) {
        next(P);
        if ((rc = parse_tuple(P, 1, &n->a)))
            return rc;
        return expect_end(P, "set");
    }
    if (n->op || n->n_names != 1)
        return fail(P, "expected '=' in 'set'");
    n->kind = JS_SETBLOCK;
    if (is_op(P, "|")) {
        next(P);
        if ((rc = parse_filter_chain(P, &n->b)))
            return rc;
    }
    nvec body = {0};
    rc = expect_end(P, "set");
    if (rc == KV_OK)
        rc = parse_until(P, ends, &body, &which, open_line, "set");
    if (rc == KV_OK)
        rc = expect_end(P, "endset");
    set_body(n, &body, 0);
    return rc;
}

static int parse_macro(parser *P, jnode **out, int open_line)
{
    static const char *const ends[] = {"endmacro", NULL};
    jnode *n = mk(P, JS_MACRO);
    if (!n)
        return oom(P);
    if (cur(P)->t != JT_NAME)
        return fail(P, "expected a macro name");
    n->name = tok_str(P, cur(P));
    next(P);
    int rc = expect_op(P, "("), which;
    const char *params[64];
    nvec defs = {0};
    size_t k = 0;
    while (rc == KV_OK && !is_op(P, ")")) {
        if (cur(P)->t != JT_NAME || k == 64)
            return fail(P, "expected a macro parameter name");
        params[k++] = tok_str(P, cur(P));
        next(P);
        jnode *d = NULL;
        if (is_op(P, "=")) {
            next(P);
            rc = parse_expr(P, &d);
        }
        if (rc == KV_OK)
            rc = vpush(P, &defs, d);
        if (rc == KV_OK && !is_op(P, ")"))
            rc = expect_op(P, ",");
    }
    if (rc)
        return rc;
    next(P);
    if (k && !(n->names = jv_alloc(P->a, k * sizeof *params)))
        return oom(P);
    if (k)
        memcpy(n->names, params, k * sizeof *params);
    n->n_names = k;
    set_body(n, &defs, 1);
    nvec body = {0};
    rc = expect_end(P, "macro");
    if (rc == KV_OK)
        rc = parse_until(P, ends, &body, &which, open_line, "macro");
    if (rc == KV_OK) {
        if (cur(P)->t == JT_NAME)
            next(P); /* {% endmacro name %} */
        rc = expect_end(P, "endmacro");
    }
    set_body(n, &body, 0);
    *out = n;
    return rc;
}

/* filter / generation: a body with (or without) a filter chain. */
static int parse_wrapped(parser *P, jnode **out, int open_line, int is_filter)
{
    static const char *const fends[] = {"endfilter", NULL};
    static const char *const gends[] = {"endgeneration", NULL};
    jnode *n = mk(P, is_filter ? JS_FILTERBLOCK : JS_BODY);
    if (!n)
        return oom(P);
    int rc = is_filter ? parse_filter_chain(P, &n->b) : KV_OK, which;
    nvec body = {0};
    if (rc == KV_OK)
        rc = expect_end(P, is_filter ? "filter" : "generation");
    if (rc == KV_OK)
        rc = parse_until(P, is_filter ? fends : gends, &body, &which, open_line, is_filter ? "filter" : "generation");
    if (rc == KV_OK)
        rc = expect_end(P, is_filter ? "endfilter" : "endgeneration");
    set_body(n, &body, 0);
    *out = n;
    return rc;
}

static int parse_stmt(parser *P, jnode **out)
{
    int line = cur(P)->line;
    next(P); /* {% */
    const jtok *t = cur(P);
    if (t->t != JT_NAME)
        return fail(P, "expected a tag name");
    char name[32];
    snprintf(name, sizeof name, "%.*s", (int)(t->n < 31 ? t->n : 31), t->s);
    next(P);
    if (!strcmp(name, "if"))
        return parse_if(P, out, line);
    if (!strcmp(name, "for"))
        return parse_for(P, out, line);
    if (!strcmp(name, "set"))
        return parse_set(P, out, line);
    if (!strcmp(name, "macro"))
        return parse_macro(P, out, line);
    if (!strcmp(name, "filter") || !strcmp(name, "generation"))
        return parse_wrapped(P, out, line, name[0] == 'f');
    if (!strcmp(name, "break") || !strcmp(name, "continue")) {
        if (!(*out = mk(P, name[0] == 'b' ? JS_BREAK : JS_CONTINUE)))
            return oom(P);
        return expect_end(P, name);
    }
    static const char *const known[] = {"call", "include", "import", "from", "extends", "block", "with",
                                        "autoescape", "raw", "do", NULL};
    for (int i = 0; known[i]; i++)
        if (!strcmp(name, known[i]))
            return kvant_err_set(P->err, KV_EUNSUP, "chat template: unsupported tag '%s' at line %d", name, line);
    return kvant_err_set(P->err, KV_EINVAL, "chat template: unknown or misplaced tag '%s' at line %d", name, line);
}

static int parse_body(parser *P, const char *const *ends, nvec *body)
{
    if (++P->depth > JPARSE_MAX_DEPTH)
        return kvant_err_set(P->err, KV_ERANGE, "chat template: blocks nested deeper than %d at line %d",
                             JPARSE_MAX_DEPTH, cur(P)->line);
    int rc = KV_OK;
    while (rc == KV_OK && cur(P)->t != JT_EOF) {
        const jtok *t = cur(P);
        jnode *n = NULL;
        if (t->t == JT_BLOCK_BEGIN && ends) {
            int stop = 0;
            for (int i = 0; ends[i] && !stop; i++)
                stop = tag_is(P, ends[i]);
            if (stop)
                break;
        }
        if (t->t == JT_TEXT) {
            if (!(n = mk(P, JS_TEXT)))
                return oom(P);
            n->val = jv_strn(P->a, t->s, t->n);
            next(P);
        } else if (t->t == JT_VAR_BEGIN) {
            if (!(n = mk(P, JS_OUTPUT)))
                return oom(P);
            next(P);
            rc = parse_tuple(P, 1, &n->a);
            if (rc == KV_OK && cur(P)->t != JT_VAR_END)
                rc = fail(P, "expected '}}'");
            next(P);
        } else if (t->t == JT_BLOCK_BEGIN) {
            rc = parse_stmt(P, &n);
        } else {
            rc = fail(P, "unexpected token");
        }
        if (rc == KV_OK)
            rc = vpush(P, body, n);
    }
    P->depth--;
    return rc;
}

int jparse_run(jv_arena *a, const jtok *toks, size_t n_toks, jnode **root, kvant_err *err)
{
    if (!toks || !n_toks)
        return kvant_err_set(err, KV_EINVAL, "chat template: no tokens");
    parser P = {.a = a, .t = toks, .n = n_toks, .err = err};
    jnode *r = mk(&P, JS_BODY);
    if (!r)
        return oom(&P);
    nvec body = {0};
    int rc = parse_body(&P, NULL, &body);
    if (rc)
        return rc;
    set_body(r, &body, 0);
    *root = r;
    return KV_OK;
}
