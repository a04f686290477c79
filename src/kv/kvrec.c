/* kvrec.c - the KV tier record format: header, token ids, payload CRC
 * (the layout is kv/kvtier.h's; see kvrec.h). */
#include "kv/kvrec.h"

#include <string.h>

#define KVREC_MAGIC 0x4254564Bu /* "KVTB" little-endian */
#define KVREC_FLAG_CRC 1u

void kvrec_geom_init(kvrec_geom *g, const uint8_t fingerprint[KVREC_KEY_BYTES],
                     int32_t block_size, uint32_t kv_dtype, uint64_t payload_bytes)
{
    memset(g, 0, sizeof *g);
    kvhash_crc_init(&g->crc);
    memcpy(g->fingerprint, fingerprint, KVREC_KEY_BYTES);
    g->block_size = block_size;
    g->kv_dtype = kv_dtype;
    g->payload_bytes = payload_bytes;
    g->payload_off = KVREC_PAYLOAD_OFF(block_size);
}

static void put32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)v, p[1] = (uint8_t)(v >> 8), p[2] = (uint8_t)(v >> 16), p[3] = (uint8_t)(v >> 24);
}

static uint32_t get32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint64_t get64(const uint8_t *p) { return get32(p) | (uint64_t)get32(p + 4) << 32; }

static uint32_t header_crc(const kvrec_geom *g, const uint8_t *rec)
{
    uint32_t c = kvhash_crc32c(&g->crc, 0, rec, 124);
    return kvhash_crc32c(&g->crc, c, rec + KVREC_HEADER_BYTES, 4u * (uint32_t)g->block_size);
}

/* Writes the header and token ids of a record (payload CRC not valid). */
void kvrec_write_header(const kvrec_geom *g, uint8_t *rec, const uint8_t *key,
                        const int32_t *tokens)
{
    memset(rec, 0, KVREC_HEADER_BYTES);
    put32(rec, KVREC_MAGIC);
    rec[4] = KVREC_VERSION;
    rec[6] = KVREC_HEADER_BYTES;
    memcpy(rec + 8, g->fingerprint, KVREC_KEY_BYTES);
    memcpy(rec + 40, key, KVREC_KEY_BYTES);
    put32(rec + 72, (uint32_t)g->block_size);
    put32(rec + 76, g->kv_dtype);
    put32(rec + 80, (uint32_t)g->payload_bytes);
    put32(rec + 84, (uint32_t)(g->payload_bytes >> 32));
    for (int32_t i = 0; i < g->block_size; i++)
        put32(rec + KVREC_HEADER_BYTES + 4 * i, (uint32_t)tokens[i]);
    put32(rec + 124, header_crc(g, rec));
}

/* Sets the payload CRC (and flag) and re-seals the header. */
void kvrec_seal_payload(const kvrec_geom *g, uint8_t *rec)
{
    if (get32(rec + 92) & KVREC_FLAG_CRC)
        return;
    put32(rec + 88, kvhash_crc32c(&g->crc, 0, rec + g->payload_off, g->payload_bytes));
    put32(rec + 92, KVREC_FLAG_CRC);
    put32(rec + 124, header_crc(g, rec));
}

/* Classifies a record header (and its token ids): KVREC_FOREIGN for a valid
 * record of another model or geometry, KVREC_CORRUPT for anything broken. */
int kvrec_check_header(const kvrec_geom *g, const uint8_t *rec)
{
    if (get32(rec) != KVREC_MAGIC || rec[4] != KVREC_VERSION || rec[6] != KVREC_HEADER_BYTES)
        return KVREC_CORRUPT;
    if (get32(rec + 124) != header_crc(g, rec))
        return KVREC_CORRUPT;
    if (memcmp(rec + 8, g->fingerprint, KVREC_KEY_BYTES) ||
        get32(rec + 72) != (uint32_t)g->block_size || get32(rec + 76) != g->kv_dtype ||
        get64(rec + 80) != g->payload_bytes)
        return KVREC_FOREIGN;
    return KVREC_OK;
}

/* Key and token ids of the record equal the request's. */
int kvrec_matches(const kvrec_geom *g, const uint8_t *rec, const uint8_t *key,
                  const int32_t *tokens)
{
    if (memcmp(rec + 40, key, KVREC_KEY_BYTES))
        return 0;
    for (int32_t i = 0; i < g->block_size; i++)
        if (get32(rec + KVREC_HEADER_BYTES + 4 * i) != (uint32_t)tokens[i])
            return 0;
    return 1;
}

int kvrec_payload_ok(const kvrec_geom *g, const uint8_t *rec)
{
    return (get32(rec + 92) & KVREC_FLAG_CRC) &&
           get32(rec + 88) == kvhash_crc32c(&g->crc, 0, rec + g->payload_off, g->payload_bytes);
}
