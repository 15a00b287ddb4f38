"""Every code block of docs/ runs (tests/docs/docblocks.py says how), and a broken one fails."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from docblocks import REPO, BlockFailed, missing_programs, parse, run_page

DOCS = REPO / "docs"
PAGES = sorted(p for p in DOCS.rglob("*.md") if "_hooks" not in p.parts)


def _id(p: Path) -> str:
    return str(p.relative_to(DOCS))


@pytest.mark.timeout(300)  # a page's commands each start a process; the box is shared
@pytest.mark.parametrize("page", PAGES, ids=_id)
def test_every_block_of_the_page_runs(page: Path, tmp_path: Path) -> None:
    missing = missing_programs(page.read_text(encoding="utf-8"))
    if missing:  # said, never silent: make test runs pytest -rs
        pytest.skip(f"{_id(page)} needs {' and '.join(missing)}, not found on PATH")
    ran = run_page(page, tmp_path)
    if page == FIRST_AGENT:  # the harness ran blocks of every kind, where the page says
        assert {b.lang for b in ran} >= {"python", "json", "console"}
        assert (tmp_path / "first-agent" / "cardbus.db").exists()  # the log, where they ran


# the first tutorial has blocks of every kind: its run above checks the harness ran each
# (checked there rather than by running the page a second time)
FIRST_AGENT = DOCS / "tutorials" / "first-agent.md"


def test_the_tutorial_has_blocks_of_every_kind() -> None:
    assert FIRST_AGENT in PAGES
    blocks = parse(FIRST_AGENT.read_text(encoding="utf-8"), FIRST_AGENT)
    assert {b.lang for b in blocks} >= {"python", "json", "console"}


# -- the harness fails on a broken page ---------------------------------------------------


def _page(tmp_path: Path, text: str) -> Path:
    page = tmp_path / "broken.md"
    page.write_text(text, encoding="utf-8")
    work = tmp_path / "work"
    work.mkdir()
    return page


def test_a_python_block_that_raises_fails_with_its_line(tmp_path: Path) -> None:
    page = _page(tmp_path, "# Page\n\n```python\nx = 1\n```\n\ntext\n\n```python\n1 / x0\n```\n")
    with pytest.raises(BlockFailed, match=r"broken\.md:9: python block raised(?s:.*)NameError"):
        run_page(page, tmp_path / "work")


def test_a_cardbus_command_that_fails_fails_the_page(tmp_path: Path) -> None:
    page = _page(tmp_path, "```console\n$ cardbus replay no-such-task\nsome output\n```\n")
    with pytest.raises(BlockFailed, match=r"broken\.md:1: console block exited 1"):
        run_page(page, tmp_path / "work")


def test_a_sh_block_stops_at_its_first_failing_line(tmp_path: Path) -> None:
    page = _page(tmp_path, "```sh\ncardbus --version\ncardbus no-such-command\ntrue\n```\n")
    with pytest.raises(BlockFailed, match="exited 2"):
        run_page(page, tmp_path / "work")


def test_a_json_block_that_does_not_parse_fails(tmp_path: Path) -> None:
    page = _page(tmp_path, '```json title="plan.json"\n{"goal": }\n```\n')
    with pytest.raises(BlockFailed, match="does not parse"):
        run_page(page, tmp_path / "work")


def test_a_file_block_is_written_and_checked(tmp_path: Path) -> None:
    page = _page(
        tmp_path,
        '```python title="mod.py"\nVALUE = 41\n```\n\n'
        "```python\nimport mod\n\nassert mod.VALUE + 1 == 42\n```\n",
    )
    ran = run_page(page, tmp_path / "work")
    assert [b.title for b in ran] == ["mod.py", None]
    assert (tmp_path / "work" / "mod.py").read_text() == "VALUE = 41\n"
    page.write_text('```python title="bad.py"\nimport no_such_module_here\n```\n')
    with pytest.raises(BlockFailed, match="ModuleNotFoundError"):
        run_page(page, tmp_path / "work")


def test_a_fence_without_a_known_language_fails(tmp_path: Path) -> None:
    page = _page(tmp_path, "```\ncardbus --version\n```\n")
    with pytest.raises(BlockFailed, match="must name one of"):
        run_page(page, tmp_path / "work")


def test_a_block_is_skipped_only_when_it_needs_a_real_endpoint(tmp_path: Path) -> None:
    marked = "<!-- docs-test: skip: needs a real endpoint (OPENAI_BASE_URL) -->\n\n"
    page = _page(tmp_path, marked + "```sh\nexit 1\n```\n")
    assert run_page(page, tmp_path / "work") == []
    page.write_text("<!-- docs-test: skip: too slow -->\n```sh\nexit 1\n```\n")
    with pytest.raises(BlockFailed, match="only when it needs a real endpoint"):
        run_page(page, tmp_path / "work")


def test_top_level_await_and_indented_fences(tmp_path: Path) -> None:
    text = (
        "!!! note\n\n    ```python\n    import asyncio\n\n"
        "    await asyncio.sleep(0)\n    DONE = True\n    ```\n"
    )
    blocks = parse(text, Path("x.md"))
    assert [(b.lang, b.line) for b in blocks] == [("python", 3)]
    assert blocks[0].code.startswith("import asyncio\n")
    run_page(_page(tmp_path, text), tmp_path / "work")


@pytest.mark.parametrize("lang", ["console", "sh"])
def test_a_command_meant_to_fail_must_fail_with_the_code_it_names(
    tmp_path: Path, lang: str
) -> None:
    prompt = "$ " if lang == "console" else ""
    work = tmp_path / "work"
    ok = _page(
        tmp_path, f"```{lang}\n{prompt}bash -c 'exit 3' > out.txt  # exit code 3: why\n```\n"
    )
    run_page(ok, work)
    assert (work / "out.txt").exists()  # the command ran
    for command, got in (("true", 0), ("bash -c 'exit 2'", 2)):
        ok.write_text(f"```{lang}\n{prompt}{command}  # exit code 3\n```\n", encoding="utf-8")
        with pytest.raises(BlockFailed, match=f"expected exit code 3, got {got}"):
            run_page(ok, work)


def test_a_console_command_continued_on_the_next_line_is_checked_whole(tmp_path: Path) -> None:
    page = _page(tmp_path, "```console\n$ bash -c \\\n  'exit 4'  # exit code 4\nout\n```\n")
    run_page(page, tmp_path / "work")
    page.write_text("```console\n$ bash -c \\\n  'exit 5'  # exit code 4\n```\n", encoding="utf-8")
    with pytest.raises(BlockFailed, match="expected exit code 4, got 5"):
        run_page(page, tmp_path / "work")


@pytest.mark.parametrize(
    "hiding", ["|| echo failed", "|| true", "|| :", "|| test $? -eq 1", "|| exit 0"]
)
def test_a_command_that_hides_its_failure_fails_the_page(tmp_path: Path, hiding: str) -> None:
    page = _page(tmp_path, f"```sh\ncardbus --version {hiding}\n```\n")
    with pytest.raises(BlockFailed, match="hides a failure"):
        run_page(page, tmp_path / "work")
    page.write_text(f"```console\n$ cardbus --version {hiding}\n```\n", encoding="utf-8")
    with pytest.raises(BlockFailed, match="hides a failure"):
        run_page(page, tmp_path / "work")


def test_an_await_block_that_does_not_paste_into_the_asyncio_repl_fails(tmp_path: Path) -> None:
    """It runs as a file, but pasted into `python -m asyncio` the statement after the
    `try` block is a SyntaxError (the REPL wants a blank line between them)."""
    block = "import asyncio\ntry:\n    await asyncio.sleep(0)\nfinally:\n    pass\nx = 1\n"
    page = _page(tmp_path, f"```python\n{block}```\n")
    with pytest.raises(BlockFailed, match=r"broken\.md:1: .*does not paste into `python -m"):
        run_page(page, tmp_path / "work")
    fixed = block.replace("finally:\n    pass\n", "finally:\n    pass\n\n")
    page.write_text(f"```python\n{fixed}```\n")
    ran = run_page(page, tmp_path / "work")
    assert len(ran) == 1
    # a block without a top-level await is not the REPL's: no such rule
    page.write_text("```python\ntry:\n    pass\nfinally:\n    pass\nx = 1\n```\n")
    assert len(run_page(page, tmp_path / "work")) == 1


def test_a_page_needing_a_program_names_the_missing_ones() -> None:
    page = "# p\n\n<!-- docs-test: needs: bash no-such-program-here -->\n"
    assert missing_programs(page) == ["no-such-program-here"]
    assert missing_programs("<!-- docs-test: needs: bash python -->") == []  # the venv's
    assert missing_programs("no marker") == []
    shown = "```text\n<!-- docs-test: needs: no-such-program-here -->\n```\n"
    assert missing_programs(shown) == []  # shown in a block, as the how-to shows it


def _running(pid: int) -> bool:
    """Whether ``pid`` still runs (a zombie, killed and not reaped yet, does not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in ("Z", "X")


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc (Linux)")
def test_what_a_failed_page_left_running_is_killed(tmp_path: Path) -> None:
    """A server started with ``&`` in one block, then a block that fails before the page's
    ``kill``: the page's test kills it (it would run on after the suite)."""
    page = _page(
        tmp_path,
        "```sh\nsleep 600 > sleep.log 2>&1 &\necho $! > sleep.pid\n```\n\n"
        "```sh\ncardbus no-such-command\n```\n",
    )
    with pytest.raises(BlockFailed, match="exited 2"):
        run_page(page, tmp_path / "work")
    pid = int((tmp_path / "work" / "sleep.pid").read_text())
    deadline = time.monotonic() + 30
    while _running(pid):  # SIGKILL is sent; its delivery is the kernel's
        assert time.monotonic() < deadline, f"sleep {pid} still runs"
        time.sleep(0.05)
