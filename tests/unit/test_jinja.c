/* test_jinja.c - the Jinja interpreter's pieces against jinja2.
 *
 * CASES / ERRORS were produced by rendering each template with Python
 * jinja2 3.1.6 in transformers' chat-template environment
 * (tests/py/jinja_ref.py: ImmutableSandboxedEnvironment, trim_blocks,
 * lstrip_blocks, loopcontrols, generation, tojson = json.dumps) over VARS,
 * with strftime_now pinned to jinja_ref.FIXED_TIME in UTC; the generator
 * script is quoted in the commit that added this file.  Also: the lexer's
 * token stream, the JSON writer, Python float repr, and the limits an
 * untrusted template meets (iterations, output, nesting, recursion).
 */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "testutil.h"
#include "text/jinja.h"
#include "text/jinja_json.h"
#include "text/jinja_lex.h"
#include "text/jinja_value.h"

#define FIXED_TIME 1764547200

typedef struct jcase {
    const char *src, *want;
} jcase;

static const char VARS[] = "{\"messages\": [{\"role\": \"system\", \"content\": \" Be brief. \"}, {\"role\": \"user\", \"content\": \"Hi \\u00e9\"}, {\"role\": \"assistant\", \"content\": \"Yo\", \"tool_calls\": [{\"function\": {\"name\": \"f\", \"arguments\": {\"b\": 2, \"a\": [1, 2.5, null, true]}}}]}], \"n\": 7, \"s\": \"a,b,,c\", \"f\": 2.5, \"d\": {\"z\": 1, \"Y\": 2, \"x\": 3}, \"e\": [], \"t\": null}";
static const jcase CASES[] = {
    {"{% if true %}\n  yes\n{% endif %}\n",
     "  yes\n"},
    {"  {% if true %}x{% endif %}  \n  {{- ' y' }}\n  {#- c -#}  z\n",
     "x yz"},
    {"a\n    {% for i in range(2) %}\n    [{{ i }}]\n    {% endfor %}\nb",
     "a\n    [0]\n    [1]\nb"},
    {"{%+ if true %}k{% endif +%}\nl {# comment #}\nm",
     "k\nl m"},
    {"{{ 'it\\'s' ~ \"\\t|\\u00e9|\\x41\" }} {{ 7 // 2 }} {{ -7 // 2 }} {{ -7 % 3 }} {{ 7 / 2 }} {{ 2 ** 10 }} {{ 1e3 }} {{ 0.1 + 0.2 }}",
     "it's\t|\303\251|A 3 -4 2 3.5 1024 1000.0 0.30000000000000004"},
    {"{{ [1, 'a', none, true, 2.0, (1,), {'k': 'v'}] }} {{ (1, 2) }} {{ 'ab' * 3 }} {{ [1] + [2] }}",
     "[1, 'a', None, True, 2.0, (1,), {'k': 'v'}] (1, 2) ababab [1, 2]"},
    {"{{ 1 < 2 < 3 }} {{ 'a' in 'cat' }} {{ 3 not in [1, 2] }} {{ 1 == 1.0 }} {{ not 0 }} {{ 0 or 'x' }} {{ 1 and [] }}",
     "True True True True True x []"},
    {"{{ 'yes' if n > 5 else 'no' }}|{{ 'never' if false }}|{{ s[1:] }}|{{ s[::-1] }}|{{ s[-2:] }}|{{ messages[-1].role }}",
     "yes||,b,,c|c,,b,a|,c|assistant"},
    {"{{ messages[0]['content'].strip() }}|{{ s.split(',') }}|{{ s.split(',', 1) }}|{{ '  a b  '.split() }}|{{ 'xxhixx'.strip('x') }}|{{ s.rsplit(',', 1) }}",
     "Be brief.|['a', 'b', '', 'c']|['a', 'b,,c']|['a', 'b']|hi|['a,b,', 'c']"},
    {"{{ 'Hello'.startswith('He') }} {{ 'a.py'.endswith(('.js', '.py')) }} {{ 'abcabc'.replace('b', 'B', 1) }} {{ 'hello world'.title() }} {{ 'x'.upper() }} {{ '{} and {}'.format(1, 'two') }} {{ 'abc'.find('c') }}",
     "True True aBcabc Hello World X 1 and two 2"},
    {"{{ d.get('z') }} {{ d.get('q', 'none!') }} {{ d.keys() | list }} {{ d.values() | list }} {% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}",
     "1 none! ['z', 'Y', 'x'] [1, 2, 3] z=1;Y=2;x=3;"},
    {"{{ messages | length }} {{ 'caf\303\251' | length }} {{ messages | map(attribute='role') | join(',') }} {{ messages | selectattr('role', 'equalto', 'user') | list | length }} {{ messages | rejectattr('content') | list }}",
     "3 4 system,user,assistant 1 []"},
    {"{{ d | dictsort }} {{ d | items | list }} {{ [3, 1, 2] | sort }} {{ ['b', 'A', 'a'] | unique | list }} {{ [1, 2, 3] | reverse | list }} {{ 'abc' | reverse }}",
     "[('x', 3), ('Y', 2), ('z', 1)] [('z', 1), ('Y', 2), ('x', 3)] [1, 2, 3] ['b', 'A'] [3, 2, 1] cba"},
    {"{{ ' x ' | trim }}|{{ 'hello' | upper }}|{{ 'HeLLo' | lower }}|{{ 'hello world' | capitalize }}|{{ 'a-b c' | title }}|{{ '12' | int + 1 }}|{{ 'x' | int }}|{{ '2.5' | float }}|{{ 3 | string }}|{{ -3 | abs }}",
     "x|HELLO|hello|Hello world|A-B C|13|0|2.5|3|3"},
    {"{{ t | default('dflt') }}|{{ nope | default('dflt') }}|{{ '' | default('e', true) }}|{{ [1,2,3] | first }}|{{ [1,2,3] | last }}|{{ 2.567 | round(2) }}|{{ 2.5 | round }}|{{ [1,2,3,4,5] | batch(2) | list }}",
     "None|dflt|e|1|3|2.57|2.0|[[1, 2], [3, 4], [5]]"},
    {"{{ 'a\nb\n\nc' | indent(2) }}|{{ 'a\nb' | indent(2, true) }}|{{ [1, 2] | select('odd') | list }}|{{ [1, 2] | reject('odd') | list }}|{{ ['a', 'b'] | map('upper') | list }}|{{ [1, 5, 3] | max }}|{{ [1, 5, 3] | min }}|{{ [1, 5, 3] | sum }}",
     "a\n  b\n\n  c|  a\n  b|[1]|[2]|['A', 'B']|5|1|9"},
    {"{{ messages[2].tool_calls | tojson }}\n{{ d | tojson(indent=2) }}\n{{ d | tojson(sort_keys=true) }}\n{{ {'q': '\"\\\\\n\303\251'} | tojson }}\n{{ [] | tojson(indent=2) }}{{ none | tojson }}{{ 1.0 | tojson }}",
     "[{\"function\": {\"name\": \"f\", \"arguments\": {\"b\": 2, \"a\": [1, 2.5, null, true]}}}]\n{\n  \"z\": 1,\n  \"Y\": 2,\n  \"x\": 3\n}\n{\"Y\": 2, \"x\": 3, \"z\": 1}\n{\"q\": \"\\\"\\\\\\n\303\251\"}\n[]null1.0"},
    {"{{ {'k': 'caf\303\251 \360\237\230\200'} | tojson(ensure_ascii=True) }}|{{ 'caf\303\251' | tojson(true, 1) }}|{{ [1] | tojson(false, none, (',', ':')) }}",
     "{\"k\": \"caf\\u00e9 \\ud83d\\ude00\"}|\"caf\\u00e9\"|[1]"},
    {"{{ n is odd }} {{ n is even }} {{ n is divisibleby 7 }} {{ n is number }} {{ n is integer }} {{ f is float }} {{ s is string }} {{ d is mapping }} {{ e is iterable }} {{ e is sequence }} {{ t is none }} {{ nope is defined }} {{ nope is undefined }} {{ true is boolean }} {{ 'ab' is lower }} {{ n is not none }} {{ 'a' is eq('a') }} {{ 3 is gt 2 }}",
     "True False True True True True True True True True True False True True True True True True"},
    {"{% for m in messages %}{{ loop.index }}/{{ loop.length }}{{ '<' if loop.first }}{{ '>' if loop.last }}{{ loop.revindex0 }}{{ loop.cycle('a', 'b') }}{% if not loop.first %}({{ loop.previtem.role }}){% endif %};{% endfor %}",
     "1/3<2a;2/31b(system);3/3>0a(user);"},
    {"{% for m in messages if m.role != 'system' %}{{ loop.index0 }}{{ m.role }}{% else %}none{% endfor %}|{% for x in e %}x{% else %}empty{% endfor %}|{% for c in 'ab' %}{{ c }}{% endfor %}",
     "0user1assistant|empty|ab"},
    {"{% for i in range(10) %}{% if i == 2 %}{% continue %}{% endif %}{% if i == 5 %}{% break %}{% endif %}{{ i }}{% endfor %}|{% for i in range(5, 0, -2) %}{{ i }}{% endfor %}",
     "0134|531"},
    {"{% set x = 1 %}{% for i in range(3) %}{% set x = x + i %}{{ x }}{% endfor %}{{ x }}|{% set ns = namespace(c=0, l='') %}{% for i in range(3) %}{% set ns.c = ns.c + i %}{% endfor %}{{ ns.c }}",
     "1231|3"},
    {"{% set a, b = 1, 'two' %}{{ a }}{{ b }}|{% set blk %}  in block {{ n }}  {% endset %}[{{ blk }}]|{% set t2 | trim %}  trimmed  {% endset %}[{{ t2 }}]",
     "1two|[  in block 7  ]|[trimmed]"},
    {"{% macro greet(name, punct='!') %}Hi {{ name }}{{ punct }}{% endmacro %}{{ greet('Bob') }} {{ greet('Al', punct='?') }} {{ greet(name='Cy') | upper }}",
     "Hi Bob! Hi Al? HI CY!"},
    {"{% macro fact(k) %}{% if k <= 1 %}1{% else %}{{ k * (fact(k - 1) | int) }}{% endif %}{% endmacro %}{{ fact(5) }}|{% filter upper %}shout {{ n }}{% endfilter %}|{% generation %}gen{% endgeneration %}",
     "120|SHOUT 7|gen"},
    {"[{{ nope }}][{{ d.nope }}][{{ messages[0].nope }}][{{ nope | length }}][{% for x in nope %}x{% endfor %}][{{ messages[9] }}]",
     "[][][][0][][]"},
    {"{{ 'a<b'|safe + '&\"' }}|{{ 'x' ~ ('<'|safe) }}|{{ strftime_now('%Y-%m-%d %H:%M') }}",
     "a<b&amp;&#34;|x<|2025-12-01 00:00"},
};
static const jcase ERRORS[] = {
    {"{{ raise_exception('boom: ' ~ n) }}", "chat template raised: boom: 7"},
    {"{{ nope.attr }}", "'nope' is undefined"},
    {"{{ 1 + 'a' }}", "unsupported operand type(s) for +: 'int' and 'str'"},
    {"{{ e.append(1) }}", "access to attribute 'append' of 'list' object is unsafe."},
    {"{{ x | from_json }}", "No filter named 'from_json'."},
    {"{{ 1 // 0 }}", "integer division or modulo by zero"},
};

static char *render(const char *src, json_t *vars, const jinja_limits *lim, kvant_err *err)
{
    jinja_tpl *t = NULL;
    if (jinja_compile(src, strlen(src), &t, err))
        return NULL;
    char *r = jinja_render(t, vars, FIXED_TIME, lim, err);
    jinja_free(t);
    return r;
}

static void test_cases(json_t *vars)
{
    for (size_t i = 0; i < sizeof CASES / sizeof CASES[0]; i++) {
        kvant_err err = {0};
        char *got = render(CASES[i].src, vars, NULL, &err);
        CHECKF(got && strcmp(got, CASES[i].want) == 0, "case %zu: %s\n got: %s\nwant: %s", i, CASES[i].src,
               got ? got : err.msg, CASES[i].want);
        free(got);
    }
    for (size_t i = 0; i < sizeof ERRORS / sizeof ERRORS[0]; i++) {
        kvant_err err = {0};
        char *got = render(ERRORS[i].src, vars, NULL, &err);
        CHECKF(!got && strstr(err.msg, ERRORS[i].want), "error %zu: %s gave %s", i, ERRORS[i].src,
               got ? got : err.msg);
        free(got);
    }
}

static void test_lexer(void)
{
    jv_arena *a = jv_arena_create(1 << 20);
    jtok *t = NULL;
    size_t n = 0;
    kvant_err err = {0};
    const char *src = "x\r\n{%- if a.b >= 2 -%}\n y {{ 'q\\n' }}{# c #}{% endif %}\n";
    CHECK(jlex_run(a, src, strlen(src), &t, &n, &err) == KV_OK);
    static const jtok_type want[] = {JT_TEXT, JT_BLOCK_BEGIN, JT_NAME, JT_NAME, JT_OP, JT_NAME, JT_OP, JT_INT,
                                     JT_BLOCK_END, JT_TEXT, JT_VAR_BEGIN, JT_STRING, JT_VAR_END, JT_BLOCK_BEGIN,
                                     JT_NAME, JT_BLOCK_END, JT_EOF};
    CHECKF(n == sizeof want / sizeof want[0], "%zu tokens", n);
    for (size_t i = 0; i < n && i < sizeof want / sizeof want[0]; i++)
        CHECKF(t[i].t == want[i], "token %zu is %d, want %d", i, (int)t[i].t, (int)want[i]);
    if (n > 11) {
        CHECK(t[0].n == 1 && t[0].s[0] == 'x');            /* "{%-" stripped the newline */
        CHECK(t[9].n == 2 && !memcmp(t[9].s, "y ", 2));    /* "-%}" stripped "\n " */
        CHECK(t[11].n == 2 && !memcmp(t[11].s, "q\n", 2)); /* escape undone */
        CHECKF(t[6].n == 2 && !memcmp(t[6].s, ">=", 2) && t[7].i == 2 && t[9].line == 3, "line %d", t[9].line);
    }
    const char *bad[] = {"{{ 'open", "{% if x", "{# never", "{{ x $ y }}", "{{ 99999999999999999999 }}"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        CHECKF(jlex_run(a, bad[i], strlen(bad[i]), &t, &n, &err) != KV_OK, "%s lexed", bad[i]);
    jv_arena_destroy(a);
}

static void test_values(void)
{
    char buf[64];
    static const struct {
        double f;
        const char *want;
    } fl[] = {{1.0, "1.0"}, {0.1, "0.1"}, {1e16, "1e+16"}, {1e15, "1000000000000000.0"}, {1.5e-5, "1.5e-05"},
              {0.0001, "0.0001"}, {-2.5, "-2.5"}, {123456789.125, "123456789.125"}, {1.0 / 3, "0.3333333333333333"}};
    for (size_t i = 0; i < sizeof fl / sizeof fl[0]; i++) {
        jv_float_repr(fl[i].f, buf, sizeof buf);
        CHECKF(strcmp(buf, fl[i].want) == 0, "repr(%g) = %s, want %s", fl[i].f, buf, fl[i].want);
    }
    jv_arena *a = jv_arena_create(1 << 20);
    CHECK(jv_eq(jv_int(1), jv_float(1.0)) && jv_eq(jv_bool(1), jv_int(1)) && !jv_eq(jv_cstr(a, "1"), jv_int(1)));
    int c = 0;
    CHECK(jv_cmp(jv_cstr(a, "a"), jv_int(1), &c) < 0);
    CHECK(jv_cmp(jv_cstr(a, "ab"), jv_cstr(a, "b"), &c) == 0 && c < 0);
    CHECK(jv_utf8_len("caf\xc3\xa9", 5) == 4);
    /* json.dumps(ensure_ascii=False) */
    json_t *j = json_loads("{\"a\": [1, 2.0, null, \"\\u00e9\\n\\u0001\"], \"b\": {}}", 0, NULL);
    jv v = jjson_from(a, j), out;
    char emsg[256];
    jjson_opts o = {.indent = -1};
    CHECK(jjson_dumps(a, v, &o, &out, emsg, sizeof emsg) == 0 &&
          strcmp(out.u.s->s, "{\"a\": [1, 2.0, null, \"\xc3\xa9\\n\\u0001\"], \"b\": {}}") == 0);
    o.indent = 1;
    CHECK(jjson_dumps(a, v, &o, &out, emsg, sizeof emsg) == 0 &&
          strcmp(out.u.s->s, "{\n \"a\": [\n  1,\n  2.0,\n  null,\n  \"\xc3\xa9\\n\\u0001\"\n ],\n \"b\": {}\n}") == 0);
    CHECK(jjson_dumps(a, jv_undef_named(a, "x", NULL), &o, &out, emsg, sizeof emsg) < 0 &&
          strstr(emsg, "not JSON serializable"));
    json_decref(j);
    /* the arena's budget is a limit, not a crash */
    jv_arena *small = jv_arena_create(1000);
    CHECK(jv_alloc(small, 500) != NULL && jv_alloc(small, 100000) == NULL);
    jv_arena_destroy(small);
    jv_arena_destroy(a);
}

/* An untrusted template meets limits and errors, never a crash. */
static void test_limits(void)
{
    kvant_err err = {0};
    jinja_limits lim = jinja_limits_default();
    lim.max_iters = 1000;
    char *s = render("{% for i in range(100) %}{% for j in range(100) %}{% endfor %}{% endfor %}", NULL, &lim, &err);
    CHECKF(!s && strstr(err.msg, "loop iterations"), "%s", err.msg);
    lim = jinja_limits_default();
    lim.max_output = 1000;
    s = render("{% for i in range(1000) %}xxxxxxxx{% endfor %}", NULL, &lim, &err);
    CHECKF(!s && strstr(err.msg, "output larger"), "%s", err.msg);
    s = render("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", NULL, NULL, &err);
    CHECKF(!s && strstr(err.msg, "nested deeper"), "%s", err.msg);
    s = render("{{ 'x' * 100000000000 }}", NULL, NULL, &err);
    CHECK(!s);
    s = render("{{ range(1000000) | length }}", NULL, NULL, &err);
    CHECKF(!s && strstr(err.msg, "Range too big"), "%s", err.msg);
    /* a left-deep chain the parser builds by iteration, and data nested by a loop */
    static char chain[40000];
    size_t ck = (size_t)snprintf(chain, sizeof chain, "{{ 1");
    for (int i = 0; i < 5000; i++)
        ck += (size_t)snprintf(chain + ck, sizeof chain - ck, " + 1");
    snprintf(chain + ck, sizeof chain - ck, " }}");
    s = render(chain, NULL, NULL, &err);
    CHECKF(!s && strstr(err.msg, "nested deeper"), "%s", err.msg);
    s = render("{% set ns = namespace(x=[], y=[]) %}{% for i in range(5000) %}{% set ns.x = [ns.x] %}"
               "{% set ns.y = [ns.y] %}{% endfor %}{{ ns.x == ns.x }}{{ ns.x == ns.y }}{{ ns.x | length }}",
               NULL, NULL, &err);
    CHECKF(s && strcmp(s, "TrueFalse1") == 0, "%s", s ? s : err.msg); /* jinja2: RecursionError */
    free(s);
    s = render("{{ 9223372036854775807 + 1 }}", NULL, NULL, &err);
    CHECKF(!s && strstr(err.msg, "overflow"), "%s", err.msg);
    /* deep nesting is refused at compile time */
    char deep[4096];
    size_t k = 0;
    k += (size_t)snprintf(deep + k, sizeof deep - k, "{{ ");
    for (int i = 0; i < 1000; i++)
        deep[k++] = '(';
    deep[k] = '\0';
    jinja_tpl *t = NULL;
    CHECK(jinja_compile(deep, strlen(deep), &t, &err) != KV_OK && t == NULL);
    k = 0;
    for (int i = 0; i < 300; i++)
        k += (size_t)snprintf(deep + k, sizeof deep - k, "{%% if 1 %%}");
    CHECK(jinja_compile(deep, strlen(deep), &t, &err) != KV_OK && strstr(err.msg, "nested"));
}

int main(void)
{
    setenv("TZ", "UTC", 1); /* strftime_now formats local time */
    tzset();
    json_t *vars = json_loads(VARS, 0, NULL);
    CHECK(vars != NULL);
    test_cases(vars);
    json_decref(vars);
    test_lexer();
    test_values();
    test_limits();
    return tu_finish("test_jinja");
}
