/* tok_types.h - the tokenizer's types, shared by its public header
 * (tokenizer.h) and its internal one (tok_internal.h), so the encoders
 * below tokenizer.c need not include the header of the module that calls
 * them. */
#ifndef KVANT_TOK_TYPES_H
#define KVANT_TOK_TYPES_H

typedef struct tokenizer tokenizer;

/* Token attributes (from tokenizer.ggml.token_type). */
enum tok_attr {
    TOK_NORMAL = 1,
    TOK_UNKNOWN = 2,
    TOK_CONTROL = 3,
    TOK_USER_DEFINED = 4,
    TOK_UNUSED = 5,
    TOK_BYTE = 6,
};

#endif
