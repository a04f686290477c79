"""scripts/check-layers on small trees made here: it passes a layered tree
and fails, naming the fault, on a ring between modules, an include of a
floor above, a file or a function over its length.  (`make layers` runs it
on src/ itself.)"""
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CHECK = os.path.join(ROOT, "scripts", "check-layers")

FLOORS = "top   top\nlow   low\n"


def tree(tmp, files):
    for path, text in files.items():
        p = tmp / path
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return tmp


def check(root):
    r = subprocess.run([sys.executable, CHECK, "--root", str(root)], capture_output=True, text=True)
    return r.returncode, r.stdout + r.stderr


def base():
    return {
        "src/FLOORS": FLOORS,
        "src/low/l.h": "int l(void);\n",
        "src/low/l.c": '#include "low/l.h"\nint l(void)\n{\n    return 1;\n}\n',
        "src/top/t.h": "int t(void);\n",
        "src/top/t.c": '#include "top/t.h"\n#include "low/l.h"\nint t(void)\n{\n    return l();\n}\n',
    }


def test_layered_tree_passes(tmp_path):
    rc, out = check(tree(tmp_path, base()))
    assert rc == 0, out
    assert "0 rings, 0 upward includes, 0 faults" in out


def test_upward_include_fails(tmp_path):
    f = base()
    f["src/low/l.c"] = '#include "low/l.h"\n#include "top/t.h"\nint l(void)\n{\n    return 1;\n}\n'
    rc, out = check(tree(tmp_path, f))
    assert rc == 1
    assert "src/low/l.c:2: low/l.c (floor low) includes top/t.h (floor top, above)" in out
    assert "ring of 2 modules: src/low/l src/top/t" in out


def test_ring_through_internal_header_fails(tmp_path):
    # a.c calls b (b.h); b.c includes the folder's internal header, which
    # includes a.h: a ring on one floor, no upward include
    f = base()
    f["src/low/a.h"] = "int a(void);\n"
    f["src/low/a.c"] = '#include "low/a.h"\n#include "low/b.h"\nint a(void)\n{\n    return b();\n}\n'
    f["src/low/b.h"] = "int b(void);\n"
    f["src/low/low_internal.h"] = '#include "low/a.h"\n'
    f["src/low/b.c"] = '#include "low/b.h"\n#include "low/low_internal.h"\nint b(void)\n{\n    return 2;\n}\n'
    rc, out = check(tree(tmp_path, f))
    assert rc == 1
    assert "ring of 2 modules: src/low/a src/low/b" in out
    assert "0 upward includes" in out


def test_long_function_and_file_fail(tmp_path):
    f = base()
    f["src/low/big.c"] = "int big(void)\n{\n" + "    int x = 0;\n" * 99 + "    return 0;\n}\n"
    f["src/low/long.c"] = "/* filler */\n" * 1001
    rc, out = check(tree(tmp_path, f))
    assert rc == 1
    assert "src/low/big.c:1: function big is 103 lines (at most 100)" in out
    assert "src/low/long.c: 1001 lines (at most 1000)" in out


def test_file_on_no_floor_fails(tmp_path):
    f = base()
    f["src/elsewhere/e.c"] = "int e(void)\n{\n    return 0;\n}\n"
    rc, out = check(tree(tmp_path, f))
    assert rc == 1
    assert "src/elsewhere/e.c: on no floor of src/FLOORS" in out


def test_ring_of_calls_read_from_objects(tmp_path):
    # no include ties the two files; only their objects' symbols do
    f = base()
    f["src/low/p.c"] = "int q(void);\nint p(void);\nint p(void)\n{\n    return q();\n}\n"
    f["src/low/q.c"] = "int p(void);\nint q(void);\nint q(void)\n{\n    return p();\n}\n"
    root = tree(tmp_path, f)
    build = tmp_path / "build"
    for m in ("low/p", "low/q", "low/l", "top/t"):
        o = build / "obj" / "src" / (m + ".o")
        o.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(["cc", "-c", "-Isrc", "-o", str(o), "src/%s.c" % m], cwd=root, check=True)
    rc, out = check(root)
    assert rc == 0, out  # without the objects the ring is invisible
    r = subprocess.run([sys.executable, CHECK, "--root", str(root), "--objects", str(build)],
                       capture_output=True, text=True)
    assert r.returncode == 1
    assert "ring of 2 modules: src/low/p src/low/q" in r.stdout
    assert "src/low/p calls q (src/low/q)" in r.stdout
