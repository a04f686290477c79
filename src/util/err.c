/* err.c - error records and the programmer-error assert. */
#include "err.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

int kvant_err_set(kvant_err *err, int code, const char *fmt, ...)
{
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        err->code = (kvant_status)code;
        vsnprintf(err->msg, sizeof err->msg, fmt, ap);
        va_end(ap);
    }
    return code;
}

void kvant_err_clear(kvant_err *err)
{
    if (err) {
        err->code = KV_OK;
        err->msg[0] = '\0';
    }
}

const char *kvant_status_str(int code)
{
    switch (code) {
    case KV_OK: return "ok";
    case KV_EINVAL: return "invalid argument";
    case KV_ENOMEM: return "out of memory";
    case KV_EIO: return "i/o error";
    case KV_EFORMAT: return "bad file format";
    case KV_EUNSUP: return "unsupported";
    case KV_ERANGE: return "out of range";
    case KV_EBUSY: return "busy";
    case KV_ECANCEL: return "cancelled";
    default: return "unknown error";
    }
}

void kvant_assert_fail(const char *expr, const char *file, int line)
{
    fprintf(stderr, "kvant: internal error: assertion `%s' failed at %s:%d\n", expr, file, line);
    abort();
}
