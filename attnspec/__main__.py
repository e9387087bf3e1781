"""``python -m attnspec ...``: the same command line as the ``attnspec`` console script."""

from attnspec.cli import main

main()
