/* server_stream.c - per-request event channel and stop-string hold-back.
 *
 * Invariants: events are delivered in the order the engine emitted them;
 * after the final event nothing else is pushed; the channel is freed when
 * both references are dropped.  Metrics observed here use timestamps taken
 * on the engine thread inside the callback.
 */
#include "server/server_stream.h"

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <pthread.h>
#include <sys/eventfd.h>
#include <unistd.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

double srv_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

int srv_buf_append(srv_buf *b, const char *s, size_t n)
{
    if (b->len + n + 1 > b->cap) {
        size_t cap = (b->len + n + 1) * 2 + 64;
        char *ns = realloc(b->s, cap);
        if (!ns)
            return KV_ENOMEM;
        b->s = ns;
        b->cap = cap;
    }
    if (n)
        memcpy(b->s + b->len, s, n);
    b->len += n;
    b->s[b->len] = '\0';
    return KV_OK;
}

void srv_buf_free(srv_buf *b)
{
    free(b->s);
    memset(b, 0, sizeof *b);
}

/* One engine request feeding the channel (ctx of its callback). */
typedef struct chan_src {
    struct srv_chan *c;
    int k;
    int final;               /* its final event pushed (c->mu) */
    engine *e;               /* backlog bound: whom to cancel (srv_chan_set_backlog) */
    int64_t rid;
    /* engine-thread-only timing state */
    double t_first;
    double t_last[ENGINE_MAX_N];
} chan_src;

struct srv_chan {
    pthread_mutex_t mu;
    int efd;                 /* eventfd: written on every push, so the HTTP thread
                              * can poll it together with its client socket */
    srv_ev *q;               /* [cap] ring of pending events */
    size_t head, count, cap;
    size_t n_prompt_ev;      /* of count, ENGINE_EV_PROMPT events (not a backlog) */
    int refs;
    int n_src, n_final;      /* sources; those whose final event was pushed */
    chan_src *src;           /* [n_src] */
    int oom;                 /* an event could not be queued (past cap) */
    srv_metrics *metrics;
    size_t max_pending;      /* backlog bound; 0 = unbounded */
    int overflowed;          /* the requests were cancelled for their backlog */
    srv_guard *guard;
    double t_arrival, t_submit;
};

srv_chan *srv_chan_create(srv_metrics *metrics, double t_arrival, int n_src, size_t cap)
{
    srv_chan *c = calloc(1, sizeof *c);
    if (!c)
        return NULL;
    c->cap = cap > 0 ? cap : 1;
    c->q = malloc(c->cap * sizeof *c->q);
    c->src = calloc((size_t)(n_src > 0 ? n_src : 1), sizeof *c->src);
    c->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (!c->q || !c->src || c->efd < 0) {
        if (c->efd >= 0)
            close(c->efd);
        free(c->q);
        free(c->src);
        free(c);
        return NULL;
    }
    pthread_mutex_init(&c->mu, NULL);
    c->n_src = n_src > 0 ? n_src : 1;
    for (int k = 0; k < c->n_src; k++) {
        c->src[k].c = c;
        c->src[k].k = k;
    }
    c->refs = c->n_src + 1;
    c->metrics = metrics;
    c->t_arrival = c->t_submit = t_arrival;
    return c;
}

void *srv_chan_src(srv_chan *c, int k)
{
    return &c->src[k];
}

static void chan_unref_locked_free(srv_chan *c)
{
    int left = --c->refs;
    pthread_mutex_unlock(&c->mu);
    if (left == 0) {
        pthread_mutex_destroy(&c->mu);
        close(c->efd);
        free(c->q);
        free(c->src);
        free(c);
    }
}

void srv_chan_unref(srv_chan *c)
{
    if (!c)
        return;
    pthread_mutex_lock(&c->mu);
    chan_unref_locked_free(c);
}

void srv_chan_unref_engine(srv_chan *c, int k)
{
    if (!c)
        return;
    pthread_mutex_lock(&c->mu);
    if (!c->src[k].final) {
        c->src[k].final = 1;
        c->n_final++;
    }
    chan_unref_locked_free(c);
}

void srv_chan_set_backlog(srv_chan *c, int k, engine *e, int64_t rid, int max_pending,
                          srv_guard *guard)
{
    pthread_mutex_lock(&c->mu);
    c->src[k].e = e;
    c->src[k].rid = rid;
    c->max_pending = max_pending > 0 ? (size_t)max_pending : 0;
    c->guard = guard;
    pthread_mutex_unlock(&c->mu);
}

void srv_chan_submitted(srv_chan *c, double t_submit)
{
    c->t_submit = t_submit;
}

/* The eventfd's counter cannot overflow (one post per event, cleared by
 * every wait), so neither call can fail in a way that matters. */
static void efd_post(int fd)
{
    uint64_t one = 1;
    ssize_t r = write(fd, &one, sizeof one);
    (void)r;
}

static void efd_clear(int fd)
{
    uint64_t v;
    ssize_t r = read(fd, &v, sizeof v); /* EAGAIN when nothing was posted */
    (void)r;
}

static void observe(srv_chan *c, chan_src *c1, const engine_event *ev, double now)
{
    srv_metrics *m = c->metrics;
    if (ev->type == ENGINE_EV_TOKEN) {
        if (c1->t_first == 0) {
            c1->t_first = now;
            srv_metrics_observe(m, SRV_H_TTFT, now - c->t_arrival);
            srv_metrics_observe(m, SRV_H_QUEUE, now - c->t_submit);
        }
        if (ev->index >= 0 && ev->index < ENGINE_MAX_N) {
            if (c1->t_last[ev->index] > 0)
                srv_metrics_observe(m, SRV_H_ITL, now - c1->t_last[ev->index]);
            c1->t_last[ev->index] = now;
        }
        if (ev->grammar_seconds > 0)
            srv_metrics_observe(m, SRV_H_GRAMMAR_MASK, ev->grammar_seconds);
    } else if (ev->type == ENGINE_EV_FINISH && ev->grammar_seconds > 0) {
        srv_metrics_observe(m, SRV_H_GRAMMAR_MASK, ev->grammar_seconds);
    } else if (ev->type == ENGINE_EV_DONE || ev->type == ENGINE_EV_ERROR) {
        srv_metrics_observe(m, SRV_H_E2E, now - c->t_arrival);
        if (ev->type == ENGINE_EV_DONE) {
            srv_metrics_observe(m, SRV_H_PROMPT, (double)ev->prompt_tokens);
            srv_metrics_observe(m, SRV_H_GEN, (double)ev->completion_tokens);
        }
    }
}

void srv_chan_on_event(void *ctx, const engine_event *ev)
{
    chan_src *c1 = ctx;
    srv_chan *c = c1->c;
    double now = srv_now();
    int final = ev->type == ENGINE_EV_DONE || ev->type == ENGINE_EV_ERROR;
    pthread_mutex_lock(&c->mu);
    if (c1->final) { /* defensive: nothing after the final event */
        pthread_mutex_unlock(&c->mu);
        return;
    }
    observe(c, c1, ev, now);
    /* prompt logprobs come in a burst bounded by the prompt: not a backlog */
    if (!final && ev->type != ENGINE_EV_PROMPT && c->max_pending &&
        c->count - c->n_prompt_ev >= c->max_pending) {
        if (!c->overflowed) { /* the client stopped reading: stop the work */
            c->overflowed = 1;
            for (int k = 0; k < c->n_src; k++)
                if (c->src[k].e && !c->src[k].final)
                    engine_cancel(c->src[k].e, c->src[k].rid);
            srv_guard_count(c->guard, SRV_GUARD_STREAM_BACKLOG);
        }
        pthread_mutex_unlock(&c->mu);
        return;
    }
    if (c->count < c->cap) { /* sized once at create: no allocation here */
        srv_ev *e = &c->q[(c->head + c->count) % c->cap];
        e->ev = *ev;
        e->src = c1->k;
        c->n_prompt_ev += ev->type == ENGINE_EV_PROMPT;
        e->err[0] = '\0';
        if (final && c->overflowed) { /* events were dropped: never a clean end */
            e->ev.type = ENGINE_EV_ERROR;
            e->ev.finish = ENGINE_FINISH_ABORT;
            snprintf(e->err, sizeof e->err, "stream cancelled: the client fell more than %zu "
                     "events behind (--stream-backlog)", c->max_pending);
        } else if (ev->error) {
            strncpy(e->err, ev->error, sizeof e->err - 1);
            e->err[sizeof e->err - 1] = '\0';
        }
        e->ev.error = NULL;
        c->count++;
    } else {
        c->oom = 1; /* the reader reports an internal error */
    }
    efd_post(c->efd);
    if (final) {
        c1->final = 1;
        c->n_final++;
        chan_unref_locked_free(c);
        return;
    }
    pthread_mutex_unlock(&c->mu);
}

/* Pops the next event, if any (1), else 0. */
static int chan_pop(srv_chan *c, srv_ev *out)
{
    pthread_mutex_lock(&c->mu);
    int got = 0;
    if (c->count > 0) {
        *out = c->q[c->head];
        c->head = (c->head + 1) % c->cap;
        c->count--;
        if (c->count == 0)
            c->head = 0; /* back to the first slots: their pages stay the only ones used */
        c->n_prompt_ev -= out->ev.type == ENGINE_EV_PROMPT;
        got = 1;
    } else if (c->oom) {
        memset(out, 0, sizeof *out);
        out->ev.type = ENGINE_EV_ERROR;
        strcpy(out->err, "internal error: the request's event queue is full");
        c->oom = 0;
        got = 1;
    }
    pthread_mutex_unlock(&c->mu);
    if (got && out->err[0])
        out->ev.error = out->err;
    return got;
}

/* The eventfd is cleared before the queue is looked at, so an event pushed
 * after the look leaves it readable and the poll returns at once. */
int srv_chan_wait(srv_chan *c, srv_ev *out, int timeout_ms, int peer_fd)
{
    double deadline = srv_now() + timeout_ms * 1e-3;
    for (;;) {
        efd_clear(c->efd);
        if (chan_pop(c, out))
            return 1;
        struct pollfd p[2] = {{.fd = c->efd, .events = POLLIN},
                              {.fd = peer_fd, .events = POLLRDHUP}};
        int left = (int)((deadline - srv_now()) * 1e3 + 0.999);
        if (left <= 0)
            return 0;
        int n = poll(p, peer_fd >= 0 ? 2 : 1, left);
        if (n < 0 && errno != EINTR)
            return 0;
        if (n > 0 && peer_fd >= 0 && (p[1].revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)))
            return chan_pop(c, out) ? 1 : -1;
    }
}

int srv_chan_engine_done(srv_chan *c)
{
    pthread_mutex_lock(&c->mu);
    int f = c->n_final == c->n_src;
    pthread_mutex_unlock(&c->mu);
    return f;
}

/* Length of the longest suffix of s[0..n) that is a proper prefix of some
 * stop string. */
static size_t hold_len(const srv_stops *st, const char *s, size_t n)
{
    size_t best = 0;
    for (int i = 0; i < st->n; i++) {
        size_t L = st->len[i];
        size_t k = L - 1 < n ? L - 1 : n;
        for (; k > best; k--)
            if (!memcmp(s + n - k, st->s[i], k)) {
                best = k;
                break;
            }
    }
    return best;
}

int srv_stops_feed(const srv_stops *st, srv_buf *held, const char *piece, size_t n,
                   srv_buf *emit)
{
    if (srv_buf_append(held, piece, n))
        return KV_ENOMEM;
    if (st->n == 0) {
        int rc = srv_buf_append(emit, held->s, held->len);
        held->len = 0;
        return rc;
    }
    /* earliest stop occurrence (memmem over the held text) */
    size_t first = (size_t)-1;
    for (int i = 0; i < st->n; i++) {
        char *p = memmem(held->s, held->len, st->s[i], st->len[i]);
        if (p && (size_t)(p - held->s) < first)
            first = (size_t)(p - held->s);
    }
    if (first != (size_t)-1) {
        int rc = srv_buf_append(emit, held->s, first);
        held->len = 0;
        return rc ? rc : 1;
    }
    size_t keep = hold_len(st, held->s, held->len);
    size_t out = held->len - keep;
    if (srv_buf_append(emit, held->s, out))
        return KV_ENOMEM;
    memmove(held->s, held->s + out, keep);
    held->len = keep;
    held->s[keep] = '\0';
    return 0;
}
