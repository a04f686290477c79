/* jinja_expr.h - evaluation of Jinja expressions (jinja_ast.h JN_* nodes).
 *
 * Python semantics throughout: arithmetic (int / int is a float, // and %
 * floor, ints overflow-checked instead of growing), comparisons, `in`,
 * and / or returning an operand, jinja2's getattr/getitem (a.b tries the
 * attribute, then the item; a['b'] the item, then the attribute) and its
 * default Undefined (renders "", is falsy and iterates empty; an
 * attribute, item, call or arithmetic on it is an error).  Statements are
 * jinja_eval's; it hands macro calls back through call_macro, so this
 * module never depends on it.
 */
#ifndef KVANT_JINJA_EXPR_H
#define KVANT_JINJA_EXPR_H

#include <stdint.h>

#include "text/jinja_ast.h"
#include "text/jinja_value.h"
#include "util/err.h"

/* A variable frame: a loop iteration, a macro call, the template. */
typedef struct jscope {
    struct jscope *parent;
    jv vars; /* dict */
} jscope;

/* jv_func kinds. */
enum { JF_MACRO = 1, JF_METHOD, JF_NAMESPACE, JF_RANGE, JF_RAISE, JF_STRFTIME, JF_DICT, JF_CYCLE };

typedef struct jexpr_ctx jexpr_ctx;
typedef int (*jexpr_macro_fn)(jexpr_ctx *E, const jv_func *fn, const jv_args *args, int line, jv *out);

struct jexpr_ctx {
    jv_arena *a;
    kvant_err *err;
    jscope *root;             /* top-level frame; macros run in a child of it */
    int64_t now;              /* strftime_now's time (Unix seconds, local time zone) */
    int depth, max_depth;     /* macro call nesting */
    int nest;                 /* expressions + statements being evaluated (C stack depth) */
    size_t iters, max_iters;  /* loop iterations, all loops together */
    size_t max_output;        /* bytes one render may produce */
    jv filter_input;          /* the body of a filter block / block set */
    jexpr_macro_fn call_macro;
};

/* Most expressions and statements evaluated inside each other, all macro
 * calls together: bounds the C stack an untrusted template can use. */
#define JEXPR_MAX_NEST 1500

int jexpr_eval(jexpr_ctx *E, const jnode *n, jscope *s, jv *out);
/* Fills E->err with "chat template: MSG (line N)" and returns KV_EINVAL. */
int jexpr_fail(jexpr_ctx *E, int line, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
jv jexpr_lookup(jexpr_ctx *E, jscope *s, const char *name);
/* Items a for loop walks: list, tuple, dict keys, string characters,
 * nothing for Undefined; others are an error. */
int jexpr_iterable(jexpr_ctx *E, jv v, int line, jv *out);
/* Applies a filter node chain (operand NULL = E->filter_input). */
int jexpr_filter_chain(jexpr_ctx *E, const jnode *chain, jscope *s, jv input, jv *out);

#endif
