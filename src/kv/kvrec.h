/* kvrec.h - one KV tier record's format (the layout table is in
 * kv/kvtier.h): writing a header and the block's token ids, classifying a
 * header read back, the payload CRC.  Pure functions over a caller's
 * buffer and an immutable geometry; any thread.
 */
#ifndef KVANT_KVREC_H
#define KVANT_KVREC_H

#include <stdint.h>

#include "kv/kvhash.h"

#define KVREC_KEY_BYTES 32
#define KVREC_HEADER_BYTES 128
#define KVREC_VERSION 1
/* The payload's offset in a record of a block of bs tokens (64-aligned). */
#define KVREC_PAYLOAD_OFF(bs) ((((uint64_t)KVREC_HEADER_BYTES + 4u * (uint64_t)(bs)) + 63u) & ~63ull)

/* What every record of one tier shares (kvrec_geom_init). */
typedef struct kvrec_geom {
    kvhash_crc crc;
    uint8_t fingerprint[KVREC_KEY_BYTES];
    int32_t block_size;
    uint32_t kv_dtype;
    uint64_t payload_bytes, payload_off;
} kvrec_geom;

void kvrec_geom_init(kvrec_geom *g, const uint8_t fingerprint[KVREC_KEY_BYTES],
                     int32_t block_size, uint32_t kv_dtype, uint64_t payload_bytes);

/* Writes the header and token ids of a record (payload CRC not valid). */
void kvrec_write_header(const kvrec_geom *g, uint8_t *rec, const uint8_t *key,
                        const int32_t *tokens);
/* Sets the payload CRC (and its flag) and re-seals the header. */
void kvrec_seal_payload(const kvrec_geom *g, uint8_t *rec);

enum { KVREC_OK = 0, KVREC_FOREIGN = 1, KVREC_CORRUPT = 2 };
/* Classifies a header (and its token ids): KVREC_FOREIGN for a valid
 * record of another model or geometry, KVREC_CORRUPT for anything broken. */
int kvrec_check_header(const kvrec_geom *g, const uint8_t *rec);
/* 1 when the record's key and token ids equal the request's. */
int kvrec_matches(const kvrec_geom *g, const uint8_t *rec, const uint8_t *key,
                  const int32_t *tokens);
/* 1 when the payload CRC is set and checks. */
int kvrec_payload_ok(const kvrec_geom *g, const uint8_t *rec);

#endif
