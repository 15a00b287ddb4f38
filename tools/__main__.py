"""``python -m tools`` runs the ``cardbus`` command line."""

from cardbus.tools.cli import main

main()
