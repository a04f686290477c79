/* server_dash.c - the dashboard page (src/server/dashboard.html) compiled
 * into the binary with the assembler's .incbin, so `kvant serve` needs no
 * file at run time and the page loads nothing from outside the server.
 * The path is relative to the repository root, where make runs the
 * compiler; the Makefile makes this object depend on the HTML file.
 */
#include "server/server_dash.h"

#include <string.h>

__asm__(".pushsection .rodata\n"
        ".global kvant_dashboard_html\n"
        ".type kvant_dashboard_html, %object\n"
        "kvant_dashboard_html:\n"
        ".incbin \"src/server/dashboard.html\"\n"
        ".byte 0\n"
        ".popsection\n");

extern const char kvant_dashboard_html[];

const char *srv_dashboard_html(size_t *len)
{
    if (len)
        *len = strlen(kvant_dashboard_html);
    return kvant_dashboard_html;
}
