"""A diagnostic is one file: a module of attnspec.diagnostics declaring DIAGNOSTIC becomes
`attnspec diagnose NAME`, with its parameters and its table, without touching the CLI."""

from __future__ import annotations

import textwrap

from typer.testing import CliRunner

import attnspec.diagnostics
from attnspec.cli import app
from attnspec.diagnostics import diagnostics

PROBE = '''
from pathlib import Path
from attnspec.diagnostics import SEED, Diagnostic, Parameter, Result, Table, output_option

def run(words: list[str], output: Path, repeat: int, seed: int, shout: bool) -> Result:
    output.mkdir(parents=True, exist_ok=True)
    (output / "probe.csv").write_text("word\\n" + "\\n".join(words * repeat))
    rows = [[word.upper() if shout else word, str(len(word) + seed)] for word in words * repeat]
    return Result(Table("probe table", ["word", "length"], rows, left=frozenset({"word"})), [output / "probe.csv"])

DIAGNOSTIC = Diagnostic("probe-words", "Count letters.", (
    Parameter("words", str, "Words.", positional=True, many=True),
    output_option("probe.csv"),
    Parameter("repeat", int, "Times.", default=1, minimum=1, maximum=3),
    SEED,
    Parameter("shout", bool, "Upper case.", default=False, flags=("--shout/--quiet",))), run)
'''


def test_every_shipped_diagnostic_is_discovered():
    assert set(diagnostics()) == {"attention", "experts", "gates", "maps", "paths", "rank-collapse", "scatterbrain",
                                  "span"}


def test_a_new_module_is_a_command_with_its_parameters_and_table(tmp_path, monkeypatch):
    (tmp_path / "probe_words.py").write_text(textwrap.dedent(PROBE))
    monkeypatch.setattr(attnspec.diagnostics, "__path__", [*attnspec.diagnostics.__path__, str(tmp_path)])
    runner = CliRunner()
    listed = runner.invoke(app, ["diagnose", "--help"])
    assert "probe-words" in listed.output and "Count letters." in listed.output
    result = runner.invoke(app, ["diagnose", "probe-words", "ab", "cde", "-o", str(tmp_path / "out"), "--repeat", "2",
                                 "--seed", "1", "--shout"])
    assert result.exit_code == 0, result.output
    assert "probe table" in result.output and "CDE" in result.output and "4" in result.output
    assert (tmp_path / "out" / "probe.csv").read_text().count("ab") == 2
    refused = runner.invoke(app, ["diagnose", "probe-words", "ab", "-o", str(tmp_path / "out"), "--repeat", "9"])
    assert refused.exit_code == 2 and "repeat" in refused.output
