"""``attnspec.load(DIR)``: rebuild a model from a build directory's spec and weights.

The directory is untrusted data (docs/trust.md): the manifest is validated against its schema
and every file it lists is checked (regular file, size, sha256) before anything is read; the
resolved spec the manifest carries is validated by the IR (the same data as spec.yaml, without
the YAML front-end); the weights are read with safetensors (never pickle) and must match the
spec's model tensor for tensor (names, shapes, dtypes) with finite values. Weights for an edited
spec (``attnspec build --weights``, ``attnspec.load(..., weights=, strict=False)``) load where they fit
and list the rest (:class:`WeightsFit`). The model takes the
modes of the manifest's plan; nothing is planned again.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from attnspec.compiler.device import resolve_device
from attnspec.compiler.sizes import check_model_size
from attnspec.compiler.manifest import Manifest, check_listed_file, parse_manifest, read_manifest
from attnspec.errors import AttnSpecError, BuildError, RunError, shorten
from attnspec.io import all_finite, map_safetensors
from attnspec.nn.model import Model, build_model_from_spec
from attnspec.spec.validate import validate_data


SHOWN = 40
"""Names a weights error lists before "... and N more" (every name is in the returned WeightsFit)."""


@dataclass
class WeightsFit:
    """How a weights file fitted a spec's model, tensor by tensor (names as in ``model.state_dict()``).

    ``loaded``: taken from the file (a floating-point tensor of another float dtype is converted);
    ``initialised``: the model's tensors the file lacks or holds at another shape or an unconvertible
    dtype, which keep the spec's initialisation; ``mismatched``: of those, (name, shape in the file, shape
    in the model, dtype in the file, dtype in the model); ``ignored``: the file's tensors the model has
    no place for; ``repeated``: of the loaded, the grouped key/value projections whose heads were repeated
    to the model's (:func:`repeat_head_groups`), as (name, shape in the file, shape in the model).
    """

    loaded: list[str] = field(default_factory=list)
    initialised: list[str] = field(default_factory=list)
    mismatched: list[tuple[str, list[int], list[int], str, str]] = field(default_factory=list)
    ignored: list[str] = field(default_factory=list)
    repeated: list[tuple[str, list[int], list[int]]] = field(default_factory=list)

    @property
    def exact(self) -> bool:
        """Every tensor of the model came from the file and every tensor of the file was used."""
        return not (self.initialised or self.ignored)

    def to_json(self) -> dict:
        return {"loaded": len(self.loaded), "initialised": self.initialised,
                "mismatched": [{"name": name, "file": file, "model": mine, "file_dtype": file_dtype,
                                "model_dtype": model_dtype}
                               for name, file, mine, file_dtype, model_dtype in self.mismatched],
                "ignored": self.ignored,
                "repeated": [{"name": name, "file": file, "model": mine} for name, file, mine in self.repeated]}

    def problems(self) -> str:
        """What does not fit, in words (for the errors of a strict load)."""
        parts = []
        reshaped = [f"{shorten(name)} {_kind(file, theirs, ours)} (model {_kind(mine, ours, theirs)})"
                    for name, file, mine, theirs, ours in self.mismatched]
        missing = [shorten(n) for n in sorted(set(self.initialised) - {entry[0] for entry in self.mismatched})]
        for what, names in (("missing", missing), ("of another shape or dtype", reshaped),
                            ("unexpected", [shorten(n) for n in self.ignored])):
            if names:
                more = f" and {len(names) - SHOWN} more" if len(names) > SHOWN else ""
                parts.append(f"{len(names)} {what}: {', '.join(names[:SHOWN])}{more}")
        return "; ".join(parts)


def _kind(shape: list[int], dtype: str, other: str) -> str:
    """A tensor's shape as a weights message shows it, with its dtype where it differs from the ``other``
    side's: ``(16, 16) int32``."""
    return f"{tuple(shape)}" + (f" {dtype}" if dtype != other else "")


def load_weights(model: Model, path: Path | dict, fix: str = "rebuild the directory", *,
                 strict: bool = True, renames: dict[str, str] | None = None, cast: bool = False,
                 head_groups: dict[str, int] | None = None) -> WeightsFit:
    """Copy the tensors of the safetensors file ``path`` (or a name -> tensor dict) into ``model``.

    ``renames`` maps name prefixes of the file's tensors to the model's (``{"blocks.3.mixer.o_proj.":
    "blocks.3.mixer.out_proj."}``), applied before anything is fitted, the longest prefix first: the
    explicit mapping from a replaced layer's tensors to its replacement's where names differ.

    ``strict`` (a build directory's own weights, a training checkpoint): every tensor must fit, by
    name, shape and dtype. Otherwise (``attnspec build --weights`` of an edited spec) every tensor whose
    name and shape fit is loaded, a floating-point one converted to the model's dtype, and the rest
    keep the model's initialisation; the returned :class:`WeightsFit` lists them. Values must be finite
    either way. ``cast``: strict but for the floating dtype, converted to the model's (a bfloat16 run's
    checkpoint holds its float32 master weights). ``fix`` ends each message with what to do.

    ``head_groups`` (not strict): the file's grouped key/value projections, name -> rows per head
    (:func:`grouped_projections` of the spec the file was written for). Where the model's tensor has a
    multiple of the file's heads (an attention's shared keys and values swapped for a mixer with more
    key/value heads), each file head is repeated for the query heads it served, as grouped-query
    attention repeats it (``repeat_kv``) and Mamba-in-the-Llama and Liger initialise a linearised layer.

    A model made with ``build_model_from_spec(spec, empty=True)`` (parameters on the meta device) takes
    the file's tensors themselves (``load_state_dict(assign=True)``: views of a private, copy-on-write
    memory map of the file), so a model read from a file is held once, never beside a copy.

    Raises:
        BuildError: the file is not a safetensors file; a tensor to load holds NaN or infinite values;
            or, when ``strict``, anything does not fit (every name listed, up to :data:`SHOWN` per kind);
            an empty model's parameter is left without a tensor.
    """
    if isinstance(path, dict):
        tensors, path = path, "the weights"
    else:
        tensors = _mapped(Path(path), fix)
    if renames:
        tensors = {_renamed(name, renames): tensor for name, tensor in tensors.items()}
    expected = model.state_dict()
    assign = any(tensor.is_meta for tensor in expected.values())
    fit = WeightsFit(initialised=[name for name in expected if name not in tensors],
                     ignored=sorted(set(tensors) - set(expected)))
    if strict and not fit.exact:
        raise BuildError(f"{path} does not fit the spec's model ({fit.problems()}); {fix}")
    fitting = {}
    for name, target in expected.items():
        tensor = tensors.get(name)
        if tensor is None:
            continue
        converts = (cast or not strict) and tensor.is_floating_point() and target.is_floating_point()
        if not strict and name in (head_groups or {}) and tensor.shape != target.shape:
            repeated = repeat_head_groups(tensor, head_groups[name], target.shape)
            if repeated is not None:
                fit.repeated.append((name, list(tensor.shape), list(target.shape)))
                tensor = repeated
        if tensor.shape != target.shape or (tensor.dtype != target.dtype and not converts):
            if strict:
                raise BuildError(f"{path}: tensor '{name}' is {_dtype(tensor)} {tuple(tensor.shape)}, the spec's "
                                 f"model has {_dtype(target)} {tuple(target.shape)}; {fix}")
            fit.initialised.append(name)
            fit.mismatched.append((name, list(tensor.shape), list(target.shape), _dtype(tensor), _dtype(target)))
            continue
        converted = tensor.to(target.dtype)  # finite as the model will hold it: float64's 1e300 is inf in float32
        if converted.is_floating_point() and not all_finite(converted):
            past = "" if converted.dtype == tensor.dtype or not torch.isfinite(tensor).all() else \
                f" as {_dtype(target)} (its {_dtype(tensor)} values are past {_dtype(target)}'s range)"
            raise BuildError(f"{path}: tensor '{name}' holds NaN or infinite values{past}; {fix}")
        fitting[name] = converted
        fit.loaded.append(name)
    aliases = _aliases(model) if assign else []
    model.load_state_dict(fitting, strict=False, assign=assign)
    for places in aliases:  # assigning replaced one holder's tensor: every alias of it takes the new one
        loaded = next((getattr(module, key) for module, key in places if not getattr(module, key).is_meta), None)
        if loaded is not None:
            for module, key in places:
                (module._parameters if key in module._parameters else module._buffers)[key] = loaded
    empty = next((name for name, tensor in model.state_dict().items() if tensor.is_meta), None)
    if empty is not None:
        raise BuildError(f"{path}: holds no tensor '{empty}' for the model, which has no other weights; {fix}")
    return fit


def repeat_head_groups(tensor: torch.Tensor, rows: int, shape: torch.Size) -> torch.Tensor | None:
    """A grouped projection's ``tensor`` ((G * rows, ...): G heads of ``rows`` rows each, a weight or its
    bias) with each head repeated r times in place, head g becoming heads g*r .. g*r + r - 1, to ``shape``
    ((r * G * rows, ...)); None where ``shape`` is not such a multiple. Query head h read key/value head
    h // (H / G); after the repeat, with K = r * G heads, it reads h // (H / K), the same values: an
    attention keeps its function whatever K (a divisor of H, a multiple of G) the model takes."""
    if tensor.ndim != len(shape) or tuple(tensor.shape[1:]) != tuple(shape[1:]) or tensor.shape[0] % rows:
        return None
    if shape[0] % tensor.shape[0] or shape[0] == tensor.shape[0]:
        return None
    times = shape[0] // tensor.shape[0]
    return tensor.unflatten(0, (-1, rows)).repeat_interleave(times, dim=0).flatten(0, 1)


def grouped_projections(spec) -> dict[str, int]:
    """The model tensors of ``spec`` (names as in ``model.state_dict()``) that project keys or values
    shared by groups of heads (``kv_heads`` below ``heads``), each with its rows per head: what
    :func:`load_weights` may repeat when an edited spec gives that block more key/value heads."""
    from attnspec.spec.walk import iter_blocks

    found = {}
    for index, (_, block) in enumerate(iter_blocks(spec, expand=True)):
        mixer = getattr(block, "mixer", None)
        if getattr(mixer, "qk_groups", None) or not getattr(mixer, "kv_heads", None):
            continue
        for projection, rows, heads in (("k_proj", mixer.d_qk, mixer.key_heads),
                                        ("v_proj", mixer.d_v, mixer.value_heads)):
            if heads < mixer.heads:
                for part in ("weight", "bias"):
                    found[f"blocks.{index}.mixer.{projection}.{part}"] = rows
    return found


def grouped_projections_of(directory: Path | str) -> dict[str, int]:
    """:func:`grouped_projections` of the spec a build directory's manifest records (its weights' model)."""
    return grouped_projections(validate_data(parse_manifest(Path(directory)).spec))


def _aliases(model: nn.Module) -> list[list[tuple[nn.Module, str]]]:
    """Every tensor held in more than one place (a shared block's, held by each use's view too; a tied
    embedding), as the (module, attribute) places holding it: ``load_state_dict(assign=True)`` replaces
    the tensor where the state dict names it, and the other places must follow."""
    places: dict[int, list[tuple[nn.Module, str]]] = {}
    for module in model.modules():
        for store in (module._parameters, module._buffers):
            for key, tensor in store.items():
                if tensor is not None:
                    places.setdefault(id(tensor), []).append((module, key))
    return [holders for holders in places.values() if len(holders) > 1]


def _mapped(path: Path, fix: str) -> dict[str, torch.Tensor]:
    """The tensors of the safetensors file ``path`` as views of one private memory map of it
    (:func:`attnspec.io.map_safetensors`): read when used, never copied, so a model's weights are never
    held twice while they are checked and assigned. A file that is not one is a BuildError ending in ``fix``."""
    try:
        return map_safetensors(path)
    except RunError as error:
        raise BuildError(f"{path} is not a valid safetensors file ({shorten(str(error), 160)}); {fix}") from None


def _dtype(tensor: torch.Tensor) -> str:
    return str(tensor.dtype).removeprefix("torch.")


def _renamed(name: str, renames: dict[str, str]) -> str:
    """``name`` with its longest prefix among ``renames`` replaced (unchanged where none is its prefix)."""
    prefix = max((p for p in renames if name.startswith(p)), key=len, default=None)
    return name if prefix is None else renames[prefix] + name[len(prefix):]


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
    state = decoding_state(manifest, model)
    recorded = [(tuple(entry.shape), entry.dtype, entry.capacity_axis) for entry in manifest.export.step.state] \
        if manifest.export.step is not None else state
    limit = model.decode_limit if model.has_step else None
    if manifest.decode_limit != limit or recorded != state:
        raise BuildError(f"{directory}/manifest.json: its decode_limit or decoding state does not match its spec "
                         "(the manifest was edited); rebuild the directory")


def decoding_state(manifest: Manifest, model: Model) -> list[tuple[tuple[int, ...], str, int | None]]:
    """The decoding state of the build's step: (shape without the batch, dtype, capacity axis) per tensor,
    from its spec's ``model``; capacity axes only where the build's step takes any capacity, which its
    manifest says by recording some (builds before that take ``max_len`` positions and record none)."""
    dynamic = manifest.export.step is not None and any(entry.capacity_axis is not None
                                                       for entry in manifest.export.step.state)
    axes = model.capacity_axes() if dynamic else [None] * len(model.state_signature())
    return [(shape, str(dtype).replace("torch.", ""), axis)
            for (shape, dtype), axis in zip(model.state_signature(), axes)]


def tokenizer_of(directory: Path | str):
    """The tokenizer a training run or build directory carries (:class:`attnspec.tokenizer.Tokenizer`),
    checked against the identity its run.json or manifest records; None where it records none (a file
    the record does not name is never read). Raises TokenizerError where the file is not the recorded one."""
    from attnspec.io import RUN_FILE, read_run
    from attnspec.tokenizer import tokenizer_in

    directory = Path(directory)
    if (directory / RUN_FILE).is_file():
        identity = (read_run(directory).get("data") or {}).get("tokenizer")
    else:
        recorded = parse_manifest(directory).tokenizer
        identity = None if recorded is None else recorded.model_dump(exclude_none=True)
    return None if identity is None else tokenizer_in(directory, identity)


def generation_of(directory: Path | str) -> dict | None:
    """The decoding defaults a build directory carries (``generation_config.json``, checked against the size and
    SHA-256 its manifest records, then field by field: :mod:`attnspec.compiler.generation`); None where its
    manifest lists none. Raises BuildError where the file is not the recorded one or not a valid config."""
    from attnspec.compiler.generation import GENERATION_FILE, read_generation_config

    directory = Path(directory)
    manifest = parse_manifest(directory)
    entry = manifest.files.get(GENERATION_FILE)
    if entry is None:
        return None
    path = directory / GENERATION_FILE
    check_listed_file(path, entry)
    try:
        return read_generation_config(path, manifest.vocab_size or 0)
    except RunError as error:
        raise BuildError(str(error)) from None


def load_model(directory: Path | str, manifest: Manifest | None = None, device=None,
               weights: Path | str | None = None, strict: bool = True) -> Model:
    """Rebuild the eager model of a build directory (spec.yaml + model.safetensors).

    Args:
        directory: a directory written by ``attnspec build``.
        manifest: its manifest, when already read and checked (:func:`read_manifest`).
        device: where to put the model ("cpu", "cuda", "cuda:N"; default the CPU), whatever device
            the directory was built on: the weights are device-free, only the exported programs are not.
        weights: a safetensors file to load over the directory's weights (another model's: an import
            before an edit); with ``strict=False`` what fits by name and shape is loaded, the rest kept,
            a warning names them and ``model.weights_fit`` holds the :class:`WeightsFit`.

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
        raise BuildError(f"{directory}/manifest.json: its spec is not valid ({shorten(str(error), 600)}); rebuild "
                         "the directory") from None
    try:
        check_model_size(spec)  # on the meta device, before anything the spec asks for is allocated
    except BuildError as error:
        raise BuildError(f"{directory}/manifest.json: {error}") from None
    model = build_model_from_spec(spec, empty=True)  # every parameter comes from model.safetensors
    check_decoding_fields(directory, manifest, model)
    modes = [layer.full_mode for layer in manifest.plan.layers]
    fits = len(modes) == len(model.blocks) and all(mode in b.mixer.modes for mode, b in zip(modes, model.blocks))
    if not fits:
        raise BuildError(f"{directory}/manifest.json: its plan does not fit spec.yaml ({len(modes)} modes for "
                         f"{len(model.blocks)} blocks, or a mode a mixer lacks); rebuild the directory")
    model.set_modes(modes)
    load_weights(model, directory / "model.safetensors")
    if weights is not None:
        fit = load_weights(model, Path(weights), fix="they must come from a model of this spec, or pass strict=False",
                           strict=strict)
        if not fit.exact:
            warnings.warn(f"{weights}: {len(fit.loaded)} tensor(s) loaded; {fit.problems()} (kept from {directory})",
                          stacklevel=2)
        model.weights_fit = fit
    return model.to(device).eval()


__all__ = ["WeightsFit", "load_model", "load_weights", "read_manifest"]
