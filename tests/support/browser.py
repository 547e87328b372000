"""A real browser for the tests: Debian's headless Chromium, driven over the DevTools protocol.

No driver download (test tools' own browser downloads fail here): Chromium is started with
``--remote-debugging-port=0`` and a fresh ``--user-data-dir``, the port is read from the
``DevToolsActivePort`` file it writes there, and the page target is driven over its websocket with
the ``websockets`` client (synchronous API): navigate, evaluate JavaScript, click with real mouse
events (``Input.dispatchMouseEvent``), collect console errors and uncaught exceptions, take a PNG
screenshot. Flags: the ones that work offline on a machine without a network:
``--headless --no-sandbox --disable-gpu --disable-background-networking ...``.

``.ci/run`` installs Chromium (``apt-get install -y chromium``) before the tests; `chromium_path`
finds it, and tests skip only when it is absent outside CI.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-default-apps", "--disable-extensions", "--mute-audio", "--hide-scrollbars")


def chromium_path() -> str | None:
    """The Chromium binary (``STEPWISE_CHROMIUM``, else ``chromium`` / ``chromium-browser`` on PATH)."""
    return os.environ.get("STEPWISE_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")


class Browser:
    """One headless Chromium with one page; use as a context manager."""

    def __init__(self, *, width: int = 1280, height: int = 1600, timeout: float = 60.0) -> None:
        binary = chromium_path()
        if binary is None:
            raise FileNotFoundError("chromium is not installed (apt-get install -y chromium; .ci/run does it)")
        self.profile = tempfile.mkdtemp(prefix="stepwise-chromium-")
        self.timeout = timeout
        self.proc = subprocess.Popen([binary, *FLAGS, f"--user-data-dir={self.profile}", "--remote-debugging-port=0",
                                      f"--window-size={width},{height}", "about:blank"],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        port_file = Path(self.profile) / "DevToolsActivePort"
        deadline = time.monotonic() + timeout
        while not (port_file.is_file() and port_file.read_text().strip()):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.close()
                raise RuntimeError(f"chromium did not open its DevTools port (exit code {self.proc.poll()})")
            time.sleep(0.1)
        port = int(port_file.read_text().split()[0])
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10) as resp:
            page = next(t for t in json.loads(resp.read()) if t["type"] == "page")
        from websockets.sync.client import connect

        self._connection = connect(page["webSocketDebuggerUrl"], max_size=None, open_timeout=timeout)
        self.ws = self._connection.__enter__()
        self._id = 0
        self.events: list[dict[str, Any]] = []
        for domain in ("Page", "Runtime", "Log"):
            self.send(f"{domain}.enable")
        self.send("Emulation.setDeviceMetricsOverride", width=width, height=height, deviceScaleFactor=1, mobile=False)

    def __enter__(self) -> "Browser":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        try:
            if getattr(self, "_connection", None) is not None:
                self._connection.__exit__(None, None, None)
        finally:
            if self.proc.poll() is None:
                self.proc.terminate()
                try:
                    self.proc.wait(10)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait(10)
            shutil.rmtree(self.profile, ignore_errors=True)

    def send(self, method: str, **params: Any) -> dict[str, Any]:
        """One DevTools command; returns its result (events seen meanwhile are kept in ``events``)."""
        self._id += 1
        my = self._id
        self.ws.send(json.dumps({"id": my, "method": method, "params": params}))
        deadline = time.monotonic() + self.timeout
        while True:
            msg = json.loads(self.ws.recv(timeout=max(0.1, deadline - time.monotonic())))
            if msg.get("id") == my:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg.get("result", {})
            if "method" in msg:
                self.events.append(msg)

    def wait_event(self, method: str) -> dict[str, Any]:
        deadline = time.monotonic() + self.timeout
        while True:
            for ev in self.events:
                if ev["method"] == method:
                    self.events.remove(ev)
                    return ev
            msg = json.loads(self.ws.recv(timeout=max(0.1, deadline - time.monotonic())))
            if "method" in msg:
                self.events.append(msg)

    def open(self, url: str) -> None:
        """Navigate and wait for the load event."""
        self.send("Page.navigate", url=url)
        self.wait_event("Page.loadEventFired")

    def js(self, expression: str) -> Any:
        """Evaluate ``expression`` in the page; its value (JSON-able). Raises on a thrown exception."""
        result = self.send("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression[:80]}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def click(self, selector: str) -> None:
        """Scroll the first element matching ``selector`` into view and click its middle with the mouse."""
        box = self.js(f"(() => {{ const e = document.querySelector({json.dumps(selector)}); e.scrollIntoView({{block: 'center'}});"
                      "const r = e.getBoundingClientRect(); return [r.x + Math.min(r.width / 2, 40), r.y + r.height / 2]; })()")
        x, y = box
        for kind in ("mouseMoved", "mousePressed", "mouseReleased"):
            self.send("Input.dispatchMouseEvent", type=kind, x=x, y=y, button="left", clickCount=1)

    def console_errors(self) -> list[str]:
        """Console errors, uncaught exceptions and error log entries seen so far."""
        out = []
        for ev in self.events:
            p = ev.get("params", {})
            if ev["method"] == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
                out.append(" ".join(str(a.get("value", a.get("description", ""))) for a in p.get("args", [])))
            elif ev["method"] == "Runtime.exceptionThrown":
                out.append(str(p.get("exceptionDetails", {}).get("text")))
            elif ev["method"] == "Log.entryAdded" and p.get("entry", {}).get("level") == "error":
                out.append(str(p["entry"].get("text")))
        return out

    def screenshot(self, path: Path, *, full_page: bool = False) -> Path:
        """A PNG of the viewport (or the whole page) at ``path``."""
        params: dict[str, Any] = {"format": "png"}
        if full_page:
            params["captureBeyondViewport"] = True
            w, h = self.js("[document.documentElement.scrollWidth, document.documentElement.scrollHeight]")
            params["clip"] = {"x": 0, "y": 0, "width": w, "height": min(h, 12000), "scale": 1}
        data = self.send("Page.captureScreenshot", **params)["data"]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(data))
        return path
