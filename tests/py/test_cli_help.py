"""The newcomer path of the kvant CLI: `kvant --help` and every subcommand's `--help` list every
option its parser accepts, each with a default (or marked required); mistakes (unknown option or
command, missing argument or value) give exactly one line on stderr naming the help command and
exit 2; `kvant serve` prints where it listens and a curl that works when pasted.

The accepted options are derived independently of the help text: every C string literal that is
an option spelling ("-x" or "--word") in src/cli/cmd_NAME.c and src/cli/cli_common.c, so adding an
option to a parser without documenting it fails here."""
from __future__ import annotations

import json
import re
import shlex
import subprocess
from pathlib import Path

import httpx
import pytest

from server_util import KvantServer

ROOT = Path(__file__).resolve().parents[2]
CLI = ROOT / "src" / "cli"
HELP_COL = 30  # column where help text starts (CLI_HELP_COL in cli_common.c)

OPT_LITERAL = re.compile(r'"(--?[A-Za-z][A-Za-z0-9-]*)"')


def run(kvant_bin, *args, timeout=60):
    return subprocess.run([kvant_bin, *args], capture_output=True, text=True, timeout=timeout)


def c_source(path: Path) -> str:
    """The file without comments (an option named in a comment is not an accepted option)."""
    text = path.read_text()
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    return re.sub(r"//[^\n]*", " ", text)


def option_literals(*files: str) -> set[str]:
    out = set()
    for f in files:
        out |= set(OPT_LITERAL.findall(c_source(CLI / f)))
    return out


def subcommands() -> list[str]:
    """The command table of main.c: {"name", cmd_fn, "help"}."""
    names = re.findall(r'\{"(\w+)",\s*cmd_\w+,', c_source(CLI / "main.c"))
    assert len(names) >= 10, names  # the table is where this regex expects it
    return names


SUBCOMMANDS = subcommands()
COMMON = option_literals("cli_common.c")
# `perplexity --kl-base` hands the whole command line to cmd_kl.c, so perplexity may document
# options of cmd_kl.c as well (the reverse check below).
ALSO_ACCEPTS = {"perplexity": ["cmd_kl.c"]}
# options parsed and documented by a shared cli_*_parse / cli_*_help pair in their own file:
# part of what the command accepts (so they must be listed too)
SHARED_PARSERS = {"serve": ["cli_spec.c", "cli_kvtier.c"], "run": ["cli_spec.c"], "bench": ["cli_spec.c"]}
# `kvant top` talks to a running server: it takes no model or engine options (only -h/--help
# from cli_common.c, through cli_is_help).
NO_COMMON = {"top"}


def help_rows(text: str) -> list[tuple[list[str], str]]:
    """(option spellings, help text with continuation lines joined) for each table row."""
    rows: list[tuple[list[str], str]] = []
    for line in text.splitlines():
        if line.startswith("  -"):
            # "  NAMES ARG  text": two spaces at least before the text (or none: a long
            # left column sits alone on its line)
            left, _, txt = line[2:].partition("  ")
            names = [part.split()[0] for part in left.split(", ")]
            rows.append((names, txt.strip()))
        elif rows and line.startswith(" " * HELP_COL) and line.strip():
            names, txt = rows[-1]
            rows[-1] = (names, (txt + " " + line.strip()).strip())
    return rows


def check_one_line_error(p, *needles):
    assert p.returncode == 2, (p.returncode, p.stdout, p.stderr)
    assert p.stdout == "", p.stdout
    lines = p.stderr.splitlines()
    assert len(lines) == 1, p.stderr
    for n in needles:
        assert n in lines[0], (n, lines[0])


def test_option_derivation_sees_known_options():
    # the derivation itself can fail: it must see options we know each parser has
    assert {"-m", "--model", "-t", "--kv-dtype", "--json", "--device-memory",
            "--memory-utilization", "--act-q8"} <= COMMON
    assert {"-p", "--temp", "--seed", "--chat"} <= option_literals("cmd_run.c")
    assert {"--port", "--max-num-seqs", "--drain-timeout", "-c"} <= option_literals("cmd_serve.c")
    assert {"-p", "-n", "-r", "--batch", "--roofline"} <= option_literals("cmd_bench.c")


@pytest.mark.parametrize("cmd", SUBCOMMANDS)
def test_subcommand_help_lists_every_option(kvant_bin, cmd):
    p = run(kvant_bin, cmd, "--help")
    assert p.returncode == 0, p.stderr
    assert p.stderr == ""
    assert p.stdout.startswith(f"usage: kvant {cmd}"), p.stdout[:200]
    rows = help_rows(p.stdout)
    documented = {n for names, _ in rows for n in names}
    accepted = (option_literals(f"cmd_{cmd}.c") | {"-h", "--help"} if cmd in NO_COMMON
                else option_literals(f"cmd_{cmd}.c", "cli_common.c",
                                     *SHARED_PARSERS.get(cmd, [])))
    missing = accepted - documented
    assert not missing, f"`kvant {cmd} --help` does not list {sorted(missing)}"
    # nothing documented that no parser accepts
    known = accepted | option_literals(*ALSO_ACCEPTS.get(cmd, []))
    assert documented <= known, f"documented but not parsed: {sorted(documented - known)}"
    # every row states its default or that it is required
    for names, txt in rows:
        if "--help" in names:
            continue
        assert "(default: " in txt or "required" in txt, f"{cmd} {names}: {txt!r}"


def test_top_level_help(kvant_bin):
    p = run(kvant_bin, "--help")
    assert p.returncode == 0 and p.stderr == ""
    for cmd in SUBCOMMANDS:
        assert re.search(rf"^  {cmd}\s", p.stdout, re.M), cmd
    documented = {n for names, _ in help_rows(p.stdout) for n in names}
    assert COMMON - {"-h", "--help"} <= documented, sorted(COMMON - documented)
    assert run(kvant_bin, "-h").stdout == p.stdout
    assert run(kvant_bin, "help").stdout == p.stdout
    # `kvant help CMD` is `kvant CMD --help`
    q = run(kvant_bin, "help", "run")
    assert q.returncode == 0 and q.stdout == run(kvant_bin, "run", "--help").stdout


def test_help_defaults_match_the_code(kvant_bin, default_model):
    """The defaults printed are those the parser applies (here: what `plan` reports)."""
    rows = dict((names[-1], txt) for names, txt in help_rows(run(kvant_bin, "--help").stdout))
    plan = json.loads(run(kvant_bin, "plan", "-m", default_model, "--json").stdout)["plans"][0]
    kv = re.search(r"\(default: (\w+)\)", rows["--kv-dtype"]).group(1)
    assert kv == plan["plan"]["kv_dtype"] == "f16"
    util = float(re.search(r"\(default: ([0-9.]+)\)", rows["--memory-utilization"]).group(1))
    assert util == pytest.approx(plan["plan"]["utilization"])
    srows = dict((names[-1], txt) for names, txt in
                 help_rows(run(kvant_bin, "serve", "--help").stdout))
    assert "(default: 8080)" in srows["--port"] and "(default: 127.0.0.1)" in srows["--host"]


@pytest.mark.parametrize("cmd", SUBCOMMANDS)
def test_unknown_option_is_one_line_exit_2(kvant_bin, cmd):
    p = run(kvant_bin, cmd, "--no-such-option")
    check_one_line_error(p, "'--no-such-option'", f"kvant {cmd} --help")


@pytest.mark.parametrize("args", [["frobnicate"], ["--frobnicate"], [], ["help", "frobnicate"]])
def test_unknown_or_missing_command_is_one_line_exit_2(kvant_bin, args):
    p = run(kvant_bin, *args)
    check_one_line_error(p, "kvant --help", *[f"'{a}'" for a in args if a != "help"])


@pytest.mark.parametrize("args,needle", [
    (["run"], "-p PROMPT"),
    (["run", "-n", "4"], "-p PROMPT"),
    (["tokenize"], "-p TEXT"),
    (["perplexity"], "-f FILE"),
    (["kl", "-f", "x.txt"], "--base"),
    (["logits", "--tokens-file", "ids.txt"], "--out"),
    (["quantize", "in.gguf"], "OUT.gguf"),
    (["quantize", "in.gguf", "out.gguf"], "--type"),
    (["run", "-p"], "-p"),                   # an option without its value
    (["serve", "--port"], "--port"),
    (["run", "-p", "x", "-t", "many"], "-t"),  # a bad value
])
def test_missing_argument_is_one_line_exit_2(kvant_bin, args, needle):
    check_one_line_error(run(kvant_bin, *args), needle)


def parse_curl(line: str, env: dict[str, str]):
    """(url, headers, body) of the curl command line kvant printed."""
    argv = shlex.split(line)
    assert argv[0] == "curl", line
    url, headers, body = None, {}, None
    i = 1
    while i < len(argv):
        a = argv[i]
        if a in ("-H", "-d"):
            v = argv[i + 1]
            for k, x in env.items():
                v = v.replace("$" + k, x)
            if a == "-H":
                k, _, x = v.partition(":")
                headers[k.strip()] = x.strip()
            else:
                body = v
            i += 2
            continue
        if a.startswith("http://"):
            url = a
        i += 1
    return url, headers, body


def test_serve_prints_address_and_a_working_curl(kvant_bin, default_model):
    name = "it's a \"quoted\" model"  # both quote kinds must survive shell and JSON
    key = "sekret-key-123"
    srv = KvantServer(kvant_bin, default_model, "--served-model-name", name, "--api-key", key)
    try:
        log = srv.log_text()
        assert f"listening on {srv.url}" in log, log
        assert f"ready on {srv.url}" in log, log
        assert key not in log  # the key stays out of the log
        curl = [ln for ln in log.splitlines() if ln.lstrip().startswith("curl ")]
        assert len(curl) == 1, log
        url, headers, body = parse_curl(curl[0], {"KVANT_API_KEY": key})
        assert url == srv.url + "/v1/chat/completions"
        req = json.loads(body)
        assert req["model"] == name
        req["max_tokens"] = 4  # keep the test short; the printed request is otherwise as is
        r = httpx.post(url, headers=headers, json=req, timeout=60)
        assert r.status_code == 200, r.text
        out = r.json()
        assert out["model"] == name and out["choices"][0]["message"]["role"] == "assistant"
    finally:
        assert srv.stop() == 0, srv.log_text()
