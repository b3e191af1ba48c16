"""`python -m flows` runs the `futureworld` command line."""

from flows.cli import main

main()
