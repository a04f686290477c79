/* jschema.h - JSON Schema (and `{"type": "json_object"}`) compiled to a
 * gram of compact JSON: no whitespace between tokens, "," and ":" as
 * separators, object properties in the schema's order.
 *
 * Supported: type (one or a list), properties, required,
 * additionalProperties (false; or true / a schema when there are no
 * properties: then any keys), enum, const, items, minItems, maxItems,
 * anyOf, oneOf (as anyOf), allOf of one schema, $ref to "#..." pointers
 * ($defs, definitions, recursion), string minLength / maxLength / pattern
 * (matching anywhere unless anchored with ^ / $, as JSON Schema says;
 * the regex subset of regex.h) / format (date, time, date-time, uuid), integer
 * minimum / maximum / exclusiveMinimum / exclusiveMaximum, number
 * minimum 0; true / false schemas; annotations (title, description,
 * default, examples, $schema, $id, $comment, ...) are ignored.
 * Choices made where JSON Schema leaves room, as OpenAI's strict mode and
 * xgrammar do: properties come in the order declared, and an object with
 * properties and no additionalProperties admits no other keys.  Lengths
 * that JSON leaves unbounded are bounded, so that a model cannot spend its
 * tokens on digits: a number's integral part, fraction and exponent have
 * at most 16 digits each (as llama.cpp's json-schema-to-grammar), and the
 * fraction of a second in format time / date-time at most 9.
 * Anything else is refused with an error naming the JSON pointer:
 * "json schema: /properties/x/not: unsupported".
 *
 * Pure: no shared state, callable from any thread.
 */
#ifndef KVANT_JSCHEMA_H
#define KVANT_JSCHEMA_H

#include <stddef.h>

#include "grammar/gram.h"
#include "util/err.h"

/* A finished grammar for the schema text (caller destroys), or NULL with
 * err set. */
gram *jschema_compile(const char *schema, size_t n, gram_limits lim, kvant_err *err);
/* Any JSON object (`response_format: {"type": "json_object"}`). */
gram *jschema_any_object(gram_limits lim, kvant_err *err);

#endif
