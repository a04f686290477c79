/* server_guard.h - limits on what a client can hold: the open connections,
 * the time to send a request's headers and its body, and counters for
 * every limit that fired (Prometheus, docs/SERVER.md "Limits").
 *
 * Connections are tracked from accept to close with their phase:
 * SRV_CONN_HEADERS (connected, or a keep-alive connection between
 * requests, until the headers are complete), SRV_CONN_BODY (until the body
 * is complete) and SRV_CONN_BUSY (the request is served; no deadline here:
 * a stream's writes are bounded by MHD's inactivity --timeout and the
 * per-request event backlog, server_stream.c).  A reaper thread shuts down
 * (shutdown(2), so MHD's thread sees end-of-file and closes) connections
 * past their phase's deadline.  At the connection limit, a new connection
 * closes the connection that has waited longest for its request (phase
 * HEADERS or BODY, idle at least SRV_GUARD_EVICT_MIN_S with no request
 * bytes unread in its socket, so a keep-alive client that is sending its
 * next request is never cut).  When none is evictable the new connection is
 * accepted as "over" (its requests are answered 503 with Retry-After and
 * Connection: close).  Idle "over" connections past SRV_GUARD_SLACK / 2 are
 * evicted the same way.  Only when every slot (srv_guard_slots: MHD's own
 * limit, 2 x max_connections + SRV_GUARD_SLACK) is open at once is a new
 * connection closed at accept.
 *
 * Ownership: srv_guard_create returns a heap handle (srv_guard_destroy).
 * A slot returned by srv_guard_open belongs to the guard; the caller keeps
 * it as MHD's socket context until srv_guard_close.  Threading: every
 * function is thread-safe (one mutex); the reaper is the guard's thread.
 */
#ifndef KVANT_SERVER_GUARD_H
#define KVANT_SERVER_GUARD_H

#include <stdint.h>

typedef enum srv_guard_event {
    SRV_GUARD_HEADER_TIMEOUT = 0, /* kvant_http_header_timeouts_total */
    SRV_GUARD_BODY_TIMEOUT,       /* kvant_http_body_timeouts_total */
    SRV_GUARD_BODY_TOO_LARGE,     /* kvant_http_body_too_large_total */
    SRV_GUARD_IDLE_EVICTED,       /* kvant_http_idle_evictions_total */
    SRV_GUARD_CONN_REFUSED,       /* kvant_http_connections_refused_total */
    SRV_GUARD_WRITE_TIMEOUT,      /* kvant_http_write_timeouts_total */
    SRV_GUARD_STREAM_BACKLOG,     /* kvant_stream_backlog_cancels_total */
    SRV_GUARD_HEALTH_STALLED,     /* kvant_health_stalled_total */
    SRV_GUARD_CONN_OVERLOADED,    /* kvant_http_overload_responses_total */
    SRV_GUARD_QUEUE_FULL,         /* kvant_requests_queue_full_total */
    SRV_GUARD_N
} srv_guard_event;

typedef enum srv_conn_phase { SRV_CONN_HEADERS = 0, SRV_CONN_BODY, SRV_CONN_BUSY } srv_conn_phase;

typedef struct srv_guard_config {
    int max_connections;      /* open connections served at once */
    double header_timeout_s;  /* connect or end of the last response -> headers complete */
    double body_timeout_s;    /* headers complete -> body complete */
} srv_guard_config;

typedef struct srv_guard srv_guard;
typedef struct srv_guard_slot srv_guard_slot;

/* Connections MHD may hold beyond 2 x max_connections: the "over" ones
 * being answered 503 and evicted ones while they close. */
#define SRV_GUARD_SLACK 64
/* A connection waiting for its request this long (s) may be evicted. */
#define SRV_GUARD_EVICT_MIN_S 1.0

srv_guard *srv_guard_create(const srv_guard_config *cfg);
void srv_guard_destroy(srv_guard *g);

void srv_guard_count(srv_guard *g, srv_guard_event ev);
uint64_t srv_guard_get(srv_guard *g, srv_guard_event ev);

/* MHD's accept policy: 1 = accept, closing the longest-waiting evictable
 * connection when at the limit (with none, the new connection is answered
 * 503: srv_guard_open marks it "over"); 0 = refuse, only when every slot
 * is open. */
int srv_guard_accept(srv_guard *g);
/* Connections tracked at most: MHD's connection limit. */
int srv_guard_slots(int max_connections);
/* A connection started (fd: its socket): its slot, or NULL when no slot is
 * free (it is then not tracked).  *over = 1 when it is past max_connections
 * (every request on it gets 503), else 0. */
srv_guard_slot *srv_guard_open(srv_guard *g, int fd, int *over);
void srv_guard_close(srv_guard *g, srv_guard_slot *sl);
/* Moves a connection to phase p (its deadline restarts).  NULL sl: no-op. */
void srv_guard_phase(srv_guard *g, srv_guard_slot *sl, srv_conn_phase p);
/* 1 when sl is in SRV_CONN_BODY past the body timeout (counted once). */
int srv_guard_body_late(srv_guard *g, srv_guard_slot *sl);
/* The phase sl was in (SRV_CONN_BUSY for NULL). */
srv_conn_phase srv_guard_phase_of(srv_guard *g, const srv_guard_slot *sl);

/* Prometheus text: the counters and kvant_http_connections_open; malloc'd
 * (caller frees) or NULL. */
char *srv_guard_metrics(srv_guard *g);

#endif
