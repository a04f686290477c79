/* server_memview.h - JSON for GET /v1/memory and GET /v1/memory/blocks
 * (docs/SERVER.md describes both).
 *
 * Ownership: the snapshot is borrowed; each function returns a malloc'd
 * NUL-terminated string the caller frees, or NULL when out of memory.
 * Threading: any HTTP thread (the snapshot is private to the caller; the
 * memory report is read through the memory manager's lock).
 */
#ifndef KVANT_SERVER_MEMVIEW_H
#define KVANT_SERVER_MEMVIEW_H

#include "engine/engine.h"

char *srv_memview_json(engine *e, const engine_kv_snapshot *sn);
char *srv_blockmap_json(const engine_kv_snapshot *sn);

#endif
