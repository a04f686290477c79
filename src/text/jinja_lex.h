/* jinja_lex.h - the Jinja lexer: template source -> tokens.
 *
 * Reproduces jinja2's lexer with transformers' settings: newlines
 * normalised to "\n" (as str.splitlines() splits), one trailing newline
 * dropped (keep_trailing_newline=False), trim_blocks (the first newline
 * after a block or comment tag is removed), lstrip_blocks (spaces and tabs
 * from the start of a line up to a block or comment tag are removed), and
 * the "-" / "+" whitespace controls.  String literals are unescaped as
 * Python's unicode-escape does.  Tokens live in the caller's arena.
 */
#ifndef KVANT_JINJA_LEX_H
#define KVANT_JINJA_LEX_H

#include <stddef.h>
#include <stdint.h>

#include "text/jinja_value.h"
#include "util/err.h"

typedef enum jtok_type {
    JT_EOF = 0,
    JT_TEXT,        /* raw template data (s, n) */
    JT_VAR_BEGIN,   /* {{ */
    JT_VAR_END,     /* }} */
    JT_BLOCK_BEGIN, /* {% */
    JT_BLOCK_END,   /* %} */
    JT_NAME,        /* identifier (s, n) */
    JT_STRING,      /* string literal, unescaped (s, n) */
    JT_INT,         /* i */
    JT_FLOAT,       /* f */
    JT_OP,          /* operator (s, n): + - * / // % ** ~ == != < <= > >= = . : | , ( ) [ ] { } */
} jtok_type;

typedef struct jtok {
    jtok_type t;
    int line; /* 1-based line of the template source */
    const char *s;
    size_t n;
    int64_t i;
    double f;
} jtok;

/* Tokenises src; *toks (ending with JT_EOF) and the strings it points to
 * are allocated in a.  Errors (unterminated tag or string, bad character,
 * too many tokens) return KV_EINVAL naming the line. */
int jlex_run(jv_arena *a, const char *src, size_t len, jtok **toks, size_t *n_toks, kvant_err *err);

#endif
