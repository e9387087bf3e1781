"""No module uses a name it never defines or imports.

A name missing from a function that only a slow path runs (a plot helper reached from one CLI command)
raises NameError at a user's first run of that path; pyflakes reads every module and finds it without
running anything. Only undefined names fail here: unused imports and the like are style, not bugs.
"""

from __future__ import annotations

import pytest
from pyflakes import api as pyflakes_api  # a dev dependency: missing, this module fails, never skips
from pyflakes import messages
from pyflakes.reporter import Reporter

from tests.conftest import ROOT

BUGS = (messages.UndefinedName, messages.UndefinedLocal, messages.UndefinedExport)


class _Collect(Reporter):
    def __init__(self):
        self.found: list[str] = []

    def flake(self, message):
        if isinstance(message, BUGS):
            self.found.append(str(message))

    def unexpectedError(self, filename, message):
        self.found.append(f"{filename}: {message}")

    def syntaxError(self, filename, message, lineno, offset, text):
        self.found.append(f"{filename}:{lineno}: {message}")


@pytest.mark.parametrize("package", ["attnspec", "benchmarks", "tests"])
def test_no_undefined_names(package):
    assert (ROOT / package).is_dir(), package  # a wrong path would check nothing and pass
    reporter = _Collect()
    pyflakes_api.checkRecursive([str(ROOT / package)], reporter)
    assert reporter.found == []
