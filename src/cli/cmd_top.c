/* cmd_top.c - `kvant top URL`: a terminal view of a running server for an
 * operator on a shell: memory bars by category against the budget, KV
 * usage, queues, tokens/s and the requests holding KV, refreshed every
 * --interval seconds from GET /v1/memory (plain ANSI, no curses).
 *
 * The HTTP client is the smallest that does the job: HTTP/1.0 GET over one
 * TCP connection per refresh, plain http only, response capped at
 * TOP_MAX_BODY.  Keys (when stdin is a terminal): q quits.
 */
#include <errno.h>
#include <jansson.h>
#include <netdb.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <termios.h>
#include <time.h>
#include <unistd.h>

#include "cli/cli.h"

#define TOP_MAX_BODY (64u << 20)
#define TOP_BAR 40
#define TOP_MAX_ROWS 20 /* request rows shown */

typedef struct top_opts {
    char host[256], port[16];
    const char *api_key;
    double interval;
    long count;    /* refreshes; 0 = until q or a signal */
    int json, clear;
} top_opts;

static double top_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int parse_url(const char *url, top_opts *o)
{
    if (!strncmp(url, "https://", 8))
        return cli_err_usage("top", "https is not supported (use http:// or a local port)");
    if (!strncmp(url, "http://", 7))
        url += 7;
    size_t n = strcspn(url, "/");
    char hp[256];
    if (n == 0 || n >= sizeof hp)
        return cli_err_usage("top", "bad URL '%.100s' (http://HOST:PORT)", url);
    memcpy(hp, url, n);
    hp[n] = '\0';
    char *colon = strrchr(hp, ':');
    snprintf(o->port, sizeof o->port, "%s", colon ? colon + 1 : "80");
    if (colon)
        *colon = '\0';
    snprintf(o->host, sizeof o->host, "%s", hp);
    return 0;
}

/* GET path; returns the malloc'd body of a 200 response, else NULL with
 * why filled. */
static char *http_get(const top_opts *o, const char *path, char *why, size_t wcap)
{
    struct addrinfo hints = {0}, *ai = NULL;
    hints.ai_socktype = SOCK_STREAM;
    int rc = getaddrinfo(o->host, o->port, &hints, &ai);
    if (rc) {
        snprintf(why, wcap, "%s: %s", o->host, gai_strerror(rc));
        return NULL;
    }
    int fd = socket(ai->ai_family, ai->ai_socktype, ai->ai_protocol);
    struct timeval tv = {5, 0};
    if (fd >= 0) {
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
        setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    }
    if (fd < 0 || connect(fd, ai->ai_addr, ai->ai_addrlen)) {
        snprintf(why, wcap, "cannot connect to %s:%s: %s", o->host, o->port, strerror(errno));
        if (fd >= 0)
            close(fd);
        freeaddrinfo(ai);
        return NULL;
    }
    freeaddrinfo(ai);
    char req[1024];
    int n = snprintf(req, sizeof req, "GET %s HTTP/1.0\r\nHost: %s:%s\r\n%s%s%sConnection: close\r\n\r\n",
                     path, o->host, o->port, o->api_key ? "Authorization: Bearer " : "",
                     o->api_key ? o->api_key : "", o->api_key ? "\r\n" : "");
    if (n < 0 || n >= (int)sizeof req || write(fd, req, (size_t)n) != n) {
        snprintf(why, wcap, "cannot send the request");
        close(fd);
        return NULL;
    }
    size_t len = 0, cap = 1 << 16;
    char *buf = malloc(cap);
    ssize_t got;
    while (buf && (got = read(fd, buf + len, cap - len - 1)) > 0) {
        len += (size_t)got;
        if (len + 1 == cap) {
            char *nb = cap < TOP_MAX_BODY ? realloc(buf, cap * 2) : NULL;
            if (!nb) {
                free(buf);
                buf = NULL;
                break;
            }
            buf = nb;
            cap *= 2;
        }
    }
    close(fd);
    if (!buf) {
        snprintf(why, wcap, "response too large or out of memory");
        return NULL;
    }
    buf[len] = '\0';
    int status = 0;
    char *body = strstr(buf, "\r\n\r\n");
    if (sscanf(buf, "HTTP/%*d.%*d %d", &status) != 1 || !body || status != 200) {
        snprintf(why, wcap, "HTTP %d from %s%s", status, path,
                 status == 401 ? " (use --api-key)" : "");
        free(buf);
        return NULL;
    }
    memmove(buf, body + 4, strlen(body + 4) + 1);
    return buf;
}

static double jnum(json_t *o, const char *path)
{
    char key[64];
    snprintf(key, sizeof key, "%s", path);
    char *dot = strchr(key, '.');
    if (dot) {
        *dot = '\0';
        o = json_object_get(o, key);
        return jnum(o, dot + 1);
    }
    return json_number_value(json_object_get(o, key));
}

static void bar(double frac, char *out)
{
    int fill = frac <= 0 ? 0 : frac >= 1 ? TOP_BAR : (int)(frac * TOP_BAR + 0.5);
    for (int i = 0; i < TOP_BAR; i++)
        out[i] = i < fill ? '#' : '.';
    out[TOP_BAR] = '\0';
}

static double mib(double b)
{
    return b / 1048576.0;
}

static void render(const top_opts *o, json_t *j, double tps, const char *url)
{
    char b[TOP_BAR + 1];
    time_t now = time(NULL);
    char ts[32];
    strftime(ts, sizeof ts, "%H:%M:%S", localtime(&now));
    if (o->clear)
        printf("\x1b[H\x1b[2J");
    printf("kvant top  %s  %s  (q quits)\n\n", url, ts);
    double budget = jnum(j, "budget"), peak = jnum(j, "peak");
    double scale = budget < 1.5 * peak || peak <= 0 ? budget : 1.5 * peak;
    printf("memory  used %.1f MiB  peak %.1f MiB  budget %.1f MiB  (bars: share of %.1f MiB)\n",
           mib(jnum(j, "used")), mib(peak), mib(budget), mib(scale));
    json_t *cats = json_object_get(j, "categories");
    const char *name;
    json_t *c;
    json_object_foreach(cats, name, c)
    {
        double cur = jnum(c, "current");
        bar(scale > 0 ? cur / scale : 0, b);
        printf("  %-12s [%s] %9.1f MiB  peak %9.1f MiB\n", name, b, mib(cur),
               mib(jnum(c, "peak")));
    }
    printf("  %-12s %9.1f MiB resident\n\n", "process", mib(jnum(j, "process.rss_bytes")));
    double used = jnum(j, "kv.used"), total = jnum(j, "kv.blocks");
    bar(total > 0 ? used / total : 0, b);
    json_t *pool = json_array_get(json_object_get(j, "pools"), 0);
    printf("KV      [%s] %.1f%%  used %.0f / %.0f blocks of %.0f tokens, cached %.0f, "
           "fragmentation %.3f\n\n",
           b, total > 0 ? 100 * used / total : 0, used, total, jnum(j, "kv.block_size"),
           jnum(j, "kv.cached"), pool ? jnum(pool, "fragmentation") : 0.0);
    printf("requests  running %.0f  waiting %.0f  preempted %.0f   tokens/s %.1f   "
           "preemptions %.0f\n\n",
           jnum(j, "engine.running"), jnum(j, "engine.waiting"),
           jnum(j, "engine.preempted_waiting"), tps, jnum(j, "engine.preemptions_total"));
    printf("%8s %5s %8s %9s %9s %6s %7s %9s %7s\n", "id", "seqs", "prompt", "generated",
           "kv_tokens", "own", "shared", "kv_MiB", "age_s");
    json_t *reqs = json_object_get(j, "requests");
    size_t i;
    json_t *q;
    json_array_foreach(reqs, i, q)
    {
        if (i >= TOP_MAX_ROWS) {
            printf("  ... %zu more\n", json_array_size(reqs) - i);
            break;
        }
        printf("%8.0f %5.0f %8.0f %9.0f %9.0f %6.0f %7.0f %9.2f %7.1f\n", jnum(q, "id"),
               jnum(q, "seqs"), jnum(q, "prompt_tokens"), jnum(q, "generated_tokens"),
               jnum(q, "kv_tokens"), jnum(q, "blocks_own"), jnum(q, "blocks_shared"),
               mib(jnum(q, "kv_bytes")), jnum(q, "age_s"));
    }
    fflush(stdout);
}

static void render_json(json_t *j, double tps)
{
    json_t *o = json_pack(
        "{s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:O, s:i}", "tokens_per_s", tps, "running",
        jnum(j, "engine.running"), "waiting", jnum(j, "engine.waiting"), "kv_usage_ratio",
        jnum(j, "kv.usage_ratio"), "used_bytes", jnum(j, "used"), "budget_bytes",
        jnum(j, "budget"), "rss_bytes", jnum(j, "process.rss_bytes"), "categories",
        json_object_get(j, "categories") ? json_object_get(j, "categories") : json_null(),
        "requests", (int)json_array_size(json_object_get(j, "requests")));
    char *s = o ? json_dumps(o, JSON_COMPACT) : NULL;
    printf("%s\n", s ? s : "{}");
    fflush(stdout);
    free(s);
    json_decref(o);
}

/* Waits up to sec seconds; returns 1 when q was pressed. */
static int wait_key(double sec, int tty)
{
    struct pollfd p = {0, POLLIN, 0};
    double end = top_now() + sec;
    for (double left = sec; left > 0; left = end - top_now()) {
        if (!tty) {
            struct timespec t = {(time_t)left, (long)((left - (time_t)left) * 1e9)};
            nanosleep(&t, NULL);
            return 0;
        }
        if (poll(&p, 1, (int)(left * 1000) + 1) > 0) {
            char ch;
            if (read(0, &ch, 1) != 1 || ch == 'q' || ch == 'Q')
                return 1;
        }
    }
    return 0;
}

static void top_help(void)
{
    static const cli_opt t[] = {
        {"URL", NULL, "server to watch, plain http (default: http://127.0.0.1:8080)", NULL},
        {"--interval", "S", "seconds between refreshes", "1"},
        {"-n, --count", "N", "refreshes, then exit (0 = until q or a signal)", "0"},
        {"--api-key", "KEY", "bearer token for a server started with --api-key", "none"},
        {"--json", NULL, "one summary object per refresh instead of the screen", "off"},
        {"--no-clear", NULL, "append screens instead of redrawing in place", "off"},
        {"-h, --help", NULL, "print this help and exit", NULL},
    };
    printf("usage: kvant top [URL] [options]\n\n"
           "A terminal view of a running `kvant serve` (GET /v1/memory): memory by category,\n"
           "KV usage, queues, tokens/s and the requests holding KV.  q quits.\n");
    cli_help_table(stdout, "options", t, CLI_N_OPTS(t));
}

/* 0 = run, 1 = help printed, else an exit status (usage error, one line). */
static int parse_args(int argc, char **argv, top_opts *o, const char **url)
{
    for (int i = 1; i < argc; i++) {
        const char *v;
        if (!strcmp(argv[i], "--interval")) {
            if (!(v = cli_value(argc, argv, &i)) ||
                cli_parse_float("--interval", v, 0.05, 3600, &o->interval))
                return CLI_EXIT_USAGE;
        } else if (!strcmp(argv[i], "--count") || !strcmp(argv[i], "-n")) {
            if (!(v = cli_value(argc, argv, &i)) ||
                cli_parse_int("--count", v, 0, 1L << 30, &o->count))
                return CLI_EXIT_USAGE;
        } else if (!strcmp(argv[i], "--api-key")) {
            if (!(o->api_key = cli_value(argc, argv, &i)))
                return CLI_EXIT_USAGE;
        } else if (!strcmp(argv[i], "--json")) {
            o->json = 1;
        } else if (!strcmp(argv[i], "--no-clear")) {
            o->clear = 0;
        } else if (cli_is_help(argv[i])) {
            top_help();
            return 1;
        } else if (argv[i][0] == '-') {
            return cli_err_unknown("top", argv[i]);
        } else {
            *url = argv[i];
        }
    }
    return parse_url(*url, o);
}

int cmd_top(int argc, char **argv)
{
    top_opts o = {.interval = 1.0, .clear = 1};
    const char *url = "http://127.0.0.1:8080";
    int pr = parse_args(argc, argv, &o, &url);
    if (pr)
        return pr == 1 ? 0 : pr;
    int tty = !o.json && isatty(0);
    struct termios saved;
    if (tty && tcgetattr(0, &saved) == 0) {
        struct termios raw = saved;
        raw.c_lflag &= (tcflag_t) ~(ICANON | ECHO);
        tcsetattr(0, TCSANOW, &raw);
    } else {
        tty = 0;
    }
    double last_tok = -1, last_t = 0;
    int rc = 0;
    for (long k = 0; o.count == 0 || k < o.count; k++) {
        char why[1024];
        char *body = http_get(&o, "/v1/memory", why, sizeof why);
        json_t *j = body ? json_loads(body, 0, NULL) : NULL;
        free(body);
        if (!j) {
            if (body == NULL && o.clear && !o.json)
                printf("\x1b[H\x1b[2J");
            fprintf(o.json ? stderr : stdout, "kvant top: %s: %s\n", url,
                    body ? "bad JSON" : why);
            fflush(stdout);
            rc = 1;
        } else {
            double t = top_now(), tok = jnum(j, "engine.generation_tokens_total");
            double tps = last_tok >= 0 && t > last_t ? (tok - last_tok) / (t - last_t) : 0;
            last_tok = tok;
            last_t = t;
            if (o.json)
                render_json(j, tps);
            else
                render(&o, j, tps, url);
            json_decref(j);
            rc = 0;
        }
        if ((o.count == 0 || k + 1 < o.count) && wait_key(o.interval, tty))
            break;
    }
    if (tty)
        tcsetattr(0, TCSANOW, &saved);
    return rc;
}
