"""The demo's local documents, searched by the researcher's ``doc_search`` tool."""

from __future__ import annotations

import tempfile
from pathlib import Path

__all__ = ["DEMO_DOCS", "DEMO_DOCS_DIR", "demo_docs", "demo_docs_folder"]

#: file name -> text
DEMO_DOCS = {
    "tides.md": "# Ocean tides\n\nOcean tides are the rise and fall of sea level caused by the"
    " gravity of the moon and the sun acting on the rotating earth.\n\n"
    "Spring tides, with the largest range, come at new and full moon.",
    "figures.md": "# Tidal figures\n\nThe largest tidal range on earth, about 16 metres,"
    " is in the Bay of Fundy in Canada; most coasts see two high tides a day.",
}


#: the folder the documents are in, inside the temporary one: its name is in the tool's
#: description the model reads, so it is the same in every run (a re-run asks the same)
DEMO_DOCS_DIR = "cardbus-demo-docs"


def demo_docs() -> tempfile.TemporaryDirectory[str]:
    """A temporary folder holding :data:`DEMO_DOCS` in :func:`demo_docs_folder` (clean it
    up when done)."""
    folder = tempfile.TemporaryDirectory(prefix="cardbus-docs-")
    docs = demo_docs_folder(folder)
    docs.mkdir()
    for name, text in DEMO_DOCS.items():
        Path(docs, name).write_text(text, encoding="utf-8")
    return folder


def demo_docs_folder(folder: tempfile.TemporaryDirectory[str]) -> Path:
    """Where :func:`demo_docs` put the documents (a folder of a stable name)."""
    return Path(folder.name, DEMO_DOCS_DIR)
