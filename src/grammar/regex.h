/* regex.h - a practical regular-expression subset compiled into gram
 * rules (the `regex` front end, and JSON Schema's `pattern`).
 *
 * Supported: literals (UTF-8), `.` (any code point but \n), classes
 * `[...]` / `[^...]` with ranges and \d \w \s inside, the escapes \d \D \w
 * \W \s \S (ASCII meanings), \t \n \r \f \v \xHH \uHHHH \u{H..} and escaped
 * punctuation, groups `( )` and `(?: )`, alternation, the quantifiers
 * `* + ? {m} {m,} {m,n}` (a lazy `?` suffix is accepted: it does not change
 * the language).  The whole input must match: `^` at the start and `$` at
 * the end are accepted and mean nothing more.  Refused with an error naming
 * the construct: backreferences, lookaround, word boundaries, inline flags,
 * possessive quantifiers, `^`/`$` elsewhere.
 *
 * json_string: the language is of JSON string contents - a `"`, `\`,
 * control character or DEL the regex matches must appear escaped, as JSON
 * requires (\" \\ \n \t \r \b \f, else \u00XX; DEL as llguidance does).
 *
 * Pure: no shared state, callable from any thread.
 */
#ifndef KVANT_REGEX_H
#define KVANT_REGEX_H

#include <stddef.h>

#include "grammar/gram.h"
#include "util/err.h"

/* Adds the rules for re to g and returns its element, or GRAM_BAD with err
 * set (err names `what`, e.g. "regex" or a JSON pointer, and the offset). */
int32_t rx_build(gram *g, const char *re, size_t n, int json_string, const char *what,
                 kvant_err *err);
/* A finished grammar for re (caller destroys), or NULL with err set. */
gram *rx_compile(const char *re, size_t n, gram_limits lim, kvant_err *err);

#endif
