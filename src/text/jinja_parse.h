/* jinja_parse.h - the Jinja parser: tokens -> syntax tree (jinja_ast.h).
 *
 * The grammar and precedences are jinja2's (conditional expressions,
 * or/and/not, comparisons, + -, ~, * / // %, **, unary - +, postfix
 * . [] (), filters and tests binding to the unary operand).  Supported
 * tags: if/elif/else, for (with a loop filter and else), set (plain,
 * namespace attribute, tuple targets, block set with filters), macro,
 * filter, generation, break, continue.  Anything else is refused with a
 * message naming the construct and its line, so a template either
 * compiles to something kvant renders as jinja2 does or is refused.
 */
#ifndef KVANT_JINJA_PARSE_H
#define KVANT_JINJA_PARSE_H

#include "text/jinja_ast.h"
#include "text/jinja_lex.h"
#include "util/err.h"

/* Nesting bound for expressions and blocks (a parse is recursive). */
#define JPARSE_MAX_DEPTH 200

/* Parses toks (from jlex_run) into a JS_BODY node allocated in a. */
int jparse_run(jv_arena *a, const jtok *toks, size_t n_toks, jnode **root, kvant_err *err);

#endif
