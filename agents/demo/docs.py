"""The demo's local documents, searched by the researcher's ``doc_search`` tool."""

from __future__ import annotations

import tempfile
from pathlib import Path

__all__ = ["DEMO_DOCS", "demo_docs"]

#: file name -> text
DEMO_DOCS = {
    "tides.md": "# Ocean tides\n\nOcean tides are the rise and fall of sea level caused by the"
    " gravity of the moon and the sun acting on the rotating earth.\n\n"
    "Spring tides, with the largest range, come at new and full moon.",
    "figures.md": "# Tidal figures\n\nThe largest tidal range on earth, about 16 metres,"
    " is in the Bay of Fundy in Canada; most coasts see two high tides a day.",
}


def demo_docs() -> tempfile.TemporaryDirectory[str]:
    """A temporary folder holding :data:`DEMO_DOCS` (clean it up when done)."""
    folder = tempfile.TemporaryDirectory(prefix="cardbus-docs-")
    for name, text in DEMO_DOCS.items():
        Path(folder.name, name).write_text(text, encoding="utf-8")
    return folder
