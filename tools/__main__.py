"""``python -m tools`` runs the ``cardbus`` command line."""

from tools.cli import main

main()
