"""The system's headless Chromium for the console's browser tests (the ``browser`` and
``page`` fixtures in this folder's conftest).

Chromium is the system one (``/usr/bin/chromium``; ``.ci/run`` installs the Debian
package), driven by playwright, which never downloads a browser here. Without it the
browser tests fail when ``CI`` is set and are skipped (reason shown) elsewhere.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from typing import Any

import pytest

__all__ = ["CHROMIUM_ARGS", "chromium_path", "launched", "open_page", "watched_page"]

os.environ.setdefault("PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD", "1")

CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-dev-shm-usage",
]


def chromium_path(needed_for: str = "test the web console") -> str:
    """The system's Chromium; skipped without one (saying what it is ``needed_for``),
    failed when ``CI`` is set."""
    found = [shutil.which(name) for name in ("chromium", "chromium-browser", "google-chrome")]
    for path in ("/usr/bin/chromium", *found):
        if path and os.path.exists(path):
            return path
    message = (
        f"headless Chromium is needed to {needed_for}: install the Debian package"
        " 'chromium' (apt-get install -y chromium; .ci/run does it)"
    )
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)


def launched() -> Iterator[Any]:
    """A headless Chromium for one test, closed after it (a fixture's body)."""
    path = chromium_path()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=path, args=CHROMIUM_ARGS, headless=True)
        try:
            yield browser
        finally:
            browser.close()


def open_page(browser: Any, wide: bool = False, timeout_ms: int = 30_000) -> tuple[Any, list[str]]:
    """A new page of ``browser`` (1280x900 when ``wide``) and the list its script errors
    go to: the test asserts it is empty where the page has done its work."""
    page = browser.new_page(**({"viewport": {"width": 1280, "height": 900}} if wide else {}))
    page.set_default_timeout(timeout_ms)
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    return page, errors


def watched_page(browser: Any) -> Iterator[Any]:
    """A page of ``browser`` (30 s timeouts); after the test, no script error on it."""
    page, errors = open_page(browser)
    yield page
    assert errors == [], errors  # no script error on the page
