/* test_kvtier.c - the KV offload tiers: hash test vectors, the record
 * format, host and disk tiers (round trips, LRU, demotion, restart), and
 * every fault the disk tier must survive: a torn record, a flipped payload
 * byte, a record of another model, a leftover temporary file, a foreign
 * file, a full disk (RLIMIT_FSIZE in a child process), a directory that
 * cannot be used or disappears, a second process on the same directory.
 * The lazy start-up scan: records indexed a slice per poll while new ones
 * are written, a dead process's temporary file removed, this run's files
 * never taken for corrupt.  Write-through (dedup, a full queue, the
 * shutdown deadline), the name-only index past scan_verify, and the host
 * tier's RAM check.  Also the cost model's decisions on given numbers. */
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "kv/kvhash.h"
#include "kv/kvtier.h"
#include "testutil.h"

#define BS 16
#define PAYLOAD 1003 /* not a multiple of 8: exercises the CRC tail */

static void hex_of(const uint8_t *d, int n, char *out)
{
    for (int i = 0; i < n; i++)
        sprintf(out + 2 * i, "%02x", d[i]);
}

static void test_hashes(void)
{
    uint8_t d[32];
    char hx[65];
    kvhash_sha256("abc", 3, d);
    hex_of(d, 32, hx);
    CHECK(!strcmp(hx, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"));
    kvhash_sha256("", 0, d);
    hex_of(d, 32, hx);
    CHECK(!strcmp(hx, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"));
    const char *m = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
    kvhash_sha256(m, strlen(m), d);
    hex_of(d, 32, hx);
    CHECK(!strcmp(hx, "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"));
    /* one million 'a', fed in uneven pieces */
    kvhash_sha256_ctx s;
    char buf[997];
    memset(buf, 'a', sizeof buf);
    kvhash_sha256_init(&s);
    for (int left = 1000000; left > 0; left -= (int)sizeof buf)
        kvhash_sha256_update(&s, buf, left < (int)sizeof buf ? (size_t)left : sizeof buf);
    kvhash_sha256_final(&s, d);
    hex_of(d, 32, hx);
    CHECK(!strcmp(hx, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0"));
    kvhash_crc c;
    kvhash_crc_init(&c);
    CHECK(kvhash_crc32c(&c, 0, "123456789", 9) == 0xE3069283u);
    uint32_t part = kvhash_crc32c(&c, 0, "1234", 4);
    CHECK(kvhash_crc32c(&c, part, "56789", 5) == 0xE3069283u);
}

/* ---- helpers ---- */

typedef struct fill_ctx {
    int seed;
    int fail;
} fill_ctx;

static int fill(void *ctx, void *dst)
{
    fill_ctx *f = ctx;
    uint8_t *p = dst;
    for (int i = 0; i < PAYLOAD; i++)
        p[i] = (uint8_t)(f->seed * 131 + i * 7 + (i >> 8));
    return f->fail;
}

static int payload_ok(const void *got, int seed)
{
    uint8_t want[PAYLOAD];
    fill_ctx f = {seed, 0};
    fill(&f, want);
    return got && !memcmp(got, want, PAYLOAD);
}

static void tokens_of(int seed, int32_t *tok)
{
    for (int i = 0; i < BS; i++)
        tok[i] = (seed * 37 + i * 11) % 300;
}

static void key_of(int seed, const uint8_t *fp, uint8_t *key)
{
    int32_t tok[BS];
    tokens_of(seed, tok);
    kvhash_chain_key(fp, 0, tok, BS, key);
}

static kvtier_config cfg_for(const char *dir, int host_records, int disk_records, uint8_t fpb)
{
    kvtier_config c = kvtier_config_default();
    memset(c.fingerprint, fpb, sizeof c.fingerprint);
    c.block_size = BS;
    c.kv_dtype = 1;
    c.payload_bytes = PAYLOAD;
    uint64_t rec = KVTIER_PAYLOAD_OFF(BS) + PAYLOAD;
    c.host_bytes = (uint64_t)host_records * rec;
    c.disk_dir = dir;
    c.disk_bytes = (uint64_t)disk_records * rec;
    c.disk_fsync = 0; /* the page cache is enough for these tests */
    c.disk_wait = 1;  /* never drop a write for a busy writer */
    c.quiet = 1;
    c.write_queue_bytes = 0; /* the smallest queue: KVTIER_WRITE_QUEUE records */
    return c;
}

static int store(kvtier *t, int seed, const uint8_t *fp)
{
    uint8_t key[32];
    int32_t tok[BS];
    key_of(seed, fp, key);
    tokens_of(seed, tok);
    fill_ctx f = {seed, 0};
    int r = kvtier_store(t, key, tok, fill, &f);
    kvtier_flush(t); /* finished disk writes are indexed: deterministic counts */
    return r;
}

static const void *fetch(kvtier *t, int seed, const uint8_t *fp, int *where)
{
    uint8_t key[32];
    int32_t tok[BS];
    key_of(seed, fp, key);
    tokens_of(seed, tok);
    *where = kvtier_where(t, key);
    return kvtier_fetch(t, key, tok);
}

static void rm_dir(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d) {
        unlink(dir);
        return;
    }
    struct dirent *de;
    char path[1024];
    while ((de = readdir(d)))
        if (strcmp(de->d_name, ".") && strcmp(de->d_name, "..")) {
            snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
            unlink(path);
        }
    closedir(d);
    rmdir(dir);
}

static int count_files(const char *dir, const char *part)
{
    DIR *d = opendir(dir);
    int n = 0;
    struct dirent *de;
    while (d && (de = readdir(d))) {
        n += strstr(de->d_name, part) != NULL;
    }
    if (d)
        closedir(d);
    return n;
}

static void record_path(const char *dir, int seed, const uint8_t *fp, char *out, size_t cap)
{
    uint8_t key[32];
    char hx[65];
    key_of(seed, fp, key);
    hex_of(key, 32, hx);
    snprintf(out, cap, "%s/%s.kvb", dir, hx);
}

/* ---- tests ---- */

static void test_host(void)
{
    uint8_t fp[32];
    memset(fp, 7, sizeof fp);
    kvtier_config c = cfg_for(NULL, 3, 0, 7);
    kvtier *t = kvtier_create(&c, NULL);
    CHECK(t != NULL);
    if (!t)
        return;
    for (int s = 1; s <= 3; s++)
        CHECK(store(t, s, fp) == KVTIER_HOST);
    int where;
    CHECK(payload_ok(fetch(t, 1, fp, &where), 1) && where == KVTIER_HOST); /* 1 is now MRU */
    CHECK(store(t, 4, fp) == KVTIER_HOST);                                /* evicts 2 */
    CHECK(fetch(t, 2, fp, &where) == NULL && where == KVTIER_NONE);
    CHECK(payload_ok(fetch(t, 3, fp, &where), 3));
    CHECK(payload_ok(fetch(t, 4, fp, &where), 4));
    /* the same key with other token ids is never served */
    uint8_t key[32];
    int32_t tok[BS];
    key_of(3, fp, key);
    tokens_of(3, tok);
    tok[5]++;
    CHECK(kvtier_fetch(t, key, tok) == NULL);
    /* a failed fill stores nothing */
    fill_ctx f = {9, 1};
    key_of(9, fp, key);
    tokens_of(9, tok);
    CHECK(kvtier_store(t, key, tok, fill, &f) == KVTIER_NONE);
    CHECK(kvtier_where(t, key) == KVTIER_NONE);
    kvtier_stats st;
    kvtier_get_stats(t, &st);
    /* (the failed fill had taken, then returned, the LRU slot) */
    CHECK(st.host_enabled && !st.disk_enabled && st.host_blocks == 2 &&
          st.host_capacity_blocks == 3);
    CHECK(st.evictions[KVTIER_HOST] >= 1 && st.loads[KVTIER_HOST] == 3);
    kvtier_destroy(t);
    /* budgets too small for a record are configuration errors */
    kvant_err err = {0};
    c = cfg_for(NULL, 1, 0, 7);
    CHECK(kvtier_create(&c, &err) == NULL && err.code == KV_EINVAL);
    c = cfg_for("build/tests/kvtier-none", 0, 0, 7);
    CHECK(kvtier_create(&c, &err) == NULL && err.code == KV_EINVAL);
}

static void mk_dir(char *tmpl)
{
    CHECK(mkdtemp(tmpl) != NULL);
}

static void test_disk_restart(void)
{
    uint8_t fp[32];
    memset(fp, 7, sizeof fp);
    char dir[] = "build/tests/kvtier.XXXXXX";
    mk_dir(dir);
    kvtier_config c = cfg_for(dir, 2, 3, 7);
    kvtier *t = kvtier_create(&c, NULL);
    CHECK(t != NULL);
    if (!t)
        return;
    for (int s = 1; s <= 6; s++)
        CHECK(store(t, s, fp) == KVTIER_HOST); /* 1..4 demoted to disk, then 1 unlinked */
    int where;
    CHECK(fetch(t, 1, fp, &where) == NULL && where == KVTIER_NONE);
    CHECK(payload_ok(fetch(t, 2, fp, &where), 2) && where == KVTIER_DISK);
    CHECK(payload_ok(fetch(t, 6, fp, &where), 6) && where == KVTIER_HOST);
    kvtier_stats st;
    kvtier_get_stats(t, &st);
    CHECK(st.disk_enabled && st.disk_blocks == 3 && st.evictions[KVTIER_DISK] == 1);
    CHECK(st.stores[KVTIER_DISK] == 4 && st.loads[KVTIER_DISK] == 1);
    CHECK(count_files(dir, ".kvb") == 3);
    /* a second process on the same directory runs without a disk tier */
    kvtier *t2 = kvtier_create(&c, NULL);
    CHECK(t2 != NULL);
    kvtier_get_stats(t2, &st);
    CHECK(!st.disk_enabled && st.disk_errors == 1);
    kvtier_destroy(t2);
    /* destroy flushes the host records (5, then 6) to disk, evicting 3, 4 */
    kvtier_destroy(t);
    CHECK(count_files(dir, ".kvb") == 3 && count_files(dir, ".tmp.") == 0);
    /* restart: the index is rebuilt from the files */
    t = kvtier_create(&c, NULL);
    CHECK(t != NULL);
    kvtier_get_stats(t, &st);
    CHECK(st.disk_enabled && st.disk_blocks == 3 && st.skipped_corrupt == 0 &&
          st.skipped_foreign == 0);
    for (int s = 2; s <= 6; s++) {
        const void *pl = fetch(t, s, fp, &where);
        if (s == 3 || s == 4)
            CHECKF(pl == NULL && where == KVTIER_NONE, "seed %d", s);
        else
            CHECKF(payload_ok(pl, s) && where == KVTIER_DISK, "seed %d", s);
    }
    kvtier_destroy(t);
    /* another model (fingerprint) on the same directory sees only foreign records */
    uint8_t fp2[32];
    memset(fp2, 8, sizeof fp2);
    kvtier_config c2 = cfg_for(dir, 2, 4, 8);
    t = kvtier_create(&c2, NULL);
    CHECK(t != NULL);
    kvtier_get_stats(t, &st);
    CHECK(st.disk_enabled && st.disk_blocks == 0 && st.skipped_foreign == 3);
    CHECK(fetch(t, 2, fp2, &where) == NULL && where == KVTIER_NONE);
    kvtier_destroy(t);
    CHECK(count_files(dir, ".kvb") == 3); /* foreign records are left alone */
    rm_dir(dir);
}

static void corrupt_file(const char *path, long off, int truncate_to)
{
    int fd = open(path, O_RDWR);
    CHECK(fd >= 0);
    if (fd < 0)
        return;
    if (truncate_to >= 0) {
        CHECK(ftruncate(fd, truncate_to) == 0);
    } else {
        uint8_t b;
        CHECK(pread(fd, &b, 1, off) == 1);
        b ^= 0x10;
        CHECK(pwrite(fd, &b, 1, off) == 1);
    }
    close(fd);
}

static void test_disk_faults(void)
{
    uint8_t fp[32];
    memset(fp, 7, sizeof fp);
    char dir[] = "build/tests/kvtier.XXXXXX";
    mk_dir(dir);
    kvtier_config c = cfg_for(dir, 0, 8, 7); /* disk only: stores go straight to disk */
    kvtier *t = kvtier_create(&c, NULL);
    CHECK(t != NULL);
    if (!t)
        return;
    for (int s = 1; s <= 5; s++)
        CHECK(store(t, s, fp) == KVTIER_DISK);
    kvtier_destroy(t);
    char p[1024];
    record_path(dir, 1, fp, p, sizeof p);
    corrupt_file(p, 0, 300);                            /* torn: cut inside the payload */
    record_path(dir, 2, fp, p, sizeof p);
    corrupt_file(p, (long)KVTIER_PAYLOAD_OFF(BS) + 500, -1); /* flipped payload byte */
    record_path(dir, 3, fp, p, sizeof p);
    corrupt_file(p, 60, -1);                            /* flipped key byte: header CRC */
    snprintf(p, sizeof p, "%s/.tmp.deadbeef.kvb", dir); /* a write that never finished */
    FILE *f = fopen(p, "w");
    CHECK(f && fputs("half a record", f) >= 0);
    if (f)
        fclose(f);
    snprintf(p, sizeof p, "%s/notes.txt", dir);         /* a file that is not ours */
    f = fopen(p, "w");
    if (f)
        fclose(f);
    t = kvtier_create(&c, NULL);
    CHECK(t != NULL);
    if (!t)
        return;
    kvtier_stats st;
    kvtier_get_stats(t, &st);
    /* torn, key-flipped and .tmp are found by the scan; notes.txt is foreign */
    CHECKF(st.skipped_corrupt == 3 && st.skipped_foreign == 1 && st.disk_blocks == 3,
           "corrupt %llu foreign %llu blocks %lld", (unsigned long long)st.skipped_corrupt,
           (unsigned long long)st.skipped_foreign, (long long)st.disk_blocks);
    int where;
    CHECK(fetch(t, 1, fp, &where) == NULL && where == KVTIER_NONE);
    /* the flipped payload byte passes the header scan and fails the payload CRC */
    CHECK(fetch(t, 2, fp, &where) == NULL && where == KVTIER_DISK);
    CHECK(fetch(t, 3, fp, &where) == NULL && where == KVTIER_NONE);
    CHECK(payload_ok(fetch(t, 4, fp, &where), 4));
    CHECK(payload_ok(fetch(t, 5, fp, &where), 5));
    kvtier_get_stats(t, &st);
    CHECK(st.skipped_corrupt == 4 && st.disk_blocks == 2 && st.disk_enabled);
    CHECK(count_files(dir, ".kvb") == 2);
    /* the directory disappears under a running server: degrade, do not fail */
    kvtier_destroy(t);
    t = kvtier_create(&c, NULL);
    rm_dir(dir);
    CHECK(store(t, 7, fp) == KVTIER_DISK); /* queued; the writer fails, store flushed */
    kvtier_get_stats(t, &st);
    CHECK(!st.disk_enabled && st.disk_errors == 1);
    CHECK(fetch(t, 4, fp, &where) == NULL && where == KVTIER_NONE);
    CHECK(store(t, 8, fp) == KVTIER_NONE);
    kvtier_destroy(t);
    rm_dir(dir);
    /* a path that cannot be a directory: the tier starts without disk */
    c.disk_dir = "build/tests/kvtier-file";
    f = fopen(c.disk_dir, "w");
    if (f)
        fclose(f);
    t = kvtier_create(&c, NULL);
    CHECK(t != NULL);
    kvtier_get_stats(t, &st);
    CHECK(!st.disk_enabled && st.disk_errors == 1);
    CHECK(store(t, 1, fp) == KVTIER_NONE);
    kvtier_destroy(t);
    unlink(c.disk_dir);
}

/* Disk full: in a child, RLIMIT_FSIZE below one record makes every record
 * write fail (EFBIG) after start-up; the tier degrades to no disk. */
static void test_disk_full(void)
{
    uint8_t fp[32];
    memset(fp, 7, sizeof fp);
    char dir[] = "build/tests/kvtier.XXXXXX";
    mk_dir(dir);
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        kvtier_config c = cfg_for(dir, 2, 8, 7);
        kvtier *t = kvtier_create(&c, NULL);
        int ok = t != NULL;
        signal(SIGXFSZ, SIG_IGN);
        struct rlimit rl = {512, 512};
        ok &= setrlimit(RLIMIT_FSIZE, &rl) == 0;
        for (int s = 1; s <= 4; s++)
            ok &= store(t, s, fp) == KVTIER_HOST; /* 1, 2 demoted: the writes fail */
        kvtier_stats st;
        kvtier_get_stats(t, &st);
        ok &= !st.disk_enabled && st.disk_errors == 1 && st.stores[KVTIER_DISK] == 0;
        int where;
        ok &= payload_ok(fetch(t, 4, fp, &where), 4) && where == KVTIER_HOST;
        ok &= fetch(t, 1, fp, &where) == NULL;
        ok &= count_files(dir, ".kvb") == 0 && count_files(dir, ".tmp.") == 0;
        kvtier_destroy(t);
        _exit(ok ? 0 : 1);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    CHECKF(WIFEXITED(status) && WEXITSTATUS(status) == 0, "disk-full child failed (status %d)",
           status);
    rm_dir(dir);
}

/* The writer queue: records queued behind a paused writer are found and
 * served from their buffers; a full queue drops a write (counted) instead
 * of waiting; resumed, every queued record reaches the disk. */
static void test_writer_queue(void)
{
    uint8_t fp[32];
    memset(fp, 7, sizeof fp);
    char dir[] = "build/tests/kvtier.XXXXXX";
    mk_dir(dir);
    kvtier_config c = cfg_for(dir, 0, 64, 7);
    c.disk_wait = 0;
    kvtier *t = kvtier_create(&c, NULL);
    CHECK(t != NULL);
    if (!t)
        return;
    kvtier_pause_writer(t, 1);
    uint8_t key[32];
    int32_t tok[BS];
    for (int s = 1; s <= KVTIER_WRITE_QUEUE + 1; s++) {
        key_of(s, fp, key);
        tokens_of(s, tok);
        fill_ctx f = {s, 0};
        int r = kvtier_store(t, key, tok, fill, &f);
        CHECKF(r == (s <= KVTIER_WRITE_QUEUE ? KVTIER_DISK : KVTIER_NONE), "seed %d: %d", s, r);
    }
    kvtier_stats st;
    kvtier_get_stats(t, &st);
    CHECK(st.disk_write_drops == 1 && st.disk_pending == KVTIER_WRITE_QUEUE &&
          st.disk_blocks == 0);
    CHECK(count_files(dir, ".kvb") == 0);
    int where;
    CHECK(payload_ok(fetch(t, 3, fp, &where), 3) && where == KVTIER_DISK);
    CHECK(fetch(t, KVTIER_WRITE_QUEUE + 1, fp, &where) == NULL && where == KVTIER_NONE);
    kvtier_pause_writer(t, 0);
    kvtier_flush(t);
    kvtier_get_stats(t, &st);
    CHECK(st.disk_pending == 0 && st.disk_blocks == KVTIER_WRITE_QUEUE &&
          st.stores[KVTIER_DISK] == KVTIER_WRITE_QUEUE);
    CHECK(count_files(dir, ".kvb") == KVTIER_WRITE_QUEUE && count_files(dir, ".tmp.") == 0);
    CHECK(payload_ok(fetch(t, 3, fp, &where), 3) && where == KVTIER_DISK);
    kvtier_destroy(t);
    rm_dir(dir);
}

/* Write-through: a key is written once (queued or on disk: deduplicated
 * and counted), a full queue answers at once (counted), a key the host
 * tier holds is copied from there (the device is not read), and the
 * records survive a restart. */
static void test_write_through(void)
{
    uint8_t fp[32];
    memset(fp, 7, sizeof fp);
    char dir[] = "build/tests/kvtier.XXXXXX";
    mk_dir(dir);
    kvtier_config c = cfg_for(dir, 4, 64, 7);
    c.disk_wait = 0;
    kvtier *t = kvtier_create(&c, NULL);
    CHECK(t != NULL);
    if (!t)
        return;
    uint8_t key[32];
    int32_t tok[BS];
    kvtier_pause_writer(t, 1);
    for (int s = 1; s <= KVTIER_WRITE_QUEUE + 1; s++) {
        key_of(s, fp, key);
        tokens_of(s, tok);
        fill_ctx f = {s, 0};
        int r = kvtier_write_through(t, key, tok, fill, &f);
        CHECKF(r == (s <= KVTIER_WRITE_QUEUE ? KVTIER_WT_QUEUED : KVTIER_WT_FULL), "seed %d: %d",
               s, r);
    }
    key_of(2, fp, key);
    tokens_of(2, tok);
    fill_ctx f2 = {2, 0};
    CHECK(kvtier_write_through(t, key, tok, fill, &f2) == KVTIER_WT_HELD); /* queued */
    kvtier_stats st;
    kvtier_get_stats(t, &st);
    CHECK(st.wt_queued == KVTIER_WRITE_QUEUE && st.wt_full == 1 && st.wt_dedup == 1 &&
          st.disk_pending == KVTIER_WRITE_QUEUE && st.wt_written == 0);
    kvtier_pause_writer(t, 0);
    kvtier_flush(t);
    CHECK(kvtier_write_through(t, key, tok, fill, &f2) == KVTIER_WT_HELD); /* on disk */
    kvtier_get_stats(t, &st);
    uint64_t rec = KVTIER_PAYLOAD_OFF(BS) + PAYLOAD;
    CHECK(st.wt_dedup == 2 && st.wt_written == KVTIER_WRITE_QUEUE &&
          st.wt_written_bytes == KVTIER_WRITE_QUEUE * rec && st.disk_blocks == KVTIER_WRITE_QUEUE);
    CHECK(count_files(dir, ".kvb") == KVTIER_WRITE_QUEUE);
    /* a key in the host tier: its record is copied from the slab */
    CHECK(store(t, 40, fp) == KVTIER_HOST);
    key_of(40, fp, key);
    tokens_of(40, tok);
    fill_ctx bad = {40, 1}; /* would fail: must not be called */
    CHECK(kvtier_write_through(t, key, tok, fill, &bad) == KVTIER_WT_QUEUED);
    kvtier_flush(t);
    CHECK(count_files(dir, ".kvb") == KVTIER_WRITE_QUEUE + 1);
    kvtier_destroy(t); /* the host record 40 is on disk already: not rewritten */
    CHECK(count_files(dir, ".kvb") == KVTIER_WRITE_QUEUE + 1 && count_files(dir, ".tmp.") == 0);
    t = kvtier_create(&c, NULL);
    CHECK(t != NULL);
    if (!t)
        return;
    int where;
    CHECK(payload_ok(fetch(t, 40, fp, &where), 40) && where == KVTIER_DISK);
    CHECK(payload_ok(fetch(t, 5, fp, &where), 5) && where == KVTIER_DISK);
    key_of(5, fp, key);
    tokens_of(5, tok);
    fill_ctx f5 = {5, 0};
    CHECK(kvtier_write_through(t, key, tok, fill, &f5) == KVTIER_WT_HELD);
    /* a deadline that has passed: a write that would wait is dropped */
    kvtier_pause_writer(t, 1);
    kvtier_set_wait(t, 1);
    kvtier_set_deadline(t, 1e-9);
    for (int s = 100; s < 100 + KVTIER_WRITE_QUEUE; s++) {
        key_of(s, fp, key);
        tokens_of(s, tok);
        fill_ctx f = {s, 0};
        CHECK(kvtier_write_through(t, key, tok, fill, &f) == KVTIER_WT_QUEUED);
    }
    CHECK(kvtier_wait_one(t) == 0);
    key_of(200, fp, key);
    tokens_of(200, tok);
    fill_ctx f200 = {200, 0};
    kvtier_get_stats(t, &st);
    uint64_t drops = st.disk_write_drops;
    CHECK(kvtier_store(t, key, tok, fill, &f200) == KVTIER_HOST);
    for (int s = 201; s <= 204; s++) { /* host full: demotions meet the full queue */
        key_of(s, fp, key);
        tokens_of(s, tok);
        fill_ctx f = {s, 0};
        CHECK(kvtier_store(t, key, tok, fill, &f) == KVTIER_HOST);
    }
    kvtier_get_stats(t, &st);
    CHECK(st.disk_write_drops > drops);
    kvtier_pause_writer(t, 0);
    kvtier_destroy(t);
    rm_dir(dir);
}

/* Past cfg.scan_verify entries the scan indexes records by name only:
 * another model's record is then found out on first read (a miss, the
 * file left alone), a corrupt one is unlinked there, and an eviction
 * checks before it unlinks. */
static void test_disk_name_index(void)
{
    uint8_t fp[32], fp2[32];
    memset(fp, 7, sizeof fp);
    memset(fp2, 8, sizeof fp2);
    char dir[] = "build/tests/kvtier.XXXXXX";
    mk_dir(dir);
    kvtier_config c = cfg_for(dir, 0, 8, 7);
    kvtier *t = kvtier_create(&c, NULL);
    CHECK(t != NULL);
    if (!t)
        return;
    for (int s = 1; s <= 3; s++)
        CHECK(store(t, s, fp) == KVTIER_DISK);
    kvtier_destroy(t);
    char p[1024];
    record_path(dir, 3, fp, p, sizeof p);
    corrupt_file(p, 60, -1); /* flipped key byte: header CRC */
    kvtier_config c2 = cfg_for(dir, 0, 3, 8); /* another model, a budget of three */
    c2.scan_verify = 0;
    t = kvtier_create(&c2, NULL);
    CHECK(t != NULL);
    if (!t)
        return;
    kvtier_stats st;
    kvtier_get_stats(t, &st);
    CHECK(st.disk_blocks == 3 && st.skipped_foreign == 0 && st.skipped_corrupt == 0);
    /* its own records push the unchecked ones out: foreign ones stay on disk */
    for (int s = 11; s <= 13; s++)
        CHECK(store(t, s, fp2) == KVTIER_DISK);
    kvtier_get_stats(t, &st);
    CHECKF(st.skipped_foreign == 2 && st.skipped_corrupt == 1 && st.evictions[KVTIER_DISK] == 0 &&
           st.disk_blocks == 3, "foreign %llu corrupt %llu evictions %llu blocks %lld",
           (unsigned long long)st.skipped_foreign, (unsigned long long)st.skipped_corrupt,
           (unsigned long long)st.evictions[KVTIER_DISK], (long long)st.disk_blocks);
    CHECK(count_files(dir, ".kvb") == 5); /* 1, 2 (model 7) and 11..13 */
    kvtier_destroy(t);
    /* the first model, name-only: its record is served after the check on read */
    c.scan_verify = 0;
    t = kvtier_create(&c, NULL);
    CHECK(t != NULL);
    if (!t)
        return;
    int where;
    CHECK(payload_ok(fetch(t, 1, fp, &where), 1) && where == KVTIER_DISK);
    CHECK(fetch(t, 11, fp2, &where) == NULL); /* model 8's: never served */
    kvtier_get_stats(t, &st);
    CHECK(st.skipped_foreign == 1 && st.disk_blocks == 4);
    kvtier_destroy(t);
    CHECK(count_files(dir, ".kvb") == 5);
    rm_dir(dir);
}

/* --kv-host-memory against RAM (numbers, not this machine's). */
static void test_host_fit(void)
{
    const uint64_t G = 1ull << 30;
    uint64_t out = 0;
    kvant_err err = {0};
    CHECK(kvcost_host_fit(4 * G, 16 * G, 2 * G, &out, &err) == KV_OK && out == 4 * G);
    CHECK(kvcost_host_fit(14 * G, 16 * G, 2 * G, &out, &err) == KV_EINVAL);
    CHECKF(strstr(err.msg, "14336 MiB") && strstr(err.msg, "16384 MiB") &&
           strstr(err.msg, "2048 MiB") && strstr(err.msg, "512 MiB"), "%s", err.msg);
    out = 1;
    CHECK(kvcost_host_fit(16 * G - 2 * G - KVCOST_HOST_MARGIN, 16 * G, 2 * G, &out, &err) ==
              KV_OK && out == 16 * G - 2 * G - KVCOST_HOST_MARGIN);
    CHECK(kvcost_host_fit(KVCOST_HOST_AUTO, 16 * G, 2 * G, &out, &err) == KV_OK);
    uint64_t room = 16 * G - 2 * G - KVCOST_HOST_MARGIN;
    CHECK(out == room / 100 * KVCOST_HOST_AUTO_PCT);
    CHECK(kvcost_host_fit(KVCOST_HOST_AUTO, G, 2 * G, &out, &err) == KV_EINVAL);
    CHECKF(strstr(err.msg, "auto: no RAM left") && strstr(err.msg, "1024 MiB available"), "%s",
           err.msg);
    CHECK(kvcost_host_fit(KVCOST_HOST_AUTO, 0, 0, &out, &err) == KV_EINVAL);
    CHECK(kvcost_host_fit(64 * G, 0, 0, &out, &err) == KV_OK && out == 64 * G); /* unknown */
}

static void test_cost(void)
{
    kvcost c = {0};
    c.read_bps[KVTIER_HOST] = 10e9;
    c.write_bps[KVTIER_HOST] = 10e9;
    c.read_bps[KVTIER_DISK] = 100e6;
    /* prefill rate unknown: load */
    CHECK(kvcost_prefer_load(&c, KVTIER_HOST, 1 << 20, 16));
    c.prefill_tps = 1000; /* 16 tokens = 16 ms */
    CHECK(kvcost_prefer_load(&c, KVTIER_HOST, 1 << 20, 16));  /* 0.1 ms */
    CHECK(kvcost_prefer_load(&c, KVTIER_DISK, 1 << 20, 16));  /* 10 ms */
    CHECK(!kvcost_prefer_load(&c, KVTIER_DISK, 4 << 20, 16)); /* 42 ms > 16 ms */
    CHECK(!kvcost_prefer_load(&c, KVTIER_NONE, 1, 16));
    c.prefill_tps = 1e6; /* a fast device: recompute beats even the host */
    CHECK(!kvcost_prefer_load(&c, KVTIER_HOST, 1 << 20, 16));
    CHECK(!kvcost_prefer_swap(&c, 1 << 20, 16));
    c.prefill_tps = 1000;
    CHECK(kvcost_prefer_swap(&c, 1 << 20, 16));
    c.read_bps[KVTIER_HOST] = 0; /* no host tier: never swap */
    CHECK(!kvcost_prefer_swap(&c, 1, 1000));
}

/* A restart that scans one directory entry at create and the rest in
 * slices of KVTIER_SCAN_PER_POLL per kvtier_poll. */
static void test_disk_lazy_scan(void)
{
    uint8_t fp[32];
    memset(fp, 9, sizeof fp);
    char dir[] = "build/tests/kvtier.XXXXXX";
    mk_dir(dir);
    kvtier_config c = cfg_for(dir, 2, 300, 9);
    kvtier *t = kvtier_create(&c, NULL);
    CHECK(t != NULL);
    if (!t)
        return;
    const int n = 2 * KVTIER_SCAN_PER_POLL + 5; /* three slices */
    for (int s = 1; s <= n; s++)
        store(t, s, fp);
    kvtier_destroy(t); /* the two host records go to disk too */
    CHECK(count_files(dir, ".kvb") == n);
    /* a dead process's temporary file, an hour old */
    char tmp[256];
    snprintf(tmp, sizeof tmp, "%s/.tmp.%064d.kvb", dir, 0);
    FILE *f = fopen(tmp, "w");
    CHECK(f != NULL);
    if (f)
        fclose(f);
    struct timeval tv[2] = {{time(NULL) - 3600, 0}, {time(NULL) - 3600, 0}};
    CHECK(utimes(tmp, tv) == 0);

    c.scan_eager = 1;
    t = kvtier_create(&c, NULL);
    CHECK(t != NULL);
    if (!t)
        return;
    kvtier_stats st;
    kvtier_get_stats(t, &st);
    CHECK(st.disk_enabled && st.disk_scanning && st.disk_blocks <= 1);
    /* new records while the scan runs: written as .tmp then renamed */
    for (int s = n + 1; s <= n + 3; s++)
        CHECK(store(t, s, fp) == KVTIER_HOST);
    int polls = 0;
    for (; polls < 100 && st.disk_scanning; polls++) {
        kvtier_poll(t);
        kvtier_get_stats(t, &st);
    }
    CHECKF(!st.disk_scanning && polls >= 2 && polls <= 4, "scan finished after %d polls", polls);
    /* n old records and the first new one, demoted from the two-record host tier */
    CHECKF(st.disk_blocks == n + 1, "disk blocks %lld", (long long)st.disk_blocks);
    CHECKF(st.skipped_corrupt == 1 && st.skipped_foreign == 0, "corrupt %llu foreign %llu",
           (unsigned long long)st.skipped_corrupt, (unsigned long long)st.skipped_foreign);
    CHECK(access(tmp, F_OK) != 0);
    int where, ok = 1;
    for (int s = 1; s <= n + 3; s++)
        ok &= payload_ok(fetch(t, s, fp, &where), s);
    CHECK(ok);
    kvtier_destroy(t);
    rm_dir(dir);
}

/* ---- pinned slab and async stores, against a mock DMA engine ---- */

/* Copies queued by md_afill run only when md_done is asked about their
 * ticket (wait, or the "device" has reached it): a tier that reads a
 * record before its ticket completed reads the 0xEE it was left with. */
#define MD_MAX 64
typedef struct mock_dma {
    struct {
        uint8_t *dst;
        int seed;
    } q[MD_MAX];
    int64_t issued, ran, device_done, fail_ticket;
    int allocs, frees, waits;
} mock_dma;

typedef struct md_fill {
    mock_dma *m;
    int seed;
} md_fill;

static void md_run(mock_dma *m, int64_t upto)
{
    while (m->ran < upto) {
        m->ran++;
        fill_ctx f = {m->q[m->ran % MD_MAX].seed, 0};
        if (m->ran != m->fail_ticket)
            fill(&f, m->q[m->ran % MD_MAX].dst);
    }
}

static int64_t md_afill(void *ctx, void *dst)
{
    md_fill *x = ctx;
    mock_dma *m = x->m;
    if (m->issued - m->ran >= MD_MAX)
        md_run(m, m->ran + 1);
    memset(dst, 0xEE, PAYLOAD);
    m->issued++;
    m->q[m->issued % MD_MAX].dst = dst;
    m->q[m->issued % MD_MAX].seed = x->seed;
    return m->issued;
}

static int md_done(void *ctx, int64_t ticket, int wait)
{
    mock_dma *m = ctx;
    CHECK(ticket > 0 && ticket <= m->issued);
    if (!wait && ticket > m->device_done && ticket > m->ran)
        return 0;
    m->waits += wait;
    md_run(m, ticket);
    return ticket == m->fail_ticket ? -1 : 1;
}

static void *md_alloc(void *ctx, size_t bytes)
{
    ((mock_dma *)ctx)->allocs++;
    return malloc(bytes);
}

static void md_free(void *ctx, void *p)
{
    ((mock_dma *)ctx)->frees++;
    free(p);
}

static int store_async(kvtier *t, mock_dma *m, int seed, const uint8_t *fp)
{
    uint8_t key[32];
    int32_t tok[BS];
    key_of(seed, fp, key);
    tokens_of(seed, tok);
    md_fill x = {m, seed};
    return kvtier_store_async(t, key, tok, NULL, md_afill, &x);
}

static void test_async_host(void)
{
    uint8_t fp[32];
    memset(fp, 7, sizeof fp);
    char dir[] = "build/tests/kvtier-dma-XXXXXX";
    mk_dir(dir);
    mock_dma m = {0};
    kvtier_config c = cfg_for(dir, 3, 16, 7);
    c.dma = (kvtier_dma){&m, md_alloc, md_free, md_done};
    kvtier *t = kvtier_create(&c, NULL);
    CHECK(t != NULL && m.allocs == 1);
    if (!t)
        return;
    for (int s = 1; s <= 3; s++)
        CHECK(store_async(t, &m, s, fp) == KVTIER_HOST);
    kvtier_stats st;
    kvtier_get_stats(t, &st);
    CHECK(st.host_blocks == 3 && st.host_pending == 3 && m.ran == 0);
    /* a pending record is found, and read only after its copy completed */
    int where;
    CHECKF(payload_ok(fetch(t, 2, fp, &where), 2) && where == KVTIER_HOST,
           "a fetch read a record whose copy was still in flight");
    kvtier_get_stats(t, &st);
    CHECK(st.host_pending == 2 && m.ran == 2); /* 1 copied with 2 (in order), not yet sealed */
    /* write-through of a pending record: offered again later */
    uint8_t key[32];
    int32_t tok[BS];
    key_of(3, fp, key);
    tokens_of(3, tok);
    fill_ctx f = {3, 0};
    CHECK(kvtier_write_through(t, key, tok, fill, &f) == KVTIER_WT_FULL);
    kvtier_poll(t); /* the device has not got there: nothing sealed, nothing waited */
    kvtier_get_stats(t, &st);
    CHECK(st.host_pending == 1 && m.waits == 1);
    m.device_done = m.issued;
    kvtier_poll(t);
    kvtier_get_stats(t, &st);
    CHECK(st.host_pending == 0 && m.waits == 1);
    f.seed = 99; /* the bytes must come from the sealed host record, not a new export */
    CHECK(kvtier_write_through(t, key, tok, fill, &f) == KVTIER_WT_QUEUED);
    kvtier_flush(t);
    /* demotion of a pending record waits for it: the disk gets its bytes */
    CHECK(store_async(t, &m, 4, fp) == KVTIER_HOST); /* evicts 1 (LRU, sealed) */
    CHECK(store_async(t, &m, 5, fp) == KVTIER_HOST); /* evicts 3 */
    CHECK(store_async(t, &m, 6, fp) == KVTIER_HOST); /* evicts 2 */
    CHECK(store_async(t, &m, 7, fp) == KVTIER_HOST); /* evicts 4: pending, waited for */
    kvtier_flush(t);
    for (int s = 1; s <= 4; s++)
        CHECKF(payload_ok(fetch(t, s, fp, &where), s) && where == KVTIER_DISK,
               "record %d demoted to disk with the wrong bytes", s);
    /* a failed copy drops its record, never serves it */
    m.fail_ticket = m.issued + 1;
    CHECK(store_async(t, &m, 8, fp) == KVTIER_HOST);
    CHECK(fetch(t, 8, fp, &where) == NULL && where == KVTIER_HOST);
    key_of(8, fp, key);
    CHECK(kvtier_where(t, key) == KVTIER_NONE);
    kvtier_get_stats(t, &st);
    CHECK(st.skipped_corrupt == 1);
    /* destroy with copies in flight: each is waited for before the slab goes */
    CHECK(store_async(t, &m, 9, fp) == KVTIER_HOST);
    kvtier_destroy(t);
    CHECK(m.ran == m.issued && m.frees == 1);
    rm_dir(dir);
}

int main(void)
{
    mkdir("build", 0755);
    mkdir("build/tests", 0755);
    test_hashes();
    test_host();
    test_disk_restart();
    test_disk_faults();
    test_disk_full();
    test_writer_queue();
    test_disk_lazy_scan();
    test_cost();
    test_write_through();
    test_disk_name_index();
    test_host_fit();
    test_async_host();
    return tu_finish("test_kvtier");
}
