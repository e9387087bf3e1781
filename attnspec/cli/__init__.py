"""The ``attnspec`` command line: :mod:`.app` holds the commands (each calls one library function),
:mod:`.display`, :mod:`.sweeps` and :mod:`.metrics` what they show. Renders, never computes."""

from attnspec.cli.app import app, main

__all__ = ["app", "main"]
