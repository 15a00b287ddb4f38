"""Take the picture of the web console that README.md and docs/index.md show.

    .venv/bin/python -P docs/_hooks/console_shot.py [docs/assets/console.png]

It runs ``cardbus demo`` on a fresh log in a temporary folder, serves that log
with ``cardbus ui`` on a free loopback port, opens the run's page in headless
Chromium (playwright, with the system's ``/usr/bin/chromium``: nothing is
downloaded) and saves a PNG of the page once its Gantt chart is drawn. Run it
again when the console or the demo changes, and commit the picture; the build
does not run it (a picture is not a test, and the docs build stays offline and
browser-free).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "docs" / "assets" / "console.png"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run"]


def _cardbus(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-P", "-m", "cardbus.tools", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        check=True,
        env={k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "CARDBUS_"))},
    )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_ready(url: str, proc: subprocess.Popen[str]) -> None:
    """Until the console answers (it is a separate process: polled, at most 30 s)."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"cardbus ui exited: {proc.stdout.read() if proc.stdout else ''}")
        try:
            with urllib.request.urlopen(url + "api/runs", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.1)
    raise SystemExit("cardbus ui did not answer within 30 s")


def shoot(out: Path = OUT) -> Path:
    from playwright.sync_api import ViewportSize, sync_playwright

    size: ViewportSize = {"width": 1280, "height": 1400}  # the run's header, graph and Gantt

    chromium = shutil.which("chromium") or "/usr/bin/chromium"
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        result = json.loads(_cardbus("demo", "--json", cwd=work).stdout)
        root = result["root_id"]
        port = _free_port()
        url = f"http://127.0.0.1:{port}/"
        server = subprocess.Popen(
            [sys.executable, "-P", "-m", "cardbus.tools", "ui", "--port", str(port)],
            cwd=work,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        try:
            _wait_ready(url, server)
            with sync_playwright() as p:
                browser = p.chromium.launch(
                    executable_path=chromium, args=CHROMIUM_ARGS, headless=True
                )
                try:
                    page = browser.new_page(viewport=size, device_scale_factor=1)
                    page.goto(f"{url}#/run/{root}")
                    page.wait_for_selector("body[data-view='run'] #run-cost .cost")
                    page.wait_for_selector("body[data-live='yes']")  # the live stream is on
                    page.wait_for_selector("body[data-view='run'] #gantt div")
                    out.parent.mkdir(parents=True, exist_ok=True)
                    page.screenshot(path=str(out), full_page=False)
                finally:
                    browser.close()
        finally:
            server.terminate()
            server.communicate(timeout=10)
    return out


if __name__ == "__main__":
    print(shoot(Path(sys.argv[1]) if len(sys.argv) > 1 else OUT))
