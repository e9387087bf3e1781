"""The CLI through its real entry point: exit codes, messages, and never a traceback."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import ROOT, SPECS


def attnspec(*args: str, cwd=ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", "from attnspec.cli import main; main()", *args],
                          capture_output=True, text=True, cwd=cwd, timeout=120)


def test_check_all_shipped_specs():
    result = attnspec("check", *map(str, SPECS))
    assert result.returncode == 0, result.stderr
    assert len(result.stdout.strip().splitlines()) == len(SPECS)
    assert "gateloop: 4 blocks (4 linear)" in result.stdout


@pytest.mark.parametrize("content", [
    "name: [unclosed\n",
    "layers:\n  - mixer: {kind: linear, feature_map: rleu}\n",
    "\x00\x01binary",
    "",
])
def test_check_bad_input_exits_2_without_traceback(tmp_path, content):
    file = tmp_path / "bad.yaml"
    file.write_text(content)
    result = attnspec("check", str(file))
    assert result.returncode == 2
    assert "Traceback" not in result.stderr + result.stdout
    assert f"{file}:" in result.stderr


def test_check_non_utf8_directory_and_missing(tmp_path):
    (tmp_path / "latin.yaml").write_bytes(b"name: caf\xe9\n")
    (tmp_path / "dir.yaml").mkdir()
    result = attnspec("check", str(tmp_path / "latin.yaml"), str(tmp_path / "dir.yaml"), str(tmp_path / "none.attn"))
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "UTF-8" in result.stderr and "directory" in result.stderr and "no such file" in result.stderr


def test_check_with_set_reports_suggestion():
    result = attnspec("check", "specs/gateloop.yaml", "--set", "layers[0].layers[0].mixer.feture_map=relu")
    assert result.returncode == 2 and "did you mean 'feature_map'" in result.stderr


def test_usage_errors_exit_2():
    for args in ([], ["check"], ["frobnicate"], ["fmt", "specs/gateloop.yaml", "--to", "xml"]):
        result = attnspec(*args)
        assert result.returncode == 2, args
        assert "Traceback" not in result.stderr


def test_schema_command_prints_draft07():
    result = attnspec("schema")
    assert result.returncode == 0
    assert json.loads(result.stdout)["$schema"].startswith("http://json-schema.org/draft-07")


def test_fmt_converts_both_ways(tmp_path):
    attn = tmp_path / "gateloop.attn"
    result = attnspec("fmt", "specs/gateloop.yaml", "--to", "attn", "-o", str(attn))
    assert result.returncode == 0, result.stderr
    assert "transition=data" in attn.read_text()
    back = attnspec("fmt", str(attn), "--to", "yaml")
    assert back.returncode == 0 and "transition: data" in back.stdout


def test_every_command_has_help():
    for command in ("check", "schema", "fmt", "explain", "build", "verify", "run"):
        result = attnspec(command, "--help")
        assert result.returncode == 0 and "Usage" in result.stdout, command
