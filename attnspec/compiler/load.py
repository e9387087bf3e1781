"""``attnspec.load(DIR)``: rebuild a model from a build directory's spec and weights.

The directory is untrusted data (README, "Trust"): the manifest is validated against its schema
and every file it lists is checked (regular file, size, sha256) before anything is read; the
resolved spec the manifest carries is validated by the IR (the same data as spec.yaml, without
the YAML front-end); the weights are read with safetensors (never pickle) and must match the
spec's model tensor for tensor (names, shapes, dtypes) with finite values. The model takes the
modes of the manifest's plan; nothing is planned again.
"""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from attnspec.compiler.device import resolve_device
from attnspec.compiler.sizes import check_model_size
from attnspec.compiler.manifest import Manifest, read_manifest
from attnspec.errors import AttnSpecError, BuildError, shorten
from attnspec.nn.model import Model, build_model_from_spec
from attnspec.spec.validate import validate_data


def load_weights(model: Model, path: Path | dict, fix: str = "rebuild the directory") -> None:
    """Copy the tensors of the safetensors file ``path`` (or a name -> tensor dict) into ``model``,
    refusing any mismatch; ``fix`` ends each message with what to do.

    Raises:
        BuildError: naming the file and the first tensor that is missing, unexpected, of another
            shape or dtype, or not finite.
    """
    if isinstance(path, dict):
        tensors, path = path, "the weights"
    else:
        try:
            tensors = load_file(str(path))
        except (SafetensorError, OSError, ValueError, RuntimeError) as error:
            raise BuildError(f"{path} is not a valid safetensors file ({shorten(str(error), 120)}); {fix}") from None
    expected = model.state_dict()
    missing = sorted(set(expected) - set(tensors))
    unexpected = sorted(set(tensors) - set(expected))
    if missing or unexpected:
        raise BuildError(f"{path} does not fit the spec's model (missing {[shorten(n) for n in missing[:3]]}, "
                         f"unexpected {[shorten(n) for n in unexpected[:3]]}); {fix}")
    for name, target in expected.items():
        tensor = tensors[name]
        if tensor.shape != target.shape or tensor.dtype != target.dtype:
            raise BuildError(f"{path}: tensor '{name}' is {tensor.dtype} {tuple(tensor.shape)}, the spec's model has "
                             f"{target.dtype} {tuple(target.shape)}; {fix}")
        if tensor.is_floating_point() and not torch.isfinite(tensor).all():
            raise BuildError(f"{path}: tensor '{name}' holds NaN or infinite values; {fix}")
    model.load_state_dict(tensors, strict=True)


def check_plugins(directory: Path, names: object) -> None:
    """Refuse plugins that would be imported from inside ``directory`` (its spec names them).

    A build directory's spec may list plugin modules; they are imported to rebuild the model, which
    is what the user installed, never code the directory brought along (a ``plugin.py`` beside the
    manifest on an absolute ``PYTHONPATH`` entry; the working directory is never searched, see
    :func:`~attnspec.spec.components.locate_plugin`, which finds the file without running anything).
    """
    from attnspec.spec.components import PluginRefused, locate_plugin

    if not isinstance(names, list):
        return
    inside = directory.resolve()
    for name in names:
        try:
            origin = locate_plugin(str(name))
        except (PluginRefused, ImportError, ValueError):
            continue  # validation reports it, located
        if origin.is_relative_to(inside):
            raise BuildError(f"{directory}: its spec names the plugin {shorten(str(name))}, which would be imported "
                             "from inside the build directory; a build directory never supplies code. Install the "
                             "plugin or put it on PYTHONPATH from elsewhere")


def check_decoding_fields(directory: Path, manifest: Manifest, model: Model) -> None:
    """Refuse a manifest whose ``decode_limit`` or step state signature is not what its spec's
    ``model`` has: readers derive both from the spec, and a disagreement means the manifest was edited."""
    state = [(shape, str(dtype).replace("torch.", "")) for shape, dtype in model.state_signature()]
    recorded = [(tuple(entry.shape), entry.dtype) for entry in manifest.export.step.state] \
        if manifest.export.step is not None else state
    limit = model.decode_limit if model.has_step else None
    if manifest.decode_limit != limit or recorded != state:
        raise BuildError(f"{directory}/manifest.json: its decode_limit or decoding state does not match its spec "
                         "(the manifest was edited); rebuild the directory")


def load_model(directory: Path | str, manifest: Manifest | None = None, device=None) -> Model:
    """Rebuild the eager model of a build directory (spec.yaml + model.safetensors).

    Args:
        directory: a directory written by ``attnspec build``.
        manifest: its manifest, when already read and checked (:func:`read_manifest`).
        device: where to put the model ("cpu", "cuda", "cuda:N"; default the CPU), whatever device
            the directory was built on: the weights are device-free, only the exported programs are not.

    Returns:
        The model, in eval mode, with the modes of the build's plan.

    Raises:
        BuildError: the directory is not a build directory, or its files do not match the manifest,
            the spec or each other.
    """
    directory = Path(directory)
    device = resolve_device(device)
    manifest = manifest or read_manifest(directory)
    check_plugins(directory, manifest.spec.get("plugins"))
    try:  # the manifest's copy of spec.yaml, as data: the IR validates it, no front-end is needed
        spec = validate_data(manifest.spec)
    except AttnSpecError as error:
        raise BuildError(f"{directory}/manifest.json: its spec is not valid ({shorten(str(error), 300)}); rebuild "
                         "the directory") from None
    try:
        check_model_size(spec)  # on the meta device, before anything the spec asks for is allocated
    except BuildError as error:
        raise BuildError(f"{directory}/manifest.json: {error}") from None
    model = build_model_from_spec(spec)
    check_decoding_fields(directory, manifest, model)
    modes = [layer.full_mode for layer in manifest.plan.layers]
    fits = len(modes) == len(model.blocks) and all(mode in b.mixer.modes for mode, b in zip(modes, model.blocks))
    if not fits:
        raise BuildError(f"{directory}/manifest.json: its plan does not fit spec.yaml ({len(modes)} modes for "
                         f"{len(model.blocks)} blocks, or a mode a mixer lacks); rebuild the directory")
    model.set_modes(modes)
    load_weights(model, directory / "model.safetensors")
    return model.to(device).eval()


__all__ = ["load_model", "load_weights", "read_manifest"]
