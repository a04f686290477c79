/* server_dash.h - the static dashboard page served at GET /dashboard.
 * Returns a pointer to static, NUL-terminated HTML (never freed); any
 * thread. */
#ifndef KVANT_SERVER_DASH_H
#define KVANT_SERVER_DASH_H

#include <stddef.h>

const char *srv_dashboard_html(size_t *len);

#endif
