"""The build output never loses data: kills at any moment, concurrent builds, failed and invalid builds.

Invariant after anything happens to a build of ``out`` (with ``--force`` over an existing build):
``out`` is the complete old build or the complete new one (its manifest and every hash check),
nothing of the user's is touched, and the next build succeeds and leaves no scratch directory.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from attnspec.compiler import outdir
from attnspec.compiler.build import build_directory
from attnspec.compiler.manifest import read_manifest
from attnspec.errors import BuildError, SpecError
from tests.conftest import ROOT

pytestmark = pytest.mark.slow

SPEC = ROOT / "specs" / "linear-elu.yaml"
SMALL = ["d_model=16", "layers[0].repeat=1", "max_len=64"]


def cli_build(output: Path, *extra: str) -> subprocess.Popen:
    args = [sys.executable, "-m", "attnspec", "build", str(SPEC), "-o", str(output), "--no-compile", *extra]
    for item in SMALL:
        args += ["--set", item]
    return subprocess.Popen(args, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def seed_of(directory: Path) -> int:
    """The model seed of the build in ``directory`` (which build landed)."""
    lines = (directory / "spec.yaml").read_text().splitlines()
    return int(next(line.split(":", 1)[1] for line in lines if line.startswith("seed:")))


def assert_complete_build(directory: Path) -> None:
    read_manifest(directory)  # schema, every file present, sizes and hashes


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_killed_builds_leave_the_old_build_or_the_new_one(tmp_path, sig):
    output = tmp_path / "out"
    build_directory(SPEC, output, compile_check=False, overrides=[*SMALL, "seed=1"])
    seeds_seen = set()
    for delay in (0.3, 1.5, 2.5, 3.5, 4.5, 6.0):  # from start-up to publishing (a build takes ~5 s here)
        process = cli_build(output, "--force", "--set", "seed=2")
        time.sleep(delay)
        process.send_signal(sig)
        process.wait(timeout=120)
        assert_complete_build(output)
        seeds_seen.add(seed_of(output))
        if sig == signal.SIGTERM and process.returncode not in (0,):
            # SIGTERM unwinds: the build removed its own scratch directory
            assert not [n for n in os.listdir(tmp_path) if ".tmp-" in n], os.listdir(tmp_path)
        if seed_of(output) == 2:  # the new build landed: put the old one back for the next round
            build_directory(SPEC, output, compile_check=False, force=True, overrides=[*SMALL, "seed=1"])
    assert seeds_seen <= {1, 2}
    process = cli_build(output, "--force", "--set", "seed=3")  # the next build succeeds ...
    assert process.wait(timeout=300) == 0, process.stderr.read()
    assert seed_of(output) == 3
    assert sorted(os.listdir(tmp_path)) == ["out"]  # ... and removed every leftover


def test_concurrent_builds_to_one_output_never_replace_each_other(tmp_path):
    output = tmp_path / "out"
    first, second = cli_build(output, "--set", "seed=1"), cli_build(output, "--set", "seed=2")
    codes = [first.wait(timeout=300), second.wait(timeout=300)]
    errors = first.stderr.read() + second.stderr.read()
    assert sorted(codes) == [0, 2], errors
    assert "appeared while this build ran" in errors or "already exists" in errors
    winner = 1 if codes[0] == 0 else 2
    assert seed_of(output) == winner
    assert sorted(os.listdir(tmp_path)) == ["out"]


def test_output_appearing_during_a_build_is_left_alone(tmp_path, monkeypatch):
    output = tmp_path / "out"
    real_publish = outdir.Scratch.publish

    def user_creates_output_then_publish(self, force):
        output.mkdir()
        (output / "mine.txt").write_text("keep")
        return real_publish(self, force)

    monkeypatch.setattr(outdir.Scratch, "publish", user_creates_output_then_publish)
    with pytest.raises(BuildError, match="appeared while this build ran"):
        build_directory(SPEC, output, compile_check=False, overrides=SMALL)
    assert os.listdir(output) == ["mine.txt"] and sorted(os.listdir(tmp_path)) == ["out"]


def test_invalid_spec_creates_no_directory(tmp_path):
    with pytest.raises(SpecError):
        build_directory(SPEC, tmp_path / "new" / "deep" / "dir", overrides=["d_model=-1"])
    assert os.listdir(tmp_path) == []


def test_failing_build_removes_the_parents_it_created(tmp_path, monkeypatch):
    import attnspec.compiler.build as build

    monkeypatch.setattr(build, "_export", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("export broke")))
    with pytest.raises(BuildError, match="export broke"):
        build_directory(SPEC, tmp_path / "new" / "deep" / "dir", compile_check=False, overrides=SMALL)
    assert os.listdir(tmp_path) == []


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes through read-only permissions")
def test_read_only_output_parent_is_a_build_error(tmp_path):
    parent = tmp_path / "ro"
    parent.mkdir()
    parent.chmod(0o555)
    try:
        with pytest.raises(BuildError, match="writable"):
            build_directory(SPEC, parent / "out", compile_check=False, overrides=SMALL)
    finally:
        parent.chmod(0o755)


def test_unwritable_output_parent_is_a_build_error(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(BuildError, match="cannot write the build"):
        build_directory(SPEC, blocker / "out", compile_check=False, overrides=SMALL)
    assert blocker.read_text() == "not a directory"


def test_leftovers_are_removed_only_when_dead_and_ours(tmp_path):
    output = tmp_path / "out"
    dead = tmp_path / ".out.tmp-abcdefgh"
    dead.mkdir()
    (dead / "spec.yaml").write_text("partial")
    live = tmp_path / ".out.tmp-livelive"
    live.mkdir()
    lock = outdir._lock(live)  # a build that is still running holds this lock
    foreign = tmp_path / ".out.tmp-userdata"
    foreign.mkdir()
    (foreign / "thesis.tex").write_text("do not delete")
    try:
        assert outdir.remove_leftovers(output) == [dead]
    finally:
        os.close(lock)
    assert live.exists() and (foreign / "thesis.tex").exists()


def test_a_build_moved_aside_by_a_dead_build_is_restored(tmp_path):
    output = tmp_path / "out"
    build_directory(SPEC, output, compile_check=False, overrides=SMALL)
    aside = tmp_path / ".out.old-12345"
    os.rename(output, aside)  # what the rename fallback does just before a crash
    outdir.remove_leftovers(output)
    assert_complete_build(output)
    assert not aside.exists()


def test_force_never_replaces_a_symlink_or_a_file(tmp_path):
    real = tmp_path / "real"
    build_directory(SPEC, real, compile_check=False, overrides=SMALL)
    link = tmp_path / "link"
    link.symlink_to(real)
    with pytest.raises(BuildError, match="symbolic link"):
        build_directory(SPEC, link, compile_check=False, force=True, overrides=SMALL)
    file = tmp_path / "notes.txt"
    file.write_text("mine")
    with pytest.raises(BuildError, match="not a directory"):
        build_directory(SPEC, file, compile_check=False, force=True, overrides=SMALL)
    assert file.read_text() == "mine" and link.is_symlink()


def test_an_existing_output_advises_force_only_where_force_would_replace_it(tmp_path):
    """Without --force: over a build attnspec wrote, the message says --force replaces it; over a folder of
    the user's, or an export-hf directory as a build's output, it says to choose another -o, never --force."""
    built = tmp_path / "built"
    build_directory(SPEC, built, compile_check=False, calibrate=False, overrides=SMALL)
    with pytest.raises(BuildError, match="pass --force to replace this build directory"):
        build_directory(SPEC, built, compile_check=False, calibrate=False, overrides=SMALL)
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("mine")
    with pytest.raises(BuildError) as refused:
        build_directory(SPEC, mine, compile_check=False, calibrate=False, overrides=SMALL)
    assert "choose another -o" in str(refused.value) and "--force" not in str(refused.value)
    from attnspec.interop.convert import export_hf

    with pytest.raises(BuildError) as refused:
        export_hf(built, mine)
    assert "choose another -o" in str(refused.value) and "--force" not in str(refused.value)
    assert (mine / "notes.txt").read_text() == "mine"
