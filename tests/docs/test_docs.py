"""Docs that cannot go stale: every fenced block of README.md and docs/*.md runs here, or says why not.

A block is preceded by one directive (an HTML comment the site and GitHub do not show):

* ``<!-- doc-test: NAME -->``: run in scenario NAME. A scenario's blocks run in document order (README
  first, then the guides by name) in one sandbox folder holding links to the repository's ``specs/``,
  ``ablations/``, ``examples/`` and ``schema/`` and what :data:`SCENARIOS` prepares (a tiny transformers
  checkpoint, a corpus): ``bash`` blocks as one ``set -euo pipefail`` script with this environment's
  ``attnspec`` first on the path, ``python`` blocks as a script, and ``yaml`` blocks written first to the
  file their first comment names (``# distil.yaml``).
* ``<!-- output: COMMAND -->``: every line of the block is a line of what COMMAND prints (a shown output).
* ``<!-- not-run: REASON -->``: not run, and the reason says why (a released checkpoint, hours of training).

A ``yaml`` block without a directive is validated as what it is (a spec, a sweep or a training
configuration); any other block without one fails :func:`test_every_block_runs_or_says_why`.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from tests.conftest import ROOT

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
DIRECTIVE = re.compile(r"^<!-- (doc-test|output|not-run): (.+?) -->$")
LINKED = ("specs", "ablations", "examples", "schema", "tools")


@dataclass(frozen=True)
class Block:
    """One fenced block: where it is, its language, its text and the directive before it (or None)."""

    path: Path
    line: int
    lang: str
    text: str
    directive: tuple[str, str] | None

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def doc_blocks(paths=DOCS) -> list[Block]:
    """Every fenced block of ``paths``, in order."""
    found = []
    for path in paths:
        lines = path.read_text().splitlines()
        i = 0
        while i < len(lines):
            if lines[i].startswith("```"):
                end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
                previous = lines[i - 1].strip() if i else ""
                match = DIRECTIVE.match(previous)
                found.append(Block(path, i + 1, lines[i][3:].strip(), "\n".join(lines[i + 1:end]) + "\n",
                                   (match.group(1), match.group(2)) if match else None))
                i = end
            i += 1
    return found


BLOCKS = doc_blocks()


def _scenario_blocks(name: str) -> list[Block]:
    return [block for block in BLOCKS if block.directive == ("doc-test", name)]


def _sandbox(folder: Path) -> Path:
    for name in LINKED:
        (folder / name).symlink_to(ROOT / name)
    return folder


def _environment() -> dict:
    environment = dict(os.environ)
    environment["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{environment['PATH']}"
    environment["PYTHONPATH"] = str(ROOT)  # the tests' helpers; attnspec itself is installed
    return environment


def _real_quick_start(folder: Path) -> None:
    """The README's quick start on the real SmolLM2-135M-Instruct (its commands fetch it: the cache, then
    no network): ``corpus/`` and ``held-out.txt``, the Python documentation's topics (every Python ships
    them); ``task.jsonl``, requests of real text."""
    from tests.tokenizer_files import topics

    texts = topics()
    (folder / "corpus").mkdir()
    for index, text in enumerate(texts[:24]):
        (folder / "corpus" / f"topic-{index}.txt").write_text(text[:4000])
    (folder / "held-out.txt").write_text("\n".join(texts[40:44])[:6000])
    requests = [{"context": "The for statement", "continuation": " is used to iterate"},
                {"context": "A list is", "choices": [" mutable", " immutable"], "label": 0}]
    (folder / "task.jsonl").write_text("".join(json.dumps(request) + "\n" for request in requests))


def _plugin_spec(folder: Path) -> None:
    (folder / "my-spec.yaml").write_text(
        "name: taylor\nplugins: [based_taylor]\ninput: {kind: tokens, vocab_size: 32}\nd_model: 16\nmax_len: 64\n"
        "layers:\n  - mixer: {kind: linear, heads: 2, d_qk: 4, feature_map: taylor}\n")


def _real_smollm2(folder: Path) -> None:
    """``SmolLM2-135M-Instruct.Q4_1.gguf``: the real released model (tools/fetch_models.py, cached), linked in."""
    from tools.fetch_models import fetch

    (folder / "SmolLM2-135M-Instruct.Q4_1.gguf").symlink_to(fetch("smollm2", quiet=True))


SCENARIOS = {"main-job": None, "quick-start": _real_quick_start, "plugin": _plugin_spec, "repository": None,
             "gguf": _real_smollm2}
"""Each scenario's preparation of its sandbox (beyond the links to the repository's folders)."""


def test_every_block_runs_or_says_why():
    unexplained = [block.where for block in BLOCKS if block.directive is None and block.lang != "yaml"]
    assert not unexplained, f"blocks with no doc-test, output or not-run directive: {unexplained}"
    for block in BLOCKS:
        if block.directive is None:
            continue
        kind, argument = block.directive
        if kind == "doc-test":
            assert argument in SCENARIOS, f"{block.where}: no scenario {argument!r} in {sorted(SCENARIOS)}"
        if kind == "not-run":
            assert len(argument.split()) >= 3, f"{block.where}: say why it is not run"


def test_every_scenario_has_blocks():
    assert all(_scenario_blocks(name) for name in SCENARIOS), "a scenario no document uses"


@pytest.mark.slow  # builds, trains and exports at toy sizes: about a minute per scenario here
@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_the_docs_commands_run(name, tmp_path):
    folder = _sandbox(tmp_path)
    if SCENARIOS[name] is not None:
        SCENARIOS[name](folder)
    blocks = _scenario_blocks(name)
    for block in blocks:
        if block.lang == "yaml":
            target = re.match(r"# (\S+\.ya?ml)\s*$", block.text.splitlines()[0])
            assert target, f"{block.where}: a doc-test yaml block names its file in its first line (# name.yaml)"
            (folder / target.group(1)).write_text(block.text)
    for block in blocks:
        if block.lang == "bash":
            command = ["bash", "-c", "set -euo pipefail\n" + block.text]
        elif block.lang == "python":
            command = [sys.executable, "-c", block.text]
        else:
            continue
        done = subprocess.run(command, cwd=folder, env=_environment(), capture_output=True, text=True, timeout=900)
        assert done.returncode == 0, f"{block.where} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        assert "Traceback" not in done.stderr, f"{block.where}:\n{done.stderr[-3000:]}"


OUTPUTS = [block for block in BLOCKS if block.directive and block.directive[0] == "output"]


@pytest.mark.parametrize("block", OUTPUTS, ids=[block.where for block in OUTPUTS])
def test_a_shown_output_is_what_the_command_prints(block, tmp_path):
    folder = _sandbox(tmp_path)
    done = subprocess.run(["bash", "-c", block.directive[1]], cwd=folder, env=_environment(), capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    printed = {line.rstrip() for line in done.stdout.splitlines()}
    missing = [line for line in block.text.splitlines() if line.rstrip() not in printed and line.strip() != "..."]
    assert not missing, f"{block.where}: lines `{block.directive[1]}` no longer prints: {missing}"


YAMLS = [block for block in BLOCKS if block.lang == "yaml" and block.directive is None]


@pytest.mark.parametrize("block", YAMLS, ids=[block.where for block in YAMLS])
def test_a_yaml_block_is_valid(block, tmp_path):
    """A spec validates, a sweep loads (relative paths as from ``ablations/``), a training configuration loads."""
    from attnspec.ablation.sweep import load_sweep
    from attnspec.spec import load_spec
    from attnspec.training.config import load_config

    folder = _sandbox(tmp_path)
    data = yaml.safe_load(block.text)
    if "variants" in data or "base" in data:
        (folder / "sweeps").mkdir()
        path = folder / "sweeps" / "doc.yaml"
        path.write_text(block.text)
        load_sweep(path)
    elif "layers" in data:
        path = folder / "doc.yaml"
        path.write_text(block.text)
        load_spec(path)
    else:
        path = folder / "doc.yaml"
        path.write_text(block.text)
        load_config(path)


def test_the_readme_lists_the_shipped_specs():
    readme = (ROOT / "README.md").read_text()
    table = readme.split("<!-- shipped specs: checked against specs/ by a test -->", 1)[1].split("\n\n", 1)[0]
    listed = sorted(re.findall(r"`([\w-]+\.yaml)`", table))
    assert listed == sorted(path.name for path in (ROOT / "specs").glob("*.yaml"))


def test_user_docs_name_no_issue_numbers():
    """Readers cannot see the issue tracker."""
    found = {str(path.relative_to(ROOT)): re.findall(r"[Ii]ssues? \d+|#\d{2,}\b", path.read_text()) for path in DOCS}
    assert not any(found.values()), {path: names for path, names in found.items() if names}


@pytest.mark.slow  # mkdocs builds the site: a few seconds
def test_the_docs_build_as_a_site_with_no_broken_link(tmp_path):
    """``mkdocs build --strict``: a broken link or anchor in the guides fails the build."""
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]


def test_the_readmes_links_reach_files_of_the_repository():
    """The README is outside the site mkdocs checks: its relative links are checked here."""
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", (ROOT / "README.md").read_text())
    assert links, "the README links its guides"
    missing = [link for link in links if "://" not in link and not (ROOT / link).exists()]
    assert not missing, missing


def test_the_readme_counts_the_imported_types_as_the_registry_does():
    from attnspec.interop.refused import CAUSAL_LM_TYPES, TRANSFORMERS_VERSION
    from attnspec.interop.registry import imported_types

    imported = sum(model_type in set(imported_types()) for model_type in CAUSAL_LM_TYPES)
    claim = f"{imported} of the {len(CAUSAL_LM_TYPES)} causal-LM types of transformers {TRANSFORMERS_VERSION}"
    assert claim in " ".join((ROOT / "README.md").read_text().split()), claim
