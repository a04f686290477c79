/* cuda_host_fiber.cc - the host shim's kernel execution (see
 * cuda_runtime.h): every block of a launch in turn, each CUDA thread a fiber
 * with its own stack and a hand-written x86-64 context switch (announced to
 * ASan), __syncthreads and the warp operations as exact barriers.  Called
 * by cuda_host.cc with the shim's lock held, on the thread that runs the
 * stream's work.  Faults a device would hang on abort with the kernel's
 * name. */
#include "cuda_runtime.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>

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

/* Reports a fault of the emulated device and aborts (the shim's one exit
 * on a broken kernel or launch). */
void cuhost_die(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("cuda-host: FATAL: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    abort();
}

namespace {

const size_t k_page = 4096;

} // namespace

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
            cuhost_die("cannot map a fiber stack");
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
        cuhost_die("%s: thread %u of block (%u,%u,%u) exited while lanes of its warp wait for it in a "
            "warp operation (mask %#x)", kname(), f->t.tid.x, s.blk.bid.x, s.blk.bid.y,
            s.blk.bid.z, w.mask);
    release_bar(s);
    to_sched(f, true);
    cuhost_die("a finished fiber was resumed");
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
        cuhost_die("a kernel launched from inside a kernel (%s in %s)", c->name, s.cfg->name);
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
        cuhost_die("__syncthreads outside a kernel");
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
        cuhost_die("a warp operation outside a kernel");
    warp_state &w = s.w[(size_t)f->t.warp];
    const int lane = f->t.lane;
    const char *kn = kind == CUHOST_W_SYNC ? "__syncwarp" : kind == CUHOST_W_SHFL ? "a shuffle"
                                                                                  : "a ballot";
    if (!(mask >> lane & 1))
        cuhost_die("%s: lane %d of warp %d calls %s with mask %#x, which leaves it out", kname(), lane,
            f->t.warp, kn, mask);
    if (mask & ~w.exists)
        cuhost_die("%s: %s with mask %#x names lanes the block does not have (block of %d threads)",
            kname(), kn, mask, s.n);
    for (int l = 0; l < 32; l++)
        if ((mask >> l & 1) && s.f[(size_t)(f->t.warp * 32 + l)].st == F_DONE)
            cuhost_die("%s: %s with mask %#x in warp %d, but lane %d has exited", kname(), kn, mask,
                f->t.warp, l);
    if (w.arrived == 0) {
        w.kind = kind;
        w.mask = mask;
    } else if (w.kind != kind || w.mask != mask) {
        cuhost_die("%s: warp %d: lane %d is at %s (mask %#x) while other lanes wait at another warp "
            "operation (kind %d, mask %#x)", kname(), f->t.warp, lane, kn, mask, w.kind, w.mask);
    }
    if (kind == CUHOST_W_SHFL && !(mask >> src & 1))
        cuhost_die("%s: lane %d shuffles from lane %d, outside the mask %#x", kname(), lane, src, mask);
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

