"""The console names a degraded run (an optional task failed, the run completed without
it) in the runs list and on the run's page, in headless Chromium."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from test_ui import Background, Server, server  # noqa: F401  (a fixture)

from tests.e2e.optional_crash import Search, Write, plan


def test_a_degraded_run_is_named_in_the_list_and_on_its_page(
    server: Server,  # noqa: F811
    page: Any,
    db: Path,
) -> None:
    page.goto(server.url)
    page.wait_for_selector("body[data-live='yes'][data-view='runs']")
    run = Background(db, [Search, Write], plan())
    result = run.join()
    assert (result.status, result.degraded) == ("completed", ["facts"])
    row = page.locator(f"#runs tr[data-root='{run.root}'][data-status='completed']")
    row.wait_for()
    assert "degraded (without facts)" in row.inner_text()
    row.locator("a").first.click()
    page.wait_for_selector("#run-status[data-status='completed']")
    assert "degraded (without facts)" in page.locator("#run-status").inner_text()
