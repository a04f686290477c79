/* err.h - error reporting shared by every module.
 *
 * Untrusted input (model files, HTTP bodies, parameters) never asserts or
 * aborts: functions return a negative kvant_status and, when given a non-NULL
 * kvant_err, fill it with a message naming the field (and byte offset where
 * it applies).  Programmer errors use KV_ASSERT, which reports file and line.
 */
#ifndef KVANT_ERR_H
#define KVANT_ERR_H

#include <stddef.h>

typedef enum kvant_status {
    KV_OK = 0,
    KV_EINVAL = -1,   /* bad argument or malformed input */
    KV_ENOMEM = -2,   /* allocation failed or budget exceeded */
    KV_EIO = -3,      /* file or socket error */
    KV_EFORMAT = -4,  /* corrupt or unsupported file */
    KV_EUNSUP = -5,   /* valid but not supported by kvant */
    KV_ERANGE = -6,   /* value out of range */
    KV_EBUSY = -7,    /* queue full / try again later */
    KV_ECANCEL = -8,  /* cancelled */
} kvant_status;

#define KV_ERR_MSG_MAX 512

/* Caller-owned error record; zero-initialise or call kvant_err_clear. */
typedef struct kvant_err {
    kvant_status code;
    char msg[KV_ERR_MSG_MAX];
} kvant_err;

/* Sets err (if non-NULL) and returns code, so callers can write
 * `return kvant_err_set(err, KV_EINVAL, "field %s", name);`. */
int kvant_err_set(kvant_err *err, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
void kvant_err_clear(kvant_err *err);
const char *kvant_status_str(int code);

void kvant_assert_fail(const char *expr, const char *file, int line);
#define KV_ASSERT(x) ((x) ? (void)0 : kvant_assert_fail(#x, __FILE__, __LINE__))

#endif
