/* jinja_filt.h - jinja2's builtin filters and tests, on jv values.
 *
 * Each behaves as jinja2 3.1's (and transformers' tojson =
 * json.dumps(ensure_ascii=False)).  Errors (wrong argument, a value of the
 * wrong type) return -1 with a message in emsg; the caller adds the line.
 * Thread: none of its own; values belong to the caller's arena.
 */
#ifndef KVANT_JINJA_FILT_H
#define KVANT_JINJA_FILT_H

#include <stddef.h>

#include "text/jinja_value.h"

/* 1: kvant implements it; 0: a jinja2 builtin kvant does not implement
 * (a template using it is refused); -1: not a jinja2 builtin (jinja2
 * fails when it is used; so does kvant, at run time). */
int jfilt_filter_status(const char *name);
int jfilt_test_status(const char *name);

int jfilt_filter(jv_arena *a, const char *name, jv in, const jv_args *args, jv *out, char *emsg, size_t cap);
int jfilt_test(jv_arena *a, const char *name, jv in, const jv_args *args, int *out, char *emsg, size_t cap);

#endif
