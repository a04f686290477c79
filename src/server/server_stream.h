/* server_stream.h - the per-request event channel between the engine
 * thread and the HTTP thread serving that request, and the stop-string
 * matcher that holds back text which might begin a stop string.
 *
 * Channel life: srv_chan_create(.., n_src) gives n_src + 1 references: one
 * per engine request feeding it (its source, 0..n_src-1: the prompts of one
 * HTTP request; dropped when that request's final DONE/ERROR event is
 * pushed, or by the HTTP side with srv_chan_unref_engine when its
 * engine_submit failed) and one for the HTTP side (srv_chan_unref).
 * Threading: srv_chan_on_event runs on the engine thread; srv_chan_wait on
 * the request's HTTP thread; all channel functions are thread-safe.
 */
#ifndef KVANT_SERVER_STREAM_H
#define KVANT_SERVER_STREAM_H

#include <stddef.h>
#include <stdint.h>

#include "engine/engine.h"
#include "server/server_guard.h"
#include "server/server_metrics.h"

/* Growable byte buffer (NUL-terminated when non-empty); caller-owned. */
typedef struct srv_buf {
    char *s;
    size_t len, cap;
} srv_buf;
int srv_buf_append(srv_buf *b, const char *s, size_t n); /* KV_OK / KV_ENOMEM */
void srv_buf_free(srv_buf *b);

/* A copy of one engine event (the error text is copied too). */
typedef struct srv_ev {
    engine_event ev;        /* ev.error points into err or is NULL */
    int src;                /* the source (engine request) it came from */
    char err[256];
} srv_ev;

typedef struct srv_chan srv_chan;

/* t_arrival: monotonic seconds when the HTTP request arrived (for TTFT and
 * e2e, observed per source).  metrics is borrowed (may be NULL); n_src >= 1.
 * cap: the events the channel can hold, allocated here once (the engine's
 * callback never allocates): the stream backlog, plus one final event per
 * source, plus the prompt's events when prompt logprobs are asked for.  An
 * event past cap is not queued; the reader then gets an internal error.
 * The queue restarts at its first slot whenever it empties, so a reader
 * that keeps up touches only the first few slots' pages. */
srv_chan *srv_chan_create(srv_metrics *metrics, double t_arrival, int n_src, size_t cap);
/* The ctx to pass to engine_submit with srv_chan_on_event for source k. */
void *srv_chan_src(srv_chan *c, int k);
void srv_chan_unref(srv_chan *c);               /* HTTP side's reference */
void srv_chan_unref_engine(srv_chan *c, int k); /* only when k's engine_submit failed */
/* Bounds the events waiting for the HTTP side (a client that stops reading
 * its stream): past max_pending, further non-final events are dropped, the
 * request is cancelled in the engine (once, counted in guard) and its final
 * event says why.  Call right after engine_submit succeeded; max_pending 0
 * = unbounded.  e and guard are borrowed. */
void srv_chan_set_backlog(srv_chan *c, int k, engine *e, int64_t rid, int max_pending,
                          srv_guard *guard);
/* Marks the submission time (call just before engine_submit). */
void srv_chan_submitted(srv_chan *c, double t_submit);
/* The engine_event_fn to pass to engine_submit with srv_chan_src as ctx. */
void srv_chan_on_event(void *ctx, const engine_event *ev);
/* Pops the next event into *out: 1 = got one, 0 = timed out, -1 = the
 * client closed peer_fd (its socket, polled for POLLRDHUP alongside the
 * channel, so a departure is seen at once; -1: no socket to watch). */
int srv_chan_wait(srv_chan *c, srv_ev *out, int timeout_ms, int peer_fd);
/* 1 once every source's final event has been pushed by the engine. */
int srv_chan_engine_done(srv_chan *c);

double srv_now(void); /* CLOCK_MONOTONIC seconds */

/* Stop strings. */
#define SRV_MAX_STOP 4
#define SRV_MAX_STOP_LEN 256

typedef struct srv_stops {
    int n;
    char s[SRV_MAX_STOP][SRV_MAX_STOP_LEN + 1];
    size_t len[SRV_MAX_STOP];
} srv_stops;

/* Feeds piece into the held-back text *held and appends to *emit the text
 * that can no longer be part of a stop string.  Returns 1 when a stop
 * string completed: *emit then gets the text before it and *held is
 * emptied; 0 otherwise; KV_ENOMEM on allocation failure. */
int srv_stops_feed(const srv_stops *st, srv_buf *held, const char *piece, size_t n,
                   srv_buf *emit);

#endif
