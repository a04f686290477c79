/* kvidx.c - the index of a KV tier's records (see kvidx.h). */
#include "kv/kvidx.h"

#include <stdlib.h>
#include <string.h>

#include "util/err.h"

static uint32_t kvidx_home(const kvidx *x, const uint8_t *key)
{
    uint32_t h;
    memcpy(&h, key, 4); /* keys are SHA-256 output: any 4 bytes are uniform */
    return h & x->map_mask;
}

int kvidx_init(kvidx *x, int32_t cap)
{
    memset(x, 0, sizeof *x);
    uint32_t mc = 16;
    while (mc < 2u * (uint32_t)cap)
        mc *= 2;
    x->cap = cap;
    x->e = calloc((size_t)cap, sizeof *x->e);
    x->free_stack = malloc((size_t)cap * sizeof *x->free_stack);
    x->map = malloc((size_t)mc * sizeof *x->map);
    if (!x->e || !x->free_stack || !x->map)
        return KV_ENOMEM;
    x->map_mask = mc - 1;
    for (uint32_t i = 0; i < mc; i++)
        x->map[i] = -1;
    for (int32_t i = cap - 1; i >= 0; i--)
        x->free_stack[x->n_free++] = i;
    x->head = x->tail = -1;
    return KV_OK;
}

void kvidx_free(kvidx *x)
{
    free(x->e);
    free(x->free_stack);
    free(x->map);
    memset(x, 0, sizeof *x);
}

int32_t kvidx_find(const kvidx *x, const uint8_t *key)
{
    if (!x->cap)
        return -1;
    for (uint32_t i = kvidx_home(x, key);; i = (i + 1) & x->map_mask) {
        int32_t id = x->map[i];
        if (id < 0)
            return -1;
        if (!memcmp(x->e[id].key, key, KVIDX_KEY_BYTES))
            return id;
    }
}

void kvidx_lru_unlink(kvidx *x, int32_t id)
{
    kvidx_entry *en = &x->e[id];
    if (en->prev >= 0) x->e[en->prev].next = en->next; else x->head = en->next;
    if (en->next >= 0) x->e[en->next].prev = en->prev; else x->tail = en->prev;
    en->prev = en->next = -1;
}

void kvidx_lru_push(kvidx *x, int32_t id)
{
    kvidx_entry *en = &x->e[id];
    en->prev = x->tail;
    en->next = -1;
    if (x->tail >= 0) x->e[x->tail].next = id; else x->head = id;
    x->tail = id;
}

void kvidx_touch(kvidx *x, int32_t id)
{
    kvidx_lru_unlink(x, id);
    kvidx_lru_push(x, id);
}

/* Adds key (absent) as the most recent entry; -1 when full. */
int32_t kvidx_add(kvidx *x, const uint8_t *key)
{
    if (x->n_free == 0)
        return -1;
    int32_t id = x->free_stack[--x->n_free];
    memcpy(x->e[id].key, key, KVIDX_KEY_BYTES);
    uint32_t i = kvidx_home(x, key);
    while (x->map[i] >= 0)
        i = (i + 1) & x->map_mask;
    x->map[i] = id;
    x->count++;
    kvidx_lru_push(x, id);
    return id;
}

void kvidx_remove(kvidx *x, int32_t id)
{
    uint32_t i = kvidx_home(x, x->e[id].key);
    while (x->map[i] != id)
        i = (i + 1) & x->map_mask;
    for (;;) {
        x->map[i] = -1;
        uint32_t j = i;
        for (;;) {
            j = (j + 1) & x->map_mask;
            if (x->map[j] < 0)
                goto done;
            uint32_t k = kvidx_home(x, x->e[x->map[j]].key);
            int stays = i <= j ? (i < k && k <= j) : (i < k || k <= j);
            if (!stays)
                break;
        }
        x->map[i] = x->map[j];
        i = j;
    }
done:
    kvidx_lru_unlink(x, id);
    x->free_stack[x->n_free++] = id;
    x->count--;
}
