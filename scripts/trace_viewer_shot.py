#!/usr/bin/env python3
"""Screenshot a catapult trace2html page with chromium-headless-shell over the DevTools
protocol (stdlib only). --screenshot with --virtual-time-budget is not enough: the viewer
imports in requestAnimationFrame/idle steps that virtual time does not drive, so we wait in
real time until the model is loaded, then capture.
  trace_viewer_shot.py PAGE.html OUT.png [WIDTH HEIGHT]     (env SELECT=slice-name: select it)"""
import base64, json, os, re, shutil, signal, socket, struct, subprocess, sys, tempfile, time, urllib.request

html, out = os.path.abspath(sys.argv[1]), sys.argv[2]
W, H = (int(sys.argv[3]), int(sys.argv[4])) if len(sys.argv) > 4 else (1600, 900)
browser = shutil.which("chromium-headless-shell") or shutil.which("chromium")
if not browser:
    sys.exit("needs chromium-headless-shell (apt-get install chromium-headless-shell)")


class WS:  # minimal RFC 6455 client: text frames, client masking, fragmentation
    def __init__(self, url):
        m = re.match(r"ws://([^:/]+):(\d+)(/.*)", url)
        self.s = socket.create_connection((m[1], int(m[2])), timeout=60)
        key = base64.b64encode(os.urandom(16)).decode()
        self.s.sendall((f"GET {m[3]} HTTP/1.1\r\nHost: {m[1]}:{m[2]}\r\nUpgrade: websocket\r\n"
                        f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
                        "Sec-WebSocket-Version: 13\r\n\r\n").encode())
        self.buf = b""
        while b"\r\n\r\n" not in self.buf:
            self.buf += self.s.recv(4096)
        head, self.buf = self.buf.split(b"\r\n\r\n", 1)
        assert b" 101 " in head.split(b"\r\n")[0], head
        self.n = 0

    def _read(self, k):
        while len(self.buf) < k:
            d = self.s.recv(1 << 20)
            if not d:
                raise EOFError
            self.buf += d
        r, self.buf = self.buf[:k], self.buf[k:]
        return r

    def send(self, method, **params):
        self.n += 1
        data = json.dumps({"id": self.n, "method": method, "params": params}).encode()
        hdr = bytes([0x81])
        L = len(data)
        hdr += bytes([0x80 | L]) if L < 126 else (bytes([0xFE]) + struct.pack(">H", L) if L < 65536
                                                  else bytes([0xFF]) + struct.pack(">Q", L))
        mask = os.urandom(4)
        self.s.sendall(hdr + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(data)))
        while True:  # skip events until our reply
            msg = json.loads(self.recv())
            if msg.get("id") == self.n:
                if "error" in msg:
                    raise RuntimeError(msg["error"])
                return msg["result"]

    def recv(self):
        payload = b""
        while True:
            b0, b1 = self._read(2)
            L = b1 & 0x7F
            if L == 126:
                L = struct.unpack(">H", self._read(2))[0]
            elif L == 127:
                L = struct.unpack(">Q", self._read(8))[0]
            payload += self._read(L)
            if b0 & 0x80:
                return payload.decode()


signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so `finally` stops the browser
prof = tempfile.mkdtemp(prefix="cdpshot-")
proc = subprocess.Popen([browser, "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                         f"--window-size={W},{H}", "--remote-debugging-port=0",
                         f"--user-data-dir={prof}", "about:blank"],
                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                        start_new_session=True)  # Debian's wrapper is a shell script: stop the group
try:
    portfile = os.path.join(prof, "DevToolsActivePort")
    for _ in range(200):
        if os.path.exists(portfile) and open(portfile).read().count("\n") >= 1:
            break
        time.sleep(0.1)
    port = open(portfile).read().split()[0]
    pages = json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list"))
    ws = WS([p for p in pages if p["type"] == "page"][0]["webSocketDebuggerUrl"])
    ws.send("Emulation.setDeviceMetricsOverride", width=W, height=H, deviceScaleFactor=1, mobile=False)
    ws.send("Page.enable")
    ws.send("Page.navigate", url="file://" + html)
    state = None
    for _ in range(600):  # up to 60 s: trace viewer imports asynchronously
        r = ws.send("Runtime.evaluate", returnByValue=True, expression="""(() => {
            // tr.ui.b.Overlay is an <overlay class=overlay>, in the body only while shown
            // ("Importing...", "Import error"); its title is only in its rendered text
            const ov = Array.prototype.slice.call(document.querySelectorAll('.overlay') || []);
            const err = ov.map(o => o.innerText || '').filter(t => /^\s*(Import )?error/i.test(t));
            if (err.length) return 'error: ' + err.join(' | ').replace(/\s*\u2715\s*/g, ': ');
            if (typeof g_timelineViewEl === 'undefined' || !g_timelineViewEl.model || ov.length) return 'loading';
            return 'ok';
        })()""")
        state = r["result"].get("value", json.dumps(r)[:300])
        if state != "loading":
            break
        time.sleep(0.1)
    if state != "ok":
        png = ws.send("Page.captureScreenshot", format="png")["data"]  # shows what went wrong
        open(out, "wb").write(base64.b64decode(png))
        sys.exit(f"trace viewer did not load the trace: {state}")
    # show flow arrows (off by default per category) and, if SELECT=name, select the first such
    # slice so its args appear in the bottom panel
    ws.send("Runtime.evaluate", expression="""(() => {
        const v = g_timelineViewEl, m = v.model;
        for (const e of m.flowEvents) for (const c of tr.b.getCategoryParts(e.category)) v.selectedFlowEvents.add(c);
        const sel = %s;
        if (sel) {
            for (const ev of m.getDescendantEvents()) {
                if (ev instanceof tr.model.ThreadSlice && ev.title === sel) {
                    v.brushingStateController.changeSelectionFromTimeline(new tr.model.EventSet([ev]));
                    break;
                }
            }
        }
        v.trackView_.viewport.dispatchChangeEvent();
    })()""" % json.dumps(os.environ.get("SELECT", "")))
    # what catapult's own importer made of the trace: counts and its import warnings
    rep = ws.send("Runtime.evaluate", returnByValue=True, expression="""(() => {
        const m = g_timelineViewEl.model;
        return {processes: m.getAllProcesses().length, threads: m.getAllThreads().length,
                slices: m.getAllThreads().reduce((n, t) => n + t.sliceGroup.length, 0),
                flows: m.flowEvents.length,
                warnings: m.importWarnings.map(w => w.type + ': ' + w.message)};
    })()""")["result"]["value"]
    print("catapult import: %(processes)d processes, %(threads)d threads, %(slices)d slices, "
          "%(flows)d flows, %(n)d warnings" % dict(rep, n=len(rep["warnings"])), file=sys.stderr)
    for w in rep["warnings"]:
        print("  import warning:", w, file=sys.stderr)
    time.sleep(1.0)  # let the track view draw
    png = ws.send("Page.captureScreenshot", format="png")["data"]
    open(out, "wb").write(base64.b64decode(png))
    print(out)
finally:
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(10)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    shutil.rmtree(prof, ignore_errors=True)
