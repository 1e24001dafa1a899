"""`python -m clawgym.cli`: the `clawgym` command."""

from clawgym.cli import main

main()
