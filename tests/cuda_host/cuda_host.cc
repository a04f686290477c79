/* cuda_host.cc - the host shim's runtime (see cuda_runtime.h for the model):
 * device queries, device memory, lazy streams and events, the launch
 * checks.  Kernels run in cuda_host_fiber.cc, cuBLAS and NCCL are
 * cuda_host_libs.cc.
 *
 * Every entry point takes one process-wide lock: the backend may be used
 * from an engine thread, and stream work runs on whichever thread forces
 * it.  Faults a device would report asynchronously or by hanging (a
 * barrier that can never complete, a shuffle with an exited lane) are
 * printed and abort the process.
 */
#include "cuda_runtime.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include <deque>
#include <map>
#include <mutex>
#include <vector>

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#define CH_ASAN 1
#else
#define CH_ASAN 0
#endif

namespace {

void say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void say(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("cuda-host: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}

double now_s()
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

const size_t k_page = 4096;
const size_t k_total_mem = (size_t)16 << 30;

struct dev_alloc {
    char *base;
    size_t bytes, mapped; /* mapped: whole pages, then one guard page */
};

struct op {
    uint64_t seq;
    cuhost_fn fn, drop;
    void *ctx;
};

} // namespace

struct cuhost_stream {
    unsigned flags;
    std::deque<op> q;
};

struct cuhost_event {
    cuhost_stream *s;
    uint64_t seq, gen;
    bool recorded, done, timing;
    double t;
};

namespace {

struct state {
    std::recursive_mutex mu;
    std::map<uintptr_t, dev_alloc> dev;
    std::map<uintptr_t, size_t> pinned;
    std::vector<cuhost_stream *> streams; /* [0]: the legacy stream */
    std::map<const void *, int> smem_optin;
    size_t used = 0;
    uint64_t seq = 0;
    int exec_depth = 0;
    cudaError_t last = cudaSuccess;
    state() { streams.push_back(new cuhost_stream{cudaStreamDefault, {}}); }
};

state &G()
{
    static state *s = new state; /* never destroyed: no order problems at exit */
    return *s;
}

typedef std::lock_guard<std::recursive_mutex> lock;

void protect_all(int prot)
{
    for (auto &kv : G().dev)
        if (mprotect(kv.second.base, kv.second.mapped - k_page, prot) != 0)
            cuhost_die("mprotect failed");
}

/* Device memory is readable only while stream work runs. */
struct exec_guard {
    exec_guard()
    {
        if (G().exec_depth++ == 0)
            protect_all(PROT_READ | PROT_WRITE);
    }
    ~exec_guard()
    {
        if (--G().exec_depth == 0)
            protect_all(PROT_NONE);
    }
};

const dev_alloc *find_dev(const void *p, size_t bytes)
{
    auto &d = G().dev;
    auto it = d.upper_bound((uintptr_t)p);
    if (it == d.begin())
        return nullptr;
    --it;
    const uintptr_t b = it->first, q = (uintptr_t)p;
    if (q >= b && q - b <= it->second.bytes && bytes <= it->second.bytes - (q - b))
        return &it->second;
    return nullptr;
}

bool is_pinned(const void *p, size_t bytes)
{
    auto &m = G().pinned;
    auto it = m.upper_bound((uintptr_t)p);
    if (it == m.begin())
        return false;
    --it;
    const uintptr_t q = (uintptr_t)p;
    return q - it->first <= it->second && bytes <= it->second - (q - it->first);
}

cuhost_stream *S(cudaStream_t s)
{
    if (!s)
        return G().streams[0];
    for (cuhost_stream *x : G().streams)
        if (x == s)
            return s;
    return nullptr;
}

void run_until(cuhost_stream *s, uint64_t upto)
{
    while (!s->q.empty() && s->q.front().seq <= upto) {
        op o = s->q.front();
        s->q.pop_front();
        {
            exec_guard g;
            o.fn(o.ctx);
        }
        if (o.drop)
            o.drop(o.ctx);
    }
}

void run_all(cuhost_stream *s)
{
    run_until(s, UINT64_MAX);
}

void run_everything()
{
    for (size_t i = 0; i < G().streams.size(); i++)
        run_all(G().streams[i]);
}

/* Enqueues with the legacy stream's implicit ordering: the legacy stream
 * waits for the blocking streams and they for it (resolved now, which is
 * one legal order); non-blocking streams order with nothing. */
uint64_t push(cuhost_stream *s, cuhost_fn fn, cuhost_fn drop, void *ctx)
{
    if (s == G().streams[0]) {
        for (size_t i = 1; i < G().streams.size(); i++)
            if (!(G().streams[i]->flags & cudaStreamNonBlocking))
                run_all(G().streams[i]);
    } else if (!(s->flags & cudaStreamNonBlocking)) {
        run_all(G().streams[0]);
    }
    const uint64_t seq = ++G().seq;
    s->q.push_back(op{seq, fn, drop, ctx});
    return seq;
}

cudaError_t set_err(cudaError_t e)
{
    if (e != cudaSuccess)
        G().last = e;
    return e;
}

/* ---- copies ---- */

struct copy_job {
    void *dst;
    const void *src;
    size_t bytes;
    void *owned; /* a snapshot of a pageable source */
    int fill;    /* >= 0: memset value */
};

void copy_run(void *ctx)
{
    copy_job *j = (copy_job *)ctx;
    if (j->fill >= 0)
        memset(j->dst, j->fill, j->bytes);
    else
        memcpy(j->dst, j->owned ? j->owned : j->src, j->bytes);
}

void copy_drop(void *ctx)
{
    copy_job *j = (copy_job *)ctx;
    free(j->owned);
    delete j;
}

/* kind checked against where the pointers are; Default resolved. */
cudaError_t resolve_kind(void *dst, const void *src, size_t bytes, cudaMemcpyKind *kind)
{
    const bool dd = find_dev(dst, bytes), sd = find_dev(src, bytes);
    cudaMemcpyKind k = *kind;
    if (k == cudaMemcpyDefault)
        k = dd ? (sd ? cudaMemcpyDeviceToDevice : cudaMemcpyHostToDevice)
               : (sd ? cudaMemcpyDeviceToHost : cudaMemcpyHostToHost);
    const bool want_dd = k == cudaMemcpyHostToDevice || k == cudaMemcpyDeviceToDevice;
    const bool want_sd = k == cudaMemcpyDeviceToHost || k == cudaMemcpyDeviceToDevice;
    if (dd != want_dd || sd != want_sd) {
        say("cudaMemcpy kind %d of %zu bytes: destination %p is %s device memory, source %p "
            "is %s (device ranges must lie inside one cudaMalloc)", (int)k, bytes, dst,
            dd ? "" : "not", src, sd ? "device memory" : "not device memory");
        return cudaErrorInvalidValue;
    }
    *kind = k;
    return cudaSuccess;
}

cudaError_t do_copy(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind,
                    cuhost_stream *s, bool sync_api)
{
    if (!s)
        return set_err(cudaErrorInvalidResourceHandle);
    if (bytes == 0)
        return cudaSuccess;
    cudaError_t e = resolve_kind(dst, src, bytes, &kind);
    if (e)
        return set_err(e);
    if (kind == cudaMemcpyHostToHost) {
        run_all(s);
        memcpy(dst, src, bytes);
        return cudaSuccess;
    }
    copy_job *j = new copy_job{dst, src, bytes, nullptr, -1};
    bool wait = false;
    if (kind == cudaMemcpyHostToDevice && !is_pinned(src, bytes)) {
        if (sync_api) /* cudaMemcpy: a stream sync before the copy is staged */
            run_all(s);
        j->owned = malloc(bytes); /* staged now; the DMA runs with the stream */
        if (!j->owned)
            cuhost_die("out of host memory staging %zu bytes", bytes);
        memcpy(j->owned, src, bytes);
    } else if (kind == cudaMemcpyHostToDevice) {
        wait = sync_api; /* pinned: cudaMemcpy returns when done */
    } else if (kind == cudaMemcpyDeviceToHost) {
        wait = sync_api || !is_pinned(dst, bytes); /* to pageable memory: synchronous */
    }
    const uint64_t seq = push(s, copy_run, copy_drop, j);
    if (wait)
        run_until(s, seq);
    return cudaSuccess;
}

} // namespace

/* ---- device and errors ---- */

cudaError_t cudaGetDeviceCount(int *n)
{
    *n = 1;
    return cudaSuccess;
}

cudaError_t cudaSetDevice(int d)
{
    return d == 0 ? cudaSuccess : set_err(cudaErrorInvalidDevice);
}

cudaError_t cudaGetDevice(int *d)
{
    *d = 0;
    return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(cudaDeviceProp *p, int d)
{
    if (d != 0)
        return set_err(cudaErrorInvalidDevice);
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "cuda-host shim (no device)");
    memcpy(p->uuid.bytes, "cuda-host-shim-0", 16);
    p->totalGlobalMem = k_total_mem;
    p->sharedMemPerBlock = CUHOST_SMEM_DEFAULT;
    p->sharedMemPerBlockOptin = CUHOST_SMEM_OPTIN;
    p->maxThreadsPerBlock = CUHOST_MAX_THREADS;
    p->maxThreadsDim[0] = p->maxThreadsDim[1] = 1024;
    p->maxThreadsDim[2] = 64;
    p->maxGridSize[0] = 0x7fffffff;
    p->maxGridSize[1] = p->maxGridSize[2] = 65535;
    p->warpSize = 32;
    p->multiProcessorCount = 1;
    p->major = 9;
    return cudaSuccess;
}

cudaError_t cudaDeviceGetPCIBusId(char *bus, int len, int d)
{
    if (d != 0)
        return set_err(cudaErrorInvalidDevice);
    snprintf(bus, (size_t)len, "0000:00:00.0");
    return cudaSuccess;
}

cudaError_t cudaMemGetInfo(size_t *free_b, size_t *total_b)
{
    lock l(G().mu);
    *total_b = k_total_mem;
    *free_b = k_total_mem - G().used;
    return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize(void)
{
    lock l(G().mu);
    run_everything();
    return cudaSuccess;
}

cudaError_t cudaGetLastError(void)
{
    lock l(G().mu);
    cudaError_t e = G().last;
    G().last = cudaSuccess;
    return e;
}

cudaError_t cudaPeekAtLastError(void)
{
    lock l(G().mu);
    return G().last;
}

const char *cudaGetErrorString(cudaError_t e)
{
    switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorNoDevice: return "no CUDA-capable device is detected";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorInvalidResourceHandle: return "invalid resource handle";
    case cudaErrorNotReady: return "device not ready";
    case cudaErrorLaunchOutOfResources: return "too many resources requested for launch";
    case cudaErrorLaunchFailure: return "unspecified launch failure";
    default: return "unknown error";
    }
}

void cuhost_set_launch_error(cudaError_t e)
{
    lock l(G().mu);
    set_err(e);
}

int cuhost_is_device(const void *p, size_t bytes)
{
    lock l(G().mu);
    return find_dev(p, bytes) != nullptr;
}

/* ---- memory ---- */

cudaError_t cudaMalloc(void **p, size_t bytes)
{
    lock l(G().mu);
    *p = nullptr;
    const size_t size = bytes ? bytes : 1;
    if (size > k_total_mem - G().used)
        return set_err(cudaErrorMemoryAllocation);
    const size_t mapped = (size + k_page - 1) / k_page * k_page + k_page;
    void *m = mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED)
        return set_err(cudaErrorMemoryAllocation);
    char *base = (char *)m;
    memset(base, 0xFF, size); /* NaN in every float: reading unwritten memory shows */
#if CH_ASAN
    __asan_poison_memory_region(base + size, mapped - k_page - size);
#endif
    mprotect(base + mapped - k_page, k_page, PROT_NONE);
    if (G().exec_depth == 0)
        mprotect(base, mapped - k_page, PROT_NONE);
    G().dev[(uintptr_t)base] = dev_alloc{base, size, mapped};
    G().used += size;
    *p = base;
    return cudaSuccess;
}

cudaError_t cudaFree(void *p)
{
    lock l(G().mu);
    if (!p)
        return cudaSuccess;
    run_everything(); /* cudaFree synchronizes the device */
    auto it = G().dev.find((uintptr_t)p);
    if (it == G().dev.end()) {
        say("cudaFree(%p): not a device allocation", p);
        return set_err(cudaErrorInvalidValue);
    }
#if CH_ASAN
    __asan_unpoison_memory_region(it->second.base, it->second.mapped - k_page);
#endif
    munmap(it->second.base, it->second.mapped);
    G().used -= it->second.bytes;
    G().dev.erase(it);
    return cudaSuccess;
}

cudaError_t cudaHostAlloc(void **p, size_t bytes, unsigned flags)
{
    lock l(G().mu);
    *p = malloc(bytes ? bytes : 1);
    if (!*p)
        return set_err(cudaErrorMemoryAllocation);
    G().pinned[(uintptr_t)*p] = bytes;
    return cudaSuccess;
}

cudaError_t cudaMallocHost(void **p, size_t bytes)
{
    return cudaHostAlloc(p, bytes, 0);
}

cudaError_t cudaFreeHost(void *p)
{
    lock l(G().mu);
    if (!p)
        return cudaSuccess;
    run_everything();
    auto it = G().pinned.find((uintptr_t)p);
    if (it == G().pinned.end()) {
        say("cudaFreeHost(%p): not a pinned allocation", p);
        return set_err(cudaErrorInvalidValue);
    }
    G().pinned.erase(it);
    free(p);
    return cudaSuccess;
}

cudaError_t cudaMemcpy(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind)
{
    lock l(G().mu);
    return do_copy(dst, src, bytes, kind, G().streams[0], true);
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind,
                            cudaStream_t s)
{
    lock l(G().mu);
    return do_copy(dst, src, bytes, kind, S(s), false);
}

static cudaError_t do_memset(void *p, int v, size_t bytes, cudaStream_t s)
{
    lock l(G().mu);
    cuhost_stream *st = S(s);
    if (!st)
        return set_err(cudaErrorInvalidResourceHandle);
    if (!bytes)
        return cudaSuccess;
    if (!find_dev(p, bytes)) {
        say("cudaMemset(%p, %zu bytes): not inside one device allocation", p, bytes);
        return set_err(cudaErrorInvalidValue);
    }
    push(st, copy_run, copy_drop, new copy_job{p, nullptr, bytes, nullptr, v & 0xFF});
    return cudaSuccess;
}

cudaError_t cudaMemset(void *p, int v, size_t bytes)
{
    return do_memset(p, v, bytes, nullptr);
}

cudaError_t cudaMemsetAsync(void *p, int v, size_t bytes, cudaStream_t s)
{
    return do_memset(p, v, bytes, s);
}

/* ---- streams and events ---- */

cudaError_t cudaStreamCreate(cudaStream_t *s)
{
    return cudaStreamCreateWithFlags(s, cudaStreamDefault);
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned flags)
{
    lock l(G().mu);
    *s = new cuhost_stream{flags, {}};
    G().streams.push_back(*s);
    return cudaSuccess;
}

cudaError_t cudaStreamDestroy(cudaStream_t s)
{
    lock l(G().mu);
    cuhost_stream *st = S(s);
    if (!st || st == G().streams[0])
        return set_err(cudaErrorInvalidResourceHandle);
    run_all(st);
    for (size_t i = 0; i < G().streams.size(); i++)
        if (G().streams[i] == st)
            G().streams.erase(G().streams.begin() + (long)i);
    delete st;
    return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t s)
{
    lock l(G().mu);
    cuhost_stream *st = S(s);
    if (!st)
        return set_err(cudaErrorInvalidResourceHandle);
    run_all(st);
    return cudaSuccess;
}

namespace {
struct ev_job {
    cuhost_event *e;
    uint64_t gen;
};
void ev_run(void *ctx)
{
    ev_job *j = (ev_job *)ctx;
    if (j->e->gen == j->gen) {
        j->e->done = true;
        j->e->t = now_s();
    }
}
void ev_drop(void *ctx)
{
    delete (ev_job *)ctx;
}
void ev_settle(cuhost_event *e)
{
    if (e->recorded && !e->done)
        run_until(e->s, e->seq);
}
struct wait_job {
    cuhost_event *e;
    uint64_t gen;
};
void wait_run(void *ctx)
{
    wait_job *j = (wait_job *)ctx;
    if (j->e->gen == j->gen)
        ev_settle(j->e);
}
void wait_drop(void *ctx)
{
    delete (wait_job *)ctx;
}
} // namespace

cudaError_t cudaEventCreate(cudaEvent_t *e)
{
    return cudaEventCreateWithFlags(e, cudaEventDefault);
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned flags)
{
    *e = new cuhost_event{nullptr, 0, 0, false, false, !(flags & cudaEventDisableTiming), 0.0};
    return cudaSuccess;
}

cudaError_t cudaEventDestroy(cudaEvent_t e)
{
    lock l(G().mu);
    if (!e)
        return set_err(cudaErrorInvalidResourceHandle);
    ev_settle(e); /* its pending record must not outlive it */
    delete e;
    return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s)
{
    lock l(G().mu);
    cuhost_stream *st = S(s);
    if (!e || !st)
        return set_err(cudaErrorInvalidResourceHandle);
    ev_settle(e);
    e->gen++;
    e->s = st;
    e->recorded = true;
    e->done = false;
    e->seq = push(st, ev_run, ev_drop, new ev_job{e, e->gen});
    return cudaSuccess;
}

cudaError_t cudaEventSynchronize(cudaEvent_t e)
{
    lock l(G().mu);
    if (!e)
        return set_err(cudaErrorInvalidResourceHandle);
    ev_settle(e);
    return cudaSuccess;
}

cudaError_t cudaEventQuery(cudaEvent_t e)
{
    lock l(G().mu);
    if (!e)
        return set_err(cudaErrorInvalidResourceHandle);
    if (!e->recorded || e->done)
        return cudaSuccess;
    ev_settle(e); /* progress, but this poll still sees it pending */
    return cudaErrorNotReady;
}

cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t a, cudaEvent_t b)
{
    lock l(G().mu);
    if (!a || !b || !a->timing || !b->timing || !a->done || !b->done)
        return set_err(cudaErrorInvalidResourceHandle);
    *ms = (float)((b->t - a->t) * 1e3);
    return cudaSuccess;
}

cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned flags)
{
    lock l(G().mu);
    cuhost_stream *st = S(s);
    if (!st || !e)
        return set_err(cudaErrorInvalidResourceHandle);
    if (e->recorded && !e->done)
        push(st, wait_run, wait_drop, new wait_job{e, e->gen});
    return cudaSuccess;
}

cudaError_t cuhost_enqueue(cudaStream_t s, cuhost_fn fn, cuhost_fn drop, void *ctx)
{
    lock l(G().mu);
    cuhost_stream *st = S(s);
    if (!st) {
        drop(ctx);
        return set_err(cudaErrorInvalidResourceHandle);
    }
    push(st, fn, drop, ctx);
    return cudaSuccess;
}

/* ---- launches ---- */

cudaError_t cuhost_func_set_smem(const void *fn, int bytes)
{
    lock l(G().mu);
    if (bytes < 0 || (size_t)bytes > CUHOST_SMEM_OPTIN) {
        say("cudaFuncSetAttribute: %d bytes of dynamic shared memory > the opt-in limit %u",
            bytes, CUHOST_SMEM_OPTIN);
        return set_err(cudaErrorInvalidValue);
    }
    G().smem_optin[fn] = bytes;
    return cudaSuccess;
}

cudaError_t cuhost_check_launch(const cuhost_cfg *c)
{
    lock l(G().mu);
    const unsigned long long threads = (unsigned long long)c->block.x * c->block.y * c->block.z;
    const char *why = nullptr;
    char buf[160];
    cudaError_t e = cudaErrorInvalidConfiguration;
    auto it = G().smem_optin.find(c->fn);
    const size_t smem_limit = it != G().smem_optin.end() ? (size_t)it->second : CUHOST_SMEM_DEFAULT;
    if (!S(c->stream)) {
        why = "unknown stream";
        e = cudaErrorInvalidResourceHandle;
    } else if (!c->grid.x || !c->grid.y || !c->grid.z || !threads) {
        why = "a zero grid or block dimension";
    } else if (c->block.x > 1024 || c->block.y > 1024 || c->block.z > 64 ||
               threads > CUHOST_MAX_THREADS) {
        why = "block over 1024 threads (or x, y > 1024, z > 64)";
    } else if (c->grid.x > 0x7fffffffu || c->grid.y > 65535 || c->grid.z > 65535) {
        why = "grid over 2^31-1 x 65535 x 65535";
    } else if (c->smem > smem_limit) {
        snprintf(buf, sizeof buf, "%zu bytes of dynamic shared memory > %zu (%s)", c->smem,
                 smem_limit, it != G().smem_optin.end() ? "the kernel's opt-in"
                                                          : "48 KiB without cudaFuncSetAttribute");
        why = buf;
    } else if (c->bound && threads > c->bound) {
        snprintf(buf, sizeof buf, "%llu threads > __launch_bounds__(%u)", threads, c->bound);
        why = buf;
        e = cudaErrorLaunchOutOfResources;
    }
    if (!why)
        return cudaSuccess;
    say("LAUNCH REFUSED: %s<<<(%u,%u,%u), (%u,%u,%u), %zu>>>: %s", c->name, c->grid.x,
        c->grid.y, c->grid.z, c->block.x, c->block.y, c->block.z, c->smem, why);
    return e;
}

