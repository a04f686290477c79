"""/dashboard in headless Chromium (Debian `chromium`): screenshots of the page against an idle
server and against the same server under load; the KV block map region must show used-block
colours only under load.  Every request the browser makes goes through a recording proxy (no
bypass, not even for loopback): all of the page's requests must be to the kvant server.
The loaded screenshot is kept as build/test-results/dashboard-loaded.png (docs/SERVER.md).

Marked `alone`: Chromium's renderer, four decoding streams and another test's server on two
cores once left headless Chromium without a screenshot for 120 s (CI).  A Chromium run that makes no
screenshot in 90 s is killed with its whole process group and run once more.
"""
from __future__ import annotations

import http.client
import http.server
import os
import shutil
import signal
import socketserver
import subprocess
import threading
import time
import urllib.parse
import zlib
from pathlib import Path

import httpx
import numpy as np
import pytest

from server_util import free_port, server  # noqa: F401  (fixture)

ROOT = Path(__file__).resolve().parent.parent.parent
# The map canvas: 512x256 CSS pixels at the top left of the page (see dashboard.html).
MAP_BOX = (16, 56, 520, 300)  # x0, y0, x1, y1 in screenshot pixels (inside the canvas)
FREE, CACHED = (51, 51, 51), (43, 79, 122)

pytestmark = pytest.mark.alone


def read_png(path: Path) -> np.ndarray:
    """Minimal PNG reader (8-bit RGB/RGBA, non-interlaced) -> [H, W, 3] uint8."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, w = 8, b"", 0
    while pos < len(data):
        n = int.from_bytes(data[pos:pos + 4], "big")
        typ, body = data[pos + 4:pos + 8], data[pos + 8:pos + 8 + n]
        if typ == b"IHDR":
            w, h, depth, ctype, _, _, interlace = (int.from_bytes(body[0:4], "big"),
                                                   int.from_bytes(body[4:8], "big"), *body[8:13])
            assert depth == 8 and ctype in (2, 6) and interlace == 0, (depth, ctype, interlace)
            bpp = 3 if ctype == 2 else 4
        elif typ == b"IDAT":
            idat += body
        pos += 12 + n
    raw = zlib.decompress(idat)
    stride = w * bpp
    out = np.zeros((h, stride), dtype=np.int32)
    prev = np.zeros(stride, dtype=np.int32)
    for y in range(h):
        f = raw[y * (stride + 1)]
        line = np.frombuffer(raw, dtype=np.uint8, count=stride, offset=y * (stride + 1) + 1).astype(np.int32)
        cur = np.zeros(stride, dtype=np.int32)
        if f == 0:
            cur = line
        elif f == 2:
            cur = (line + prev) & 255
        else:
            for x in range(stride):
                a = cur[x - bpp] if x >= bpp else 0
                b = prev[x]
                c = prev[x - bpp] if x >= bpp else 0
                if f == 1:
                    p = a
                elif f == 3:
                    p = (a + b) // 2
                else:  # Paeth
                    pa, pb, pc = abs(b - c), abs(a - c), abs(a + b - 2 * c)
                    p = a if pa <= pb and pa <= pc else b if pb <= pc else c
                cur[x] = (line[x] + p) & 255
        out[y] = cur
        prev = cur
    return out.reshape(h, w, bpp)[:, :, :3].astype(np.uint8)


class RecordingProxy(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True


def make_proxy(allowed_port: int):
    seen: list[str] = []

    class H(http.server.BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def do_GET(self):
            seen.append((self.path, self.headers.get("Referer", "")))
            u = urllib.parse.urlsplit(self.path)
            if u.hostname != "127.0.0.1" or u.port != allowed_port:
                self.send_error(403)
                return
            c = http.client.HTTPConnection("127.0.0.1", allowed_port, timeout=30)
            hdrs = {k: v for k, v in self.headers.items() if k.lower() not in ("proxy-connection", "connection")}
            c.request("GET", u.path + (("?" + u.query) if u.query else ""), headers=hdrs)
            r = c.getresponse()
            body = r.read()
            self.send_response(r.status)
            for k, v in r.getheaders():
                if k.lower() not in ("transfer-encoding", "connection", "content-length"):
                    self.send_header(k, v)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(body)

        do_POST = do_GET

        def do_CONNECT(self):
            seen.append(("CONNECT " + self.path, self.headers.get("Referer", "")))
            self.send_error(403)

    return H, seen


def screenshot(chromium: str, url: str, proxy_port: int, out: Path, profile: Path) -> None:
    cmd = [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
           "--no-first-run", "--disable-extensions", "--disable-background-networking",
           "--disable-component-update", "--disable-sync", "--disable-default-apps",
           "--force-device-scale-factor=1", "--window-size=1200,800",
           f"--user-data-dir={profile}", f"--proxy-server=http://127.0.0.1:{proxy_port}",
           "--proxy-bypass-list=<-loopback>", "--virtual-time-budget=4000",
           f"--screenshot={out}", url]
    hung = []
    for attempt in range(2):
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             start_new_session=True)
        try:
            _, err = p.communicate(timeout=90)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)  # the browser and its renderer/zygote children
            _, err = p.communicate()
            hung.append(err[-1000:])
            continue
        assert p.returncode == 0 and out.is_file(), err[-2000:]
        return
    pytest.fail(f"headless Chromium made no screenshot in 2 x 90 s: {hung}")


def used_pixels(img: np.ndarray) -> int:
    x0, y0, x1, y1 = MAP_BOX
    reg = img[y0:y1, x0:x1].reshape(-1, 3).astype(int)
    bg = (np.abs(reg - 17).sum(1) <= 6) | (np.abs(reg - FREE).sum(1) <= 6) | \
         (np.abs(reg - CACHED).sum(1) <= 6)
    saturated = (reg.max(1) - reg.min(1)) > 60  # request colours are saturated hues
    return int((~bg & saturated).sum())


def test_dashboard_idle_vs_loaded(server, tmp_path, results_dir):
    chromium = shutil.which("chromium")
    if chromium is None:
        pytest.fail("chromium missing: install the Debian package `chromium` "
                    "(scripts/setup-deps.sh)", pytrace=False)
    H, seen = make_proxy(server.port)
    pport = free_port()
    proxy = RecordingProxy(("127.0.0.1", pport), H)
    pt = threading.Thread(target=proxy.serve_forever, daemon=True)
    pt.start()
    url = f"http://127.0.0.1:{server.port}/dashboard"
    stop = threading.Event()
    loaders = []
    try:
        server.wait_idle(server.metrics()["kvant_kv_blocks_used"])
        idle_png = tmp_path / "idle.png"
        screenshot(chromium, url, pport, idle_png, tmp_path / "p1")

        def load(i):
            body = {"prompt": f"Story {i}: once upon a time " * 8, "max_tokens": 1500,
                    "stream": True, "ignore_eos": True}
            with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=300) as r:
                for _ in r.iter_lines():
                    if stop.is_set():
                        break
        loaders = [threading.Thread(target=load, args=(i,)) for i in range(4)]
        for t in loaders:
            t.start()
        deadline = time.time() + 60
        while server.metrics()["kvant_kv_blocks_used"] < 24 and time.time() < deadline:
            time.sleep(0.2)
        loaded_png = tmp_path / "loaded.png"
        screenshot(chromium, url, pport, loaded_png, tmp_path / "p2")
    finally:
        stop.set()
        for t in loaders:
            t.join(120)
        proxy.shutdown()
    idle, loaded = read_png(idle_png), read_png(loaded_png)
    n_idle, n_loaded = used_pixels(idle), used_pixels(loaded)
    shutil.copy(loaded_png, results_dir / "dashboard-loaded.png")
    assert n_idle == 0, f"idle map shows {n_idle} used-block pixels"
    assert n_loaded >= 24 * 4, f"loaded map shows only {n_loaded} used-block pixels"
    # the map region itself was drawn (free cells) in both
    assert (np.abs(idle[MAP_BOX[1]:MAP_BOX[3], MAP_BOX[0]:MAP_BOX[2]].astype(int) - FREE).sum(2) <= 6).sum() > 1000
    # The page's requests: the navigation to /dashboard and whatever carries it as Referer.
    # (Chromium's own background traffic, e.g. its clock check, has no Referer; the proxy
    # refuses it anyway, and the page's Content-Security-Policy allows only 'self'.)
    origin = f"http://127.0.0.1:{server.port}/"
    page = [p for p, ref in seen if ref.startswith(origin) or p == url]
    assert any(p == url for p in page), seen
    paths = [urllib.parse.urlsplit(p) for p in page]
    assert all(not p.startswith("CONNECT") for p in page), page
    assert all((u.hostname, u.port) == ("127.0.0.1", server.port) for u in paths), page
    assert {u.path for u in paths} >= {"/dashboard", "/v1/memory", "/v1/memory/blocks"}, seen
