/* tp_types.h - the tensor/pipeline-parallel context's handle and
 * counters, shared by the public header (tp.h) and par/'s internal one
 * (tp_internal.h), so the files tp.c calls need not include tp.h.
 * Header only. */
#ifndef KVANT_TP_TYPES_H
#define KVANT_TP_TYPES_H

#include <stdint.h>

#include "par/par.h"

typedef struct tp_ctx tp_ctx;

typedef struct tp_stats {
    par_stats comm;          /* this rank's collectives and transfers */
    uint64_t steps;
    uint64_t tokens;         /* batch tokens of those steps */
    uint64_t reductions;
    double step_seconds;     /* wall time of forward passes on this rank */
} tp_stats;

#endif
