/* server_guard.c - connection limits, request-receive deadlines and the
 * counters of every limit (see server_guard.h).
 *
 * Invariants: a slot's fd is shut down only under the guard's mutex and
 * only while the slot is in use; MHD reports a connection closed
 * (srv_guard_close) before it closes the socket, so the guard never touches
 * an fd number that was reused.  A slot is shut down at most once
 * (`shut`), so one slow connection counts once.
 */
#include "server/server_guard.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <time.h>

#define GUARD_TICK_MS 100 /* reaper period */

struct srv_guard_slot {
    int used;
    int fd;
    int shut;               /* shutdown(2) done */
    int over;               /* past max_connections: answered 503 (not served, never evicted) */
    srv_conn_phase phase;
    double since;           /* when the phase began (monotonic s) */
};

struct srv_guard {
    srv_guard_config cfg;
    pthread_mutex_t mu;
    pthread_cond_t cv;      /* wakes the reaper to stop */
    pthread_t reaper;
    int reaper_started, stop;
    srv_guard_slot *slots;  /* [n_slots] */
    int n_slots, n_open;
    uint64_t count[SRV_GUARD_N];
};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Caller holds g->mu. */
static void shut_locked(srv_guard *g, srv_guard_slot *sl, srv_guard_event why)
{
    if (sl->shut)
        return;
    sl->shut = 1;
    shutdown(sl->fd, SHUT_RDWR);
    g->count[why]++;
}

static double deadline_of(const srv_guard *g, const srv_guard_slot *sl)
{
    if (sl->phase == SRV_CONN_HEADERS)
        return sl->since + g->cfg.header_timeout_s;
    if (sl->phase == SRV_CONN_BODY)
        return sl->since + g->cfg.body_timeout_s;
    return 0;
}

static void unjam_locked(srv_guard *g);

static void *reaper_main(void *arg)
{
    srv_guard *g = arg;
    pthread_mutex_lock(&g->mu);
    while (!g->stop) {
        double t = now_s();
        for (int i = 0; i < g->n_slots; i++) {
            srv_guard_slot *sl = &g->slots[i];
            if (!sl->used || sl->shut || sl->phase == SRV_CONN_BUSY || t < deadline_of(g, sl))
                continue;
            shut_locked(g, sl, sl->phase == SRV_CONN_HEADERS ? SRV_GUARD_HEADER_TIMEOUT
                                                             : SRV_GUARD_BODY_TIMEOUT);
        }
        unjam_locked(g);
        struct timespec dl;
        clock_gettime(CLOCK_MONOTONIC, &dl);
        dl.tv_nsec += GUARD_TICK_MS * 1000000L;
        if (dl.tv_nsec >= 1000000000L) {
            dl.tv_sec++;
            dl.tv_nsec -= 1000000000L;
        }
        pthread_cond_timedwait(&g->cv, &g->mu, &dl);
    }
    pthread_mutex_unlock(&g->mu);
    return NULL;
}

srv_guard *srv_guard_create(const srv_guard_config *cfg)
{
    srv_guard *g = calloc(1, sizeof *g);
    if (!g)
        return NULL;
    g->cfg = *cfg;
    g->n_slots = srv_guard_slots(cfg->max_connections);
    g->slots = calloc((size_t)g->n_slots, sizeof *g->slots);
    pthread_mutex_init(&g->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&g->cv, &ca);
    pthread_condattr_destroy(&ca);
    if (!g->slots || pthread_create(&g->reaper, NULL, reaper_main, g)) {
        srv_guard_destroy(g);
        return NULL;
    }
    g->reaper_started = 1;
    return g;
}

void srv_guard_destroy(srv_guard *g)
{
    if (!g)
        return;
    pthread_mutex_lock(&g->mu);
    g->stop = 1;
    pthread_cond_broadcast(&g->cv);
    pthread_mutex_unlock(&g->mu);
    if (g->reaper_started)
        pthread_join(g->reaper, NULL);
    pthread_mutex_destroy(&g->mu);
    pthread_cond_destroy(&g->cv);
    free(g->slots);
    free(g);
}

void srv_guard_count(srv_guard *g, srv_guard_event ev)
{
    if (!g || ev < 0 || ev >= SRV_GUARD_N)
        return;
    pthread_mutex_lock(&g->mu);
    g->count[ev]++;
    pthread_mutex_unlock(&g->mu);
}

uint64_t srv_guard_get(srv_guard *g, srv_guard_event ev)
{
    pthread_mutex_lock(&g->mu);
    uint64_t v = g->count[ev];
    pthread_mutex_unlock(&g->mu);
    return v;
}

/* 1 when the client has sent bytes that no one has read yet (a request on
 * its way: closing now would lose it). */
static int has_unread(int fd)
{
    int n = 0;
    return ioctl(fd, FIONREAD, &n) == 0 && n > 0;
}

/* Caller holds g->mu.  Whether sl may be closed to admit a new connection:
 * waiting for its request (headers or body incomplete) for at least
 * SRV_GUARD_EVICT_MIN_S, and nothing of a request unread in its socket.  A
 * keep-alive connection between two requests of a busy client is neither,
 * so a client is never cut while it sends. */
static int evictable_locked(const srv_guard_slot *sl, double t)
{
    return sl->phase != SRV_CONN_BUSY && t - sl->since >= SRV_GUARD_EVICT_MIN_S &&
           !has_unread(sl->fd);
}

enum { PICK_NONE, PICK_LIVE, PICK_ANY }; /* which connections census_locked may pick */

/* Caller holds g->mu.  Connections being served or waiting for their
 * request (*live, "over" ones excluded), the "over" ones (*n_over), and the
 * evictable one waiting longest among those `pick` names (NULL: none). */
static srv_guard_slot *census_locked(srv_guard *g, int pick, int *live, int *n_over)
{
    srv_guard_slot *oldest = NULL;
    double t = now_s();
    *live = *n_over = 0;
    for (int i = 0; i < g->n_slots; i++) {
        srv_guard_slot *sl = &g->slots[i];
        if (!sl->used || sl->shut)
            continue; /* a shut-down connection is on its way out */
        if (sl->over)
            ++*n_over;
        else
            ++*live;
        if (pick == PICK_NONE || (sl->over && pick != PICK_ANY))
            continue;
        if ((!oldest || sl->since < oldest->since) && evictable_locked(sl, t))
            oldest = sl;
    }
    return oldest;
}

int srv_guard_slots(int max_connections)
{
    return 2 * max_connections + SRV_GUARD_SLACK;
}

/* Caller holds g->mu.  Idle connections, "over" ones included, are closed
 * (longest-idle first) while more than SRV_GUARD_SLACK / 2 are "over" or
 * every slot is open, so a flood of idle sockets holds neither threads nor
 * slots until its header timeout (the reaper calls this every tick). */
static void unjam_locked(srv_guard *g)
{
    int live, n_over;
    census_locked(g, PICK_NONE, &live, &n_over);
    for (int k = 0; k < g->n_slots; k++) {
        if (n_over <= SRV_GUARD_SLACK / 2 && live + n_over < g->n_slots - 1)
            return;
        srv_guard_slot *sl = census_locked(g, PICK_ANY, &live, &n_over);
        if (!sl)
            return;
        shut_locked(g, sl, SRV_GUARD_IDLE_EVICTED);
        if (sl->over)
            n_over--;
        else
            live--;
    }
}

/* At --max-connections a new connection takes the place of the longest-idle
 * evictable one; with none it is "over" (answered 503).  Refused (closed at
 * accept, counted) only with every slot open. */
int srv_guard_accept(srv_guard *g)
{
    pthread_mutex_lock(&g->mu);
    int live, n_over, ok = 1;
    census_locked(g, PICK_NONE, &live, &n_over);
    if (live >= g->cfg.max_connections) {
        srv_guard_slot *sl = census_locked(g, PICK_LIVE, &live, &n_over);
        if (sl)
            shut_locked(g, sl, SRV_GUARD_IDLE_EVICTED);
        else
            unjam_locked(g);
    }
    if (g->n_open >= g->n_slots) {
        g->count[SRV_GUARD_CONN_REFUSED]++;
        ok = 0;
    }
    pthread_mutex_unlock(&g->mu);
    return ok;
}

srv_guard_slot *srv_guard_open(srv_guard *g, int fd, int *over)
{
    srv_guard_slot *found = NULL;
    pthread_mutex_lock(&g->mu);
    int live, n_over;
    census_locked(g, PICK_NONE, &live, &n_over);
    *over = live >= g->cfg.max_connections;
    for (int i = 0; i < g->n_slots && !found; i++)
        if (!g->slots[i].used)
            found = &g->slots[i];
    if (found) {
        *found = (srv_guard_slot){.used = 1, .fd = fd, .over = *over,
                                  .phase = SRV_CONN_HEADERS, .since = now_s()};
        g->n_open++;
    }
    pthread_mutex_unlock(&g->mu);
    return found;
}

void srv_guard_close(srv_guard *g, srv_guard_slot *sl)
{
    if (!sl)
        return;
    pthread_mutex_lock(&g->mu);
    if (sl->used) {
        sl->used = 0;
        g->n_open--;
    }
    pthread_mutex_unlock(&g->mu);
}

void srv_guard_phase(srv_guard *g, srv_guard_slot *sl, srv_conn_phase p)
{
    if (!sl)
        return;
    pthread_mutex_lock(&g->mu);
    sl->phase = p;
    sl->since = now_s();
    pthread_mutex_unlock(&g->mu);
}

int srv_guard_body_late(srv_guard *g, srv_guard_slot *sl)
{
    if (!sl)
        return 0;
    pthread_mutex_lock(&g->mu);
    int late = sl->phase == SRV_CONN_BODY && !sl->shut && now_s() > deadline_of(g, sl);
    if (late)
        shut_locked(g, sl, SRV_GUARD_BODY_TIMEOUT);
    pthread_mutex_unlock(&g->mu);
    return late;
}

srv_conn_phase srv_guard_phase_of(srv_guard *g, const srv_guard_slot *sl)
{
    if (!sl)
        return SRV_CONN_BUSY;
    pthread_mutex_lock(&g->mu);
    srv_conn_phase p = sl->phase;
    pthread_mutex_unlock(&g->mu);
    return p;
}

static const struct {
    const char *name, *help;
} counter_info[SRV_GUARD_N] = {
    [SRV_GUARD_HEADER_TIMEOUT] = {"http_header_timeouts_total",
                                  "Connections closed for not completing request headers within "
                                  "--header-timeout (slow or idle clients)."},
    [SRV_GUARD_BODY_TIMEOUT] = {"http_body_timeouts_total",
                                "Connections closed for not completing a request body within "
                                "--body-timeout."},
    [SRV_GUARD_BODY_TOO_LARGE] = {"http_body_too_large_total",
                                  "Requests answered 413: body over --max-body."},
    [SRV_GUARD_IDLE_EVICTED] = {"http_idle_evictions_total",
                                "Connections idle (no request unread) for at least 1 s "
                                "closed to admit a new one at --max-connections."},
    [SRV_GUARD_CONN_REFUSED] = {"http_connections_refused_total",
                                "Connections closed at accept: 2 x --max-connections + 64 "
                                "open at once."},
    [SRV_GUARD_WRITE_TIMEOUT] = {"http_write_timeouts_total",
                                 "Responses cut because the client read nothing for --timeout."},
    [SRV_GUARD_STREAM_BACKLOG] = {"stream_backlog_cancels_total",
                                  "Requests cancelled because their client fell more than "
                                  "--stream-backlog events behind."},
    [SRV_GUARD_HEALTH_STALLED] = {"health_stalled_total",
                                  "/health answers of 503 because the engine made no "
                                  "progress within --health-stall-timeout."},
    [SRV_GUARD_CONN_OVERLOADED] = {"http_overload_responses_total",
                                   "Requests answered 503 (Retry-After) on a connection "
                                   "accepted past --max-connections while all were served."},
    [SRV_GUARD_QUEUE_FULL] = {"requests_queue_full_total",
                              "Generation requests answered 503 (Retry-After): --max-waiting "
                              "requests were already waiting."},
};

char *srv_guard_metrics(srv_guard *g)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f)
        return NULL;
    uint64_t c[SRV_GUARD_N];
    pthread_mutex_lock(&g->mu);
    memcpy(c, g->count, sizeof c);
    int open = g->n_open;
    pthread_mutex_unlock(&g->mu);
    for (int i = 0; i < SRV_GUARD_N; i++)
        fprintf(f, "# HELP kvant_%s %s\n# TYPE kvant_%s counter\nkvant_%s %llu\n",
                counter_info[i].name, counter_info[i].help, counter_info[i].name,
                counter_info[i].name, (unsigned long long)c[i]);
    fprintf(f, "# HELP kvant_http_connections_open Client connections open now.\n"
               "# TYPE kvant_http_connections_open gauge\nkvant_http_connections_open %d\n",
            open);
    if (fclose(f)) {
        free(buf);
        return NULL;
    }
    return buf;
}
