/* gnames.c - open-addressing name map (gnames.h). */
#include "grammar/gnames.h"

#include <stdlib.h>
#include <string.h>

typedef struct gname {
    char *s;
    size_t n;
    int32_t id;
} gname;

struct gnames {
    gname *v;          /* [count] in insertion order */
    int32_t count, cap;
    int32_t *slot;     /* [hcap] index into v, -1 empty */
    uint32_t hcap;
};

static uint32_t name_hash(const char *s, size_t n)
{
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < n; i++)
        h = (h ^ (uint8_t)s[i]) * 16777619u;
    return h;
}

gnames *gnames_create(void)
{
    gnames *m = calloc(1, sizeof *m);
    if (!m)
        return NULL;
    m->hcap = 64;
    m->slot = malloc(m->hcap * sizeof *m->slot);
    if (!m->slot) {
        free(m);
        return NULL;
    }
    memset(m->slot, 0xff, m->hcap * sizeof *m->slot);
    return m;
}

void gnames_destroy(gnames *m)
{
    if (!m)
        return;
    for (int32_t i = 0; i < m->count; i++)
        free(m->v[i].s);
    free(m->v);
    free(m->slot);
    free(m);
}

static int32_t find(const gnames *m, const char *s, size_t n, uint32_t *at)
{
    uint32_t k = name_hash(s, n) & (m->hcap - 1);
    for (; m->slot[k] >= 0; k = (k + 1) & (m->hcap - 1)) {
        const gname *g = &m->v[m->slot[k]];
        if (g->n == n && !memcmp(g->s, s, n))
            break;
    }
    *at = k;
    return m->slot[k];
}

int32_t gnames_get(const gnames *m, const char *name, size_t n)
{
    uint32_t at;
    int32_t i = find(m, name, n, &at);
    return i < 0 ? -1 : m->v[i].id;
}

static int rehash(gnames *m)
{
    uint32_t cap = m->hcap * 2;
    int32_t *s = malloc(cap * sizeof *s);
    if (!s)
        return -1;
    memset(s, 0xff, cap * sizeof *s);
    free(m->slot);
    m->slot = s;
    m->hcap = cap;
    for (int32_t i = 0; i < m->count; i++) {
        uint32_t k = name_hash(m->v[i].s, m->v[i].n) & (cap - 1);
        while (s[k] >= 0)
            k = (k + 1) & (cap - 1);
        s[k] = i;
    }
    return 0;
}

int gnames_put(gnames *m, const char *name, size_t n, int32_t id)
{
    uint32_t at;
    int32_t i = find(m, name, n, &at);
    if (i >= 0) {
        m->v[i].id = id;
        return 0;
    }
    if ((uint32_t)(m->count + 1) * 2 > m->hcap) {
        if (rehash(m))
            return -1;
        find(m, name, n, &at);
    }
    if (m->count == m->cap) {
        int32_t nc = m->cap ? m->cap * 2 : 16;
        gname *nv = realloc(m->v, (size_t)nc * sizeof *nv);
        if (!nv)
            return -1;
        m->v = nv;
        m->cap = nc;
    }
    char *s = malloc(n + 1);
    if (!s)
        return -1;
    memcpy(s, name, n);
    s[n] = 0;
    m->v[m->count] = (gname){s, n, id};
    m->slot[at] = m->count++;
    return 0;
}

int32_t gnames_count(const gnames *m)
{
    return m->count;
}

const char *gnames_name(const gnames *m, int32_t i, int32_t *id)
{
    if (i < 0 || i >= m->count)
        return NULL;
    if (id)
        *id = m->v[i].id;
    return m->v[i].s;
}
