"""``python -m cardbus.tools`` runs the ``cardbus`` command line."""

from cardbus.tools.cli import main

main()
