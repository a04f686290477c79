/* fuzz_kvtier.c - libFuzzer target for the KV disk tier's record checks.
 *
 * "Never serve a wrong block": each input writes one valid record through
 * the tier, then damages its file (input byte 0 bit 0 clear: a list of
 * (offset, xor) patches and an optional truncation; set: the file is
 * replaced by the raw input), restarts the tier on the directory (the
 * start-up scan) and fetches the block.  A fetch that returns anything
 * but the original payload aborts; so does any out-of-bounds access
 * (ASan).  The tier must also never fail to start on a bad file.
 */
#include <dirent.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kv/kvhash.h"
#include "kv/kvtier.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define BS 16
#define PAYLOAD 256

static void clear_dir(const char *dir)
{
    DIR *d = opendir(dir);
    struct dirent *de;
    char p[512];
    while (d && (de = readdir(d)))
        if (strcmp(de->d_name, ".") && strcmp(de->d_name, "..")) {
            snprintf(p, sizeof p, "%s/%s", dir, de->d_name);
            unlink(p);
        }
    if (d)
        closedir(d);
}

static int fill(void *ctx, void *dst)
{
    memcpy(dst, ctx, PAYLOAD);
    return 0;
}

static void damage(const char *path, const uint8_t *data, size_t size, uint64_t rec_bytes)
{
    int fd = open(path, O_RDWR);
    if (fd < 0)
        return;
    if (data[0] & 1) { /* replace the whole file */
        if (ftruncate(fd, 0) == 0 && size > 1 && write(fd, data + 1, size - 1) < 0)
            abort();
        close(fd);
        return;
    }
    if ((data[0] & 2) && size > 1 && ftruncate(fd, (off_t)(data[1] * rec_bytes / 256)))
        abort();
    for (size_t i = 2; i + 3 <= size; i += 3) {
        off_t off = (off_t)((data[i] | data[i + 1] << 8) % (rec_bytes + 8));
        uint8_t b;
        if (pread(fd, &b, 1, off) == 1) {
            b ^= data[i + 2];
            if (pwrite(fd, &b, 1, off) != 1)
                abort();
        }
    }
    close(fd);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static char dir[256];
    if (!dir[0]) {
        const char *tmp = getenv("TMPDIR");
        snprintf(dir, sizeof dir, "%s/kvant-fuzz-kvtier.%d", tmp ? tmp : "/tmp", (int)getpid());
    }
    if (size < 1)
        return 0;
    mkdir(dir, 0700);
    clear_dir(dir);
    kvtier_config c = kvtier_config_default();
    memset(c.fingerprint, 0x11, sizeof c.fingerprint);
    c.block_size = BS;
    c.kv_dtype = 1;
    c.payload_bytes = PAYLOAD;
    c.disk_dir = dir;
    c.disk_bytes = 8 * KVTIER_RECORD_BYTES(BS, PAYLOAD);
    c.disk_fsync = 0;
    c.disk_wait = 1;
    c.quiet = 1;
    int32_t tok[BS];
    uint8_t payload[PAYLOAD], key[KVTIER_KEY_BYTES];
    for (int i = 0; i < BS; i++)
        tok[i] = i * 7 + 1;
    for (int i = 0; i < PAYLOAD; i++)
        payload[i] = (uint8_t)(i * 13 + 5);
    kvhash_chain_key(c.fingerprint, 0, tok, BS, key);
    kvtier *t = kvtier_create(&c, NULL);
    if (!t)
        abort();
    if (kvtier_store(t, key, tok, fill, payload) != KVTIER_DISK)
        abort();
    kvtier_destroy(t);
    char path[512];
    int n = snprintf(path, sizeof path, "%s/", dir);
    for (int i = 0; i < KVTIER_KEY_BYTES; i++)
        n += snprintf(path + n, sizeof path - (size_t)n, "%02x", key[i]);
    snprintf(path + n, sizeof path - (size_t)n, ".kvb");
    damage(path, data, size, KVTIER_RECORD_BYTES(BS, PAYLOAD));
    t = kvtier_create(&c, NULL);
    if (!t)
        abort();
    kvtier_where(t, key);
    const uint8_t *got = kvtier_fetch(t, key, tok);
    if (got && memcmp(got, payload, PAYLOAD))
        abort(); /* a wrong block was served */
    kvtier_destroy(t);
    return 0;
}
