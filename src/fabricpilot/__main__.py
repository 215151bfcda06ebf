"""``python -m fabricpilot`` runs the command line."""

from fabricpilot.cli import main

main()
