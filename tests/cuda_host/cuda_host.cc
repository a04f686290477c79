/* cuda_host.cc - the host shim's runtime (see cuda_runtime.h for the model):
 * device memory, lazy streams and events, kernel launches as blocks of
 * fibers with exact barrier and warp semantics, a reference cuBLAS GEMM
 * and a one-rank NCCL.  x86-64 only (the context switch is hand-written).
 *
 * Every entry point takes one process-wide lock: the backend may be used
 * from an engine thread, and stream work runs on whichever thread forces
 * it.  Faults a device would report asynchronously or by hanging (a
 * barrier that can never complete, a shuffle with an exited lane) are
 * printed and abort the process.
 */
#include "cublas_v2.h"
#include "cuda_runtime.h"
#include "nccl.h"

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

#if !defined(__x86_64__)
#error "the CUDA host shim's fibers are written for x86-64"
#endif

thread_local cuhost_thread *cuhost_cur;

namespace {

[[noreturn]] void die(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void die(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("cuda-host: FATAL: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    abort();
}

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
            die("mprotect failed");
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
            die("out of host memory staging %zu bytes", bytes);
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

/* ---- fibers ---- */

extern "C" void cuhost_swap(void **save_sp, void *load_sp);
extern "C" void cuhost_fiber_start(void);
asm(R"(
    .text
    .p2align 4
    .type cuhost_swap,@function
cuhost_swap:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    subq $8, %rsp
    stmxcsr (%rsp)
    fnstcw 4(%rsp)
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    ldmxcsr (%rsp)
    fldcw 4(%rsp)
    addq $8, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size cuhost_swap,.-cuhost_swap
    .p2align 4
    .type cuhost_fiber_start,@function
cuhost_fiber_start:
    movq %rbx, %rdi
    callq *%r12
    ud2
    .size cuhost_fiber_start,.-cuhost_fiber_start
)");

namespace {

const size_t k_stack = (size_t)256 << 10;

enum fstate { F_READY, F_BAR, F_WARP, F_DONE };

struct fiber {
    cuhost_thread t;
    void *sp;
    char *stack; /* k_stack bytes above a guard page */
    fstate st;
    void *fake;
};

struct warp_state {
    int kind;
    unsigned mask, arrived, exists;
    uint64_t val[32], res[32];
    int src[32];
};

struct sched {
    void *sp = nullptr;
    const void *stack_bottom = nullptr;
    size_t stack_size = 0;
    void *fake = nullptr;
    std::vector<char *> stacks;
    std::vector<fiber> f;
    std::vector<warp_state> w;
    fiber *cur = nullptr;
    int n = 0, live = 0, at_bar = 0;
    void (*body)(void *) = nullptr;
    void *ctx = nullptr;
    const cuhost_cfg *cfg = nullptr;
    cuhost_block blk;
};

thread_local sched T; /* the scheduler of the thread that runs stream work */

sched &me()
{
    return T;
}

char *stack_of(sched &s, int i)
{
    while ((int)s.stacks.size() <= i) {
        void *m = mmap(nullptr, k_stack + k_page, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (m == MAP_FAILED)
            die("cannot map a fiber stack");
        mprotect(m, k_page, PROT_NONE); /* a stack overflow faults */
        s.stacks.push_back((char *)m + k_page);
    }
    return s.stacks[(size_t)i];
}

void to_sched(fiber *f, bool exiting)
{
    sched &s = me();
#if CH_ASAN
    __sanitizer_start_switch_fiber(exiting ? nullptr : &f->fake, s.stack_bottom, s.stack_size);
#endif
    cuhost_swap(&f->sp, s.sp);
#if CH_ASAN
    __sanitizer_finish_switch_fiber(f->fake, nullptr, nullptr);
#endif
}

void resume(sched &s, fiber *f)
{
    s.cur = f;
    cuhost_cur = &f->t;
#if CH_ASAN
    __sanitizer_start_switch_fiber(&s.fake, f->stack, k_stack);
#endif
    cuhost_swap(&s.sp, f->sp);
#if CH_ASAN
    __sanitizer_finish_switch_fiber(s.fake, nullptr, nullptr);
#endif
    cuhost_cur = nullptr;
    s.cur = nullptr;
}

const char *kname()
{
    return me().cfg ? me().cfg->name : "?";
}

void release_bar(sched &s)
{
    if (s.at_bar == 0 || s.at_bar != s.live)
        return;
    for (fiber &f : s.f)
        if (f.st == F_BAR)
            f.st = F_READY;
    s.at_bar = 0;
}

void fiber_main(fiber *f)
{
    sched &s = me();
#if CH_ASAN
    __sanitizer_finish_switch_fiber(nullptr, &s.stack_bottom, &s.stack_size);
#endif
    s.body(s.ctx);
    f->st = F_DONE;
    s.live--;
    warp_state &w = s.w[(size_t)f->t.warp];
    if (w.arrived && (w.mask >> f->t.lane & 1))
        die("%s: thread %u of block (%u,%u,%u) exited while lanes of its warp wait for it in a "
            "warp operation (mask %#x)", kname(), f->t.tid.x, s.blk.bid.x, s.blk.bid.y,
            s.blk.bid.z, w.mask);
    release_bar(s);
    to_sched(f, true);
    die("a finished fiber was resumed");
}

void report_deadlock(sched &s)
{
    fprintf(stderr, "cuda-host: FATAL: %s block (%u,%u,%u): no thread can run (a deadlock the "
            "device would hang on)\n", kname(), s.blk.bid.x, s.blk.bid.y, s.blk.bid.z);
    for (int pass = 0; pass < 2; pass++) { /* warp waits first: they are the rarer */
        int shown = 0;
        for (fiber &f : s.f) {
            if (f.st != (pass ? F_BAR : F_WARP) || shown++ >= 8)
                continue;
            fprintf(stderr, "  thread %u (warp %d lane %d): waiting at %s\n", f.t.tid.x,
                    f.t.warp, f.t.lane, pass ? "__syncthreads" : "a warp operation");
        }
    }
    fprintf(stderr, "  %d live threads, %d at __syncthreads\n", s.live, s.at_bar);
    abort();
}

void run_block(sched &s, uint3 bid, bool reverse)
{
    const uint3 bd = s.blk.bdim;
    s.blk.bid = bid;
    if (s.cfg->smem)
        memset(s.blk.dyn_smem, 0xFF, s.cfg->smem); /* NaN: a read before a write shows */
    for (int i = 0; i < s.n; i++) {
        fiber &f = s.f[(size_t)i];
        f.t.tid = uint3{(unsigned)i % bd.x, (unsigned)i / bd.x % bd.y, (unsigned)i / (bd.x * bd.y)};
        f.t.lane = i & 31;
        f.t.warp = i >> 5;
        f.t.blk = &s.blk;
        f.st = F_READY;
        f.fake = nullptr;
        f.stack = stack_of(s, i);
#if CH_ASAN
        __asan_unpoison_memory_region(f.stack, k_stack);
#endif
        uint64_t *top = (uint64_t *)(f.stack + k_stack) - 8;
        top[0] = 0x1F80ull | (0x037Full << 32); /* mxcsr, x87 control word */
        top[1] = top[2] = top[3] = 0;             /* r15 r14 r13 */
        top[4] = (uint64_t)(uintptr_t)&fiber_main; /* r12: the entry */
        top[5] = (uint64_t)(uintptr_t)&f;         /* rbx: its argument */
        top[6] = 0;                               /* rbp: end of the frame chain */
        top[7] = (uint64_t)(uintptr_t)&cuhost_fiber_start;
        f.sp = top;
    }
    for (size_t i = 0; i < s.w.size(); i++) {
        warp_state &w = s.w[i];
        w.arrived = 0;
        const int lanes = s.n - (int)i * 32;
        w.exists = lanes >= 32 ? 0xffffffffu : (1u << lanes) - 1;
    }
    s.live = s.n;
    s.at_bar = 0;
    while (s.live > 0) {
        bool progress = false;
        for (int k = 0; k < s.n; k++) {
            fiber &f = s.f[(size_t)(reverse ? s.n - 1 - k : k)];
            if (f.st == F_READY) {
                resume(s, &f);
                progress = true;
            }
        }
        if (!progress)
            report_deadlock(s);
    }
}

} // namespace

void cuhost_run_grid(const cuhost_cfg *c, void (*body)(void *), void *ctx)
{
    sched &s = me();
    if (s.cfg)
        die("a kernel launched from inside a kernel (%s in %s)", c->name, s.cfg->name);
    s.cfg = c;
    s.body = body;
    s.ctx = ctx;
    s.n = (int)(c->block.x * c->block.y * c->block.z);
    s.f.assign((size_t)s.n, fiber{});
    s.w.assign((size_t)(s.n + 31) / 32, warp_state{});
    s.blk.bdim = uint3{c->block.x, c->block.y, c->block.z};
    s.blk.gdim = uint3{c->grid.x, c->grid.y, c->grid.z};
    s.blk.dyn_smem = c->smem ? malloc(c->smem) : nullptr; /* exact size: ASan sees overruns */
    uint64_t lin = 0;
    for (unsigned z = 0; z < c->grid.z; z++)
        for (unsigned y = 0; y < c->grid.y; y++)
            for (unsigned x = 0; x < c->grid.x; x++, lin++)
                run_block(s, uint3{x, y, z}, lin & 1); /* odd blocks run their threads backwards */
    free(s.blk.dyn_smem);
    s.blk.dyn_smem = nullptr;
    s.cfg = nullptr;
}

void __syncthreads(void)
{
    sched &s = me();
    fiber *f = s.cur;
    if (!f)
        die("__syncthreads outside a kernel");
    f->st = F_BAR;
    s.at_bar++;
    release_bar(s);
    if (f->st == F_BAR)
        to_sched(f, false);
}

uint64_t cuhost_warp_op(int kind, unsigned mask, uint64_t val, int src)
{
    sched &s = me();
    fiber *f = s.cur;
    if (!f)
        die("a warp operation outside a kernel");
    warp_state &w = s.w[(size_t)f->t.warp];
    const int lane = f->t.lane;
    const char *kn = kind == CUHOST_W_SYNC ? "__syncwarp" : kind == CUHOST_W_SHFL ? "a shuffle"
                                                                                  : "a ballot";
    if (!(mask >> lane & 1))
        die("%s: lane %d of warp %d calls %s with mask %#x, which leaves it out", kname(), lane,
            f->t.warp, kn, mask);
    if (mask & ~w.exists)
        die("%s: %s with mask %#x names lanes the block does not have (block of %d threads)",
            kname(), kn, mask, s.n);
    for (int l = 0; l < 32; l++)
        if ((mask >> l & 1) && s.f[(size_t)(f->t.warp * 32 + l)].st == F_DONE)
            die("%s: %s with mask %#x in warp %d, but lane %d has exited", kname(), kn, mask,
                f->t.warp, l);
    if (w.arrived == 0) {
        w.kind = kind;
        w.mask = mask;
    } else if (w.kind != kind || w.mask != mask) {
        die("%s: warp %d: lane %d is at %s (mask %#x) while other lanes wait at another warp "
            "operation (kind %d, mask %#x)", kname(), f->t.warp, lane, kn, mask, w.kind, w.mask);
    }
    if (kind == CUHOST_W_SHFL && !(mask >> src & 1))
        die("%s: lane %d shuffles from lane %d, outside the mask %#x", kname(), lane, src, mask);
    w.val[lane] = val;
    w.src[lane] = src;
    w.arrived |= 1u << lane;
    if (w.arrived == mask) {
        uint64_t ballot = 0;
        for (int l = 0; l < 32; l++)
            if ((mask >> l & 1) && w.val[l])
                ballot |= 1ull << l;
        for (int l = 0; l < 32; l++) {
            if (!(mask >> l & 1))
                continue;
            w.res[l] = kind == CUHOST_W_BALLOT ? ballot
                       : kind == CUHOST_W_SHFL ? w.val[w.src[l]]
                                               : 0;
            fiber &o = s.f[(size_t)(f->t.warp * 32 + l)];
            if (o.st == F_WARP)
                o.st = F_READY;
        }
        w.arrived = 0;
    } else {
        f->st = F_WARP;
        to_sched(f, false);
    }
    return w.res[lane];
}

/* ---- cuBLAS: a reference GEMM (f32 operands, double accumulation) ---- */

struct cuhost_blas {
    cudaStream_t s;
};

namespace {
struct gemm_job {
    cublasOperation_t ta, tb;
    int m, n, k, lda, ldb, ldc;
    float alpha, beta;
    const float *A, *B;
    float *C;
};
void gemm_run(void *ctx)
{
    const gemm_job *g = (const gemm_job *)ctx;
    for (int j = 0; j < g->n; j++)
        for (int i = 0; i < g->m; i++) {
            double acc = 0.0;
            for (int l = 0; l < g->k; l++) {
                const float a = g->ta == CUBLAS_OP_N ? g->A[i + (int64_t)l * g->lda]
                                                     : g->A[l + (int64_t)i * g->lda];
                const float b = g->tb == CUBLAS_OP_N ? g->B[l + (int64_t)j * g->ldb]
                                                     : g->B[j + (int64_t)l * g->ldb];
                acc += (double)a * b;
            }
            float *c = &g->C[i + (int64_t)j * g->ldc];
            const double prev = g->beta != 0.0f ? (double)g->beta * *c : 0.0; /* beta 0: C unread */
            *c = (float)(g->alpha * acc + prev);
        }
}
void gemm_drop(void *ctx)
{
    delete (gemm_job *)ctx;
}
} // namespace

cublasStatus_t cublasCreate(cublasHandle_t *h)
{
    *h = new cuhost_blas{nullptr};
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasDestroy(cublasHandle_t h)
{
    delete h;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetStream(cublasHandle_t h, cudaStream_t s)
{
    if (!h)
        return CUBLAS_STATUS_NOT_INITIALIZED;
    h->s = s;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGemmEx(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m,
                            int n, int k, const void *alpha, const void *A, cudaDataType_t at,
                            int lda, const void *B, cudaDataType_t bt, int ldb, const void *beta,
                            void *C, cudaDataType_t ct, int ldc, cublasComputeType_t compute,
                            cublasGemmAlgo_t algo)
{
    lock l(G().mu);
    if (!h)
        return CUBLAS_STATUS_NOT_INITIALIZED;
    if (at != CUDA_R_32F || bt != CUDA_R_32F || ct != CUDA_R_32F || compute != CUBLAS_COMPUTE_32F ||
        ta == CUBLAS_OP_C || tb == CUBLAS_OP_C) {
        say("cublasGemmEx: only f32 operands with CUBLAS_COMPUTE_32F, N or T, are shimmed");
        return CUBLAS_STATUS_NOT_SUPPORTED;
    }
    const int64_t ra = ta == CUBLAS_OP_N ? m : k, rb = tb == CUBLAS_OP_N ? k : n;
    const int64_t ca = ta == CUBLAS_OP_N ? k : m, cb = tb == CUBLAS_OP_N ? n : k;
    if (m < 0 || n < 0 || k < 0 || lda < (ra > 1 ? ra : 1) || ldb < (rb > 1 ? rb : 1) ||
        ldc < (m > 1 ? m : 1))
        return CUBLAS_STATUS_INVALID_VALUE;
    if (m == 0 || n == 0)
        return CUBLAS_STATUS_SUCCESS;
    const size_t fa = (size_t)((ca - 1) * lda + ra) * 4, fb = (size_t)((cb - 1) * ldb + rb) * 4;
    const size_t fc = (size_t)(((int64_t)n - 1) * ldc + m) * 4;
    if ((k > 0 && (!find_dev(A, fa) || !find_dev(B, fb))) || !find_dev(C, fc)) {
        say("cublasGemmEx: an operand is not inside one device allocation");
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    gemm_job *g = new gemm_job{ta, tb, m, n, k, lda, ldb, ldc, *(const float *)alpha,
                               *(const float *)beta, (const float *)A, (const float *)B,
                               (float *)C};
    if (cuhost_enqueue(h->s, gemm_run, gemm_drop, g) != cudaSuccess)
        return CUBLAS_STATUS_INVALID_VALUE;
    return CUBLAS_STATUS_SUCCESS;
}

/* ---- NCCL, one rank ---- */

struct cuhost_nccl {
    int n;
};

const char *ncclGetErrorString(ncclResult_t r)
{
    switch (r) {
    case ncclSuccess: return "no error";
    case ncclInvalidUsage: return "invalid usage (the host shim has one rank only)";
    case ncclInvalidArgument: return "invalid argument";
    case ncclInProgress: return "operation in progress";
    default: return "NCCL error";
    }
}

ncclResult_t ncclGetUniqueId(ncclUniqueId *u)
{
    memset(u, 0, sizeof *u);
    memcpy(u->internal, "cuda-host", 9);
    return ncclSuccess;
}

ncclResult_t ncclCommInitRankConfig(ncclComm_t *c, int n, ncclUniqueId u, int rank,
                                    ncclConfig_t *cfg)
{
    *c = nullptr;
    if (n != 1 || rank != 0) {
        say("NCCL: a communicator of %d ranks: the host shim runs one rank only", n);
        return ncclInvalidUsage;
    }
    *c = new cuhost_nccl{n};
    return ncclSuccess;
}

ncclResult_t ncclCommInitRank(ncclComm_t *c, int n, ncclUniqueId u, int rank)
{
    return ncclCommInitRankConfig(c, n, u, rank, nullptr);
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t c, ncclResult_t *r)
{
    *r = ncclSuccess;
    return c ? ncclSuccess : ncclInvalidArgument;
}

ncclResult_t ncclCommFinalize(ncclComm_t c)
{
    return c ? ncclSuccess : ncclInvalidArgument;
}

ncclResult_t ncclCommDestroy(ncclComm_t c)
{
    delete c;
    return ncclSuccess;
}

ncclResult_t ncclCommAbort(ncclComm_t c)
{
    delete c;
    return ncclSuccess;
}

ncclResult_t ncclGroupStart(void)
{
    return ncclSuccess;
}

ncclResult_t ncclGroupEnd(void)
{
    return ncclSuccess;
}

ncclResult_t ncclSend(const void *, size_t, ncclDataType_t, int peer, ncclComm_t, cudaStream_t)
{
    say("ncclSend to rank %d: the host shim has one rank", peer);
    return ncclInvalidUsage;
}

ncclResult_t ncclRecv(void *, size_t, ncclDataType_t, int peer, ncclComm_t, cudaStream_t)
{
    say("ncclRecv from rank %d: the host shim has one rank", peer);
    return ncclInvalidUsage;
}

ncclResult_t ncclAllGather(const void *send, void *recv, size_t count, ncclDataType_t t,
                           ncclComm_t c, cudaStream_t s)
{
    if (!c || t != ncclFloat)
        return ncclInvalidArgument;
    return cudaMemcpyAsync(recv, send, count * 4, cudaMemcpyDeviceToDevice, s) == cudaSuccess
               ? ncclSuccess
               : ncclUnhandledCudaError;
}
