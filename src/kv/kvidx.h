/* kvidx.h - the index of a KV tier's records: a fixed array of entries
 * (key + LRU links), a free list, and an open-addressing map from key to
 * entry (linear probing, backward-shift deletion, at least twice as many
 * slots as entries).  Entry ids are stable while an entry lives, so a
 * tier can own slot i of a slab for entry i.
 *
 * Ownership: kvidx_init allocates the arrays, kvidx_free frees them.
 * Threading: none; the tier that owns an index serialises its calls.
 */
#ifndef KVANT_KVIDX_H
#define KVANT_KVIDX_H

#include <stdint.h>

#define KVIDX_KEY_BYTES 32

typedef struct kvidx_entry {
    uint8_t key[KVIDX_KEY_BYTES];
    int32_t prev, next; /* LRU: head = least recent */
} kvidx_entry;

typedef struct kvidx {
    int32_t cap, count;
    kvidx_entry *e;     /* [cap] */
    int32_t *free_stack, n_free;
    int32_t *map;       /* [map_mask + 1] entry id, -1 empty */
    uint32_t map_mask;
    int32_t head, tail;
} kvidx;

/* An empty index of cap entries: KV_OK or KV_ENOMEM. */
int kvidx_init(kvidx *x, int32_t cap);
void kvidx_free(kvidx *x);
/* The entry holding key, or -1. */
int32_t kvidx_find(const kvidx *x, const uint8_t *key);
/* LRU order: unlink, push as most recent, or both (touch). */
void kvidx_lru_unlink(kvidx *x, int32_t id);
void kvidx_lru_push(kvidx *x, int32_t id);
void kvidx_touch(kvidx *x, int32_t id);
/* A new entry for key (not present), most recent; -1 when full. */
int32_t kvidx_add(kvidx *x, const uint8_t *key);
/* Removes entry id from the map and the LRU list; its id is free again. */
void kvidx_remove(kvidx *x, int32_t id);

#endif
