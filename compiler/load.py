"""``attnspec.load(DIR)``: rebuild a model from a build directory's spec and weights.

Every file listed in ``manifest.json`` is checked against its sha256 first; a modified or
corrupted directory is refused with a clear error.
"""

from __future__ import annotations

import json
from pathlib import Path

from safetensors.torch import load_file

from attnspec.compiler.build import sha256
from attnspec.compiler.lower import lower
from attnspec.errors import BuildError
from attnspec.nn.model import Model
from attnspec.spec import load_spec


def read_manifest(directory: Path | str, check_hashes: bool = True) -> dict:
    """The manifest of a build directory, after checking every file's sha256 (unless told not to)."""
    directory = Path(directory)
    manifest_path = directory / "manifest.json"
    if not manifest_path.is_file():
        raise BuildError(f"{directory} is not a build directory (no manifest.json); build one with "
                         "`attnspec build SPEC -o DIR`")
    try:
        manifest = json.loads(manifest_path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise BuildError(f"{manifest_path} is not valid JSON ({error}); rebuild the directory") from None
    if check_hashes:
        for name, info in manifest.get("files", {}).items():
            path = directory / name
            if not path.is_file():
                raise BuildError(f"{path} is listed in the manifest but missing; rebuild the directory")
            if sha256(path) != info["sha256"]:
                raise BuildError(f"{path} does not match the sha256 in manifest.json (the build directory was "
                                 "modified or corrupted); rebuild it with `attnspec build`")
    return manifest


def load_model(directory: Path | str) -> Model:
    """Rebuild the eager model of a build directory (spec.yaml + model.safetensors).

    Args:
        directory: a directory written by ``attnspec build``.

    Returns:
        The model, in eval mode, with the modes of the build's plan.

    Raises:
        BuildError: the directory is not a build directory, or its files do not match the manifest.
    """
    directory = Path(directory)
    manifest = read_manifest(directory)
    spec = load_spec(directory / "spec.yaml")
    plan_modes = [layer["full_mode"] for layer in manifest["plan"]["layers"]]
    model = lower(spec)
    model.set_modes(plan_modes)
    state = load_file(str(directory / "model.safetensors"))
    missing, unexpected = model.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise BuildError(f"{directory}/model.safetensors does not fit spec.yaml (missing {missing[:3]}, "
                         f"unexpected {unexpected[:3]}); rebuild the directory")
    return model.eval()


__all__ = ["load_model", "read_manifest"]
