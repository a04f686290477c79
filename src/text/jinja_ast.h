/* jinja_ast.h - the syntax tree of a compiled Jinja template (types only).
 *
 * Header-only so that the parser (which builds it) and the evaluator
 * (which walks it) share it without depending on each other.  Every node
 * lives in the template's arena.  Child slots by kind:
 *   JN_CONST    val
 *   JN_NAME     name
 *   JN_ATTR     a = object, name = attribute
 *   JN_ITEM     a = object, b = key
 *   JN_SLICE    a = object, b/c/d = start/stop/step (NULL when absent)
 *   JN_CALL     a = callee, items = positional args, names/items2 = keyword args
 *   JN_FILTER   a = operand (NULL: the body of a filter block), name, args as JN_CALL
 *   JN_TEST     a = operand, name, args as JN_CALL, op = 1 when negated ("is not")
 *   JN_BINOP    op (jn_op), a, b
 *   JN_UNARY    op (JOP_NOT / JOP_NEG / JOP_POS), a
 *   JN_COND     a = condition, b = then, c = else (NULL: undefined)
 *   JN_LIST / JN_TUPLE  items;  JN_DICT  items = keys, items2 = values
 * Statements:
 *   JS_TEXT     val (a string);  JS_OUTPUT  a
 *   JS_IF       a = condition, items = body, items2 = else body
 *   JS_FOR      names = targets, a = iterable, b = filter condition or NULL,
 *               items = body, items2 = else body
 *   JS_SET      names = targets, or names[0] = namespace and name = attribute
 *               (op = 1), a = value
 *   JS_SETBLOCK names[0] = target, b = filter chain or NULL, items = body
 *   JS_MACRO    name, names = parameters, items2 = defaults (NULL entries), items = body
 *   JS_FILTERBLOCK b = filter chain, items = body
 *   JS_BODY     items (generation blocks and the template itself)
 *   JS_BREAK / JS_CONTINUE
 */
#ifndef KVANT_JINJA_AST_H
#define KVANT_JINJA_AST_H

#include <stddef.h>

#include "text/jinja_value.h"

typedef enum jn_kind {
    JN_CONST = 1, JN_NAME, JN_ATTR, JN_ITEM, JN_SLICE, JN_CALL, JN_FILTER, JN_TEST, JN_BINOP, JN_UNARY,
    JN_COND, JN_LIST, JN_TUPLE, JN_DICT,
    JS_TEXT, JS_OUTPUT, JS_IF, JS_FOR, JS_SET, JS_SETBLOCK, JS_MACRO, JS_FILTERBLOCK, JS_BODY, JS_BREAK,
    JS_CONTINUE,
} jn_kind;

typedef enum jn_op {
    JOP_ADD = 1, JOP_SUB, JOP_MUL, JOP_DIV, JOP_FLOORDIV, JOP_MOD, JOP_POW, JOP_CONCAT,
    JOP_EQ, JOP_NE, JOP_LT, JOP_LE, JOP_GT, JOP_GE, JOP_IN, JOP_NOTIN, JOP_AND, JOP_OR,
    JOP_NOT, JOP_NEG, JOP_POS,
} jn_op;

typedef struct jnode {
    jn_kind kind;
    int op;
    int line;
    jv val;
    const char *name;
    struct jnode *a, *b, *c, *d;
    struct jnode **items;
    size_t n_items;
    struct jnode **items2;
    size_t n_items2;
    const char **names;
    size_t n_names;
} jnode;

#endif
