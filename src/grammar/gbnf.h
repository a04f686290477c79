/* gbnf.h - llama.cpp's grammar syntax (GBNF) compiled to a gram.
 *
 * Rules `name ::= alternatives`, alternatives with `|`, groups `( )`,
 * repetition `*` `+` `?` `{m}` `{m,}` `{m,n}`, string literals and
 * character classes `[a-z]`, `[^...]` with the escapes \t \r \n \\ \"
 * \[ \] \- \xHH \uHHHH \UHHHHHHHH, `.` (any code point), comments `#`;
 * a newline ends a rule except inside a group or after `|`; the start
 * rule is `root`.  Characters are Unicode code points matched as UTF-8,
 * as in llama.cpp.  Refused with an error naming the construct and the
 * line: token references `<...>` / `!<...>` (they name vocabulary tokens,
 * not bytes), undefined or twice-defined rules, repetition bounds above
 * gram_limits.max_repeat (llama.cpp silently makes those unbounded).
 *
 * Pure: no shared state, callable from any thread.
 */
#ifndef KVANT_GBNF_H
#define KVANT_GBNF_H

#include <stddef.h>

#include "grammar/gram.h"
#include "util/err.h"

/* Returns a finished grammar (caller destroys) or NULL with err set. */
gram *gbnf_compile(const char *src, size_t n, gram_limits lim, kvant_err *err);

#endif
