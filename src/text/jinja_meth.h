/* jinja_meth.h - the methods of Python's str, dict and list that
 * templates call (s.strip(), m.get('k'), d.items(), ...).
 *
 * ImmutableSandboxedEnvironment semantics: the mutating methods of list
 * and dict (append, pop, update, ...) are refused ("access to attribute
 * 'append' of 'list' object is unsafe.").  Case mapping covers ASCII and
 * Latin-1; other characters are left as they are (Python maps all of
 * Unicode).  Errors return -1 with a message in emsg.
 */
#ifndef KVANT_JINJA_METH_H
#define KVANT_JINJA_METH_H

#include <stddef.h>

#include "text/jinja_value.h"

/* 1: self has that method; 0: no such attribute; -1: the sandbox refuses it. */
int jmeth_kind(jv self, const char *name);
int jmeth_call(jv_arena *a, jv self, const char *name, const jv_args *args, jv *out, char *emsg, size_t cap);

/* Helpers the filters share.  chars NULL: Python whitespace. */
jv jmeth_strip(jv_arena *a, jv s, const jv_str *chars, int left, int right);
typedef enum jmeth_case_mode { JCASE_LOWER, JCASE_UPPER, JCASE_CAPITALIZE, JCASE_PYTITLE } jmeth_case_mode;
jv jmeth_case(jv_arena *a, jv s, jmeth_case_mode mode);
/* s.replace(old, new, count) (count < 0: all). */
jv jmeth_replace(jv_arena *a, jv s, const jv_str *old, const jv_str *rep, int64_t count);
/* The first field of a str.format string that jmeth_call cannot format
 * (a format spec {:>5}, an attribute {0.x} or an item {0[1]}), its length
 * in *len; NULL when every field is plain. */
const char *jmeth_format_unsupported(const char *fmt, size_t *len);
/* Positional or keyword argument i / name, or NULL. */
const jv *jmeth_arg(const jv_args *args, size_t i, const char *name);

#endif
