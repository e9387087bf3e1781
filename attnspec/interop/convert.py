"""``attnspec import-hf`` and ``attnspec export-hf``: transformers checkpoints in, trained specs out.

In: a checkpoint's ``config.json`` becomes a spec (its family in :mod:`attnspec.interop.families`, found
by :mod:`attnspec.interop.registry`), its weights are
mapped tensor by tensor onto the spec's model, and the pair is built like any spec
(:func:`attnspec.compiler.build.build_directory`: verified, compiled, exported).

Out: a build or run directory becomes a transformers directory, as the native model type when the
spec is one transformers has (decided by a round trip: the type's config must import as this very
spec), else as the ``attnspec`` type that :mod:`attnspec.hf.modeling` registers with the Auto classes.
Either way the output is written into a scratch directory and published by one rename.
"""

from __future__ import annotations

import dataclasses

import os
import re
import time
from pathlib import Path

import torch

from attnspec.compiler.generation import (GENERATION_FILE, checked_generation_config, read_generation_config,
                                          write_generation_config)
from attnspec.compiler.manifest import sha256
from attnspec.compiler.outdir import OutputKind, Scratch, check_output
from attnspec.errors import AttnSpecError, InteropError, RunError, SpecError, shorten
from attnspec.interop.config import NotExpressible
from attnspec.interop.gguf_tokenizer import gguf_tokenizer
from attnspec.interop.refused import refusal
from attnspec.interop.registry import architectures, export_order, wrappers
from attnspec.interop.architecture import Copy
from attnspec.interop.checkpoint import CONFIG, WEIGHTS, open_checkpoint, write_checkpoint
from attnspec.spec import limits
from attnspec.spec.emit import spec_to_data
from attnspec.spec.ir import Spec
from attnspec.spec.validate import validate_data
from attnspec.spec.walk import iter_blocks
from attnspec.tokenizer import FILES as TOKENIZER_FILES
from attnspec.tokenizer import TOKENIZER_CONFIG, TokenizerError, save_tokenizer, tokenizer_in

ATTNSPEC_TYPE = "attnspec"
IGNORED = re.compile(r".*\.rotary_emb\.inv_freq$")
"""Tensors old checkpoints carry that are no weights (recomputed from the config)."""
def _name(directory: Path) -> str:
    name = directory.resolve().stem if directory.is_file() else directory.resolve().name
    name = re.sub(r"[^A-Za-z0-9_.-]+", "-", name).strip("-.") or "imported"
    return name[:64]


def _opened(checkpoint):
    """A checkpoint path opened (:func:`attnspec.interop.checkpoint.open_checkpoint`), or one already open."""
    return open_checkpoint(checkpoint) if isinstance(checkpoint, (str, Path)) else checkpoint


GGUF_DTYPE = "bfloat16"
"""A GGUF import's default dtype: the releases GGUF files are made from are bfloat16 models (the file's
own types are its quantisation, no model dtype), and half of float32's memory; ``--dtype float32`` keeps
every dequantised value exactly (a block's scale times a small integer)."""


def _printable(name: str) -> str:
    """A file name as text: bytes that are not UTF-8 (Python keeps them as surrogates) become U+FFFD."""
    return name.encode("utf-8", "surrogateescape").decode("utf-8", "replace")


def spec_from_checkpoint(directory, *, max_len: int | None = None,
                         dtype: str | None = None) -> tuple[dict, Spec, str]:
    """The spec of a transformers checkpoint or GGUF file (a path, or one opened by
    :func:`~attnspec.interop.checkpoint.open_checkpoint`), as data and validated, and its model type.
    ``dtype``: the parameters' (None: the checkpoint's own; a GGUF file's: :data:`GGUF_DTYPE`).

    Raises:
        InteropError: the model type is not supported, or the config asks for something attnspec
            cannot express (naming the field and the layers), or the spec breaks attnspec's limits.
    """
    checkpoint = _opened(directory)
    directory = checkpoint.path
    if max_len is not None and (isinstance(max_len, bool) or not isinstance(max_len, int)
                                or not 2 <= max_len <= limits.MAX_LEN):
        raise InteropError(f"--max-len must be a whole number from 2 to {limits.MAX_LEN:,} (the longest sequence the "
                           f"model takes and its caches hold), got {shorten(max_len)}")
    config = checkpoint.config
    source = f"{directory} (its GGUF metadata)" if checkpoint.gguf else f"{directory}/config.json"
    quantization = config.get("quantization_config")
    if quantization is not None:  # packed integers, scales beside the weights: nothing attnspec's maps read
        method = quantization.get("quant_method") if isinstance(quantization, dict) else None
        raise InteropError(f"{source}: `quantization_config`: a quantised checkpoint"
                           f"{f' (quant_method {shorten(method)})' if isinstance(method, str) else ''}; attnspec imports "
                           "unquantised weights: save the model dequantised in transformers (`model.dequantize()` "
                           "where its method has it) or import the release's full-precision weights")
    model_type = config.get("model_type")
    wrapper = wrappers().get(model_type) if isinstance(model_type, str) else None
    if wrapper is not None:  # the text model of a multimodal release
        text = config.get("text_config")
        if not isinstance(text, dict):
            raise InteropError(f"{source}: `text_config`: a {model_type} config holds its text model's config there")
        source += " text_config"
        text = {field: value for field, value in text.items() if field not in wrapper.unapplied}
        config = {**text, "model_type": wrapper.text_type,
                  "tie_word_embeddings": config.get("tie_word_embeddings", text.get("tie_word_embeddings"))}
        model_type = config["model_type"]
    if not isinstance(model_type, str) or model_type not in architectures():
        raise InteropError(f"{source}: {refusal(model_type, config)}")
    architecture = architectures()[model_type]
    data = architecture.spec(architecture.read(config, model_type, source), model_type)
    data = {"name": _name(directory),
            "description": f"Imported from a {'GGUF file of a ' if checkpoint.gguf else 'transformers '}{model_type}"
                           f" {'model' if checkpoint.gguf else 'checkpoint'} ({_printable(directory.resolve().name)}).",
            **data}
    if dtype is None and checkpoint.gguf:
        dtype = GGUF_DTYPE
    if max_len is not None:
        data["max_len"] = max_len
    if dtype is not None:
        if dtype not in ("float32", "float64", "bfloat16", "float16"):
            raise InteropError(f"--dtype {shorten(dtype)}: give float32, bfloat16, float16 or float64")
        data["dtype"] = dtype
    try:
        spec = validate_data(data)
    except SpecError as error:
        raise InteropError(f"{source}: the model it describes is not a valid attnspec spec:\n{error}") from None
    if stored_head_differs(checkpoint, spec, model_type):  # as transformers loads it
        data["head"] = {**spec.head.model_dump(mode="json"), "tied": False}
        data["description"] += (" Its config ties the LM head to the embedding, but the checkpoint stores another "
                                "head, which transformers loads untied: so does this spec.")
        spec = validate_data(data)
    return data, spec, model_type


def convert_weights(spec, checkpoint: Path | str, model_type: str) -> dict[str, torch.Tensor]:
    """The checkpoint's tensors as the state dict of ``spec``'s model (each in the dtype the model holds it:
    ``spec.dtype``, float32 for the parameters it keeps there). Holds the whole model: an import streams
    them instead (:func:`converted_tensors`).

    Raises:
        InteropError: a tensor is missing, of the wrong size, not finite, or left over (something the
            spec does not model).
    """
    return dict(converted_tensors(spec, checkpoint, model_type)[1])


def target_layout(spec) -> dict[str, tuple[tuple[int, ...], str]]:
    """Every tensor of ``spec``'s model: name -> (shape, dtype name), its parameters found on the meta device
    (its buffers, small, made as the model makes them)."""
    from attnspec.nn.model import build_model_from_spec

    model = build_model_from_spec(spec, empty=True)
    return {name: (tuple(t.shape), str(t.dtype).removeprefix("torch.")) for name, t in model.state_dict().items()}


def converted_tensors(spec, checkpoint: Path | str, model_type: str):
    """The checkpoint's tensors mapped onto ``spec``'s model, one link at a time: (the model's layout, name ->
    (shape, dtype name); an iterator of (name, tensor) covering it). Every name is checked before the first
    tensor is read; a link's arithmetic (splits, logs, μP scales) runs in float32 (float64 in a float64 spec)
    and each result is then cast to the dtype the model holds it in.

    Raises:
        InteropError: as :func:`convert_weights` (a tensor's own problems as the iterator reaches it).
    """
    opened = _opened(checkpoint)
    checkpoint = opened.path
    layout = target_layout(spec)
    architecture = architectures()[model_type]
    links, other = _stored_links(opened, spec, model_type)  # other: a multimodal checkpoint's other prefixes
    wanted = {link.theirs for link in links}
    head, embed = _tied_names(opened, spec, model_type)
    files = opened.bind(sorted(wanted | {head or "lm_head.weight"}))
    missing = sorted(wanted - set(files))
    if missing:
        raise InteropError(f"{checkpoint}: the weights lack {shorten(missing[0], 100)} (and {len(missing) - 1} more), "
                           f"which a {model_type} model of this config has")
    copies = {name: copy for name in sorted(set(files) - wanted)
              if (copy := architecture.copy_of(name, spec, opened.config)) is not None}
    if head is not None and head in files:  # a tied head stored beside the embedding it copies
        copies[head] = Copy(embed, lambda tensor: tensor, what="a copy of the embedding, as the spec ties the head to it")
    unused = architecture.unused
    extra = sorted(name for name in set(files) - wanted if not IGNORED.match(name) and name not in copies
                   and not (other is not None and name.startswith(other)) and not unused(name, spec))
    if extra:
        raise InteropError(f"{checkpoint}: tensor {shorten(extra[0], 100)} (and {len(extra) - 1} more) is not part of "
                           f"the {model_type} model this config describes; attnspec imports nothing it would drop")
    for name, copy in copies.items():  # compared before anything is converted: a stored tensor is never dropped unread
        if copy.source not in files or not _holds(opened, name, copy):
            raise InteropError(f"{checkpoint}: tensor {shorten(name, 100)} differs from what attnspec's {model_type} "
                               f"model holds there, {copy.what} ({copy.source}); transformers reads it as stored, so "
                               "attnspec cannot import this checkpoint as it is"
                               + (" (import it with the head untied: `head.tied: false`)" if name == head else ""))
    covered = [name for link in links for name in link.ours]
    if sorted(covered) != sorted(layout):  # every tensor of the model comes from the checkpoint once
        raise InteropError(f"internal: the {model_type} mapping leaves {sorted(set(layout) - set(covered))[:3]} unset")
    scales = architecture.weight_scales(spec, architecture.read(opened.config, model_type, str(checkpoint)))
    exact = torch.float64 if spec.dtype == "float64" else torch.float32

    def tensors():
        reader = opened
        for link in links:
            targets = [layout[name][0] for name in link.ours]
            if link.plain and scales.get(link.ours[0], 1.0) == 1.0:  # one tensor as it is: cast, no arithmetic
                tensor = reader.read(link.theirs)
                if tuple(tensor.shape) != tuple(targets[0]):
                    raise InteropError(f"{checkpoint}: tensor {link.theirs} is {tuple(tensor.shape)}, the config "
                                       f"implies {tuple(targets[0])}")
                yield link.ours[0], tensor.to(getattr(torch, layout[link.ours[0]][1]))
                continue
            tensor = reader.read(link.theirs, exact)
            expected = link.join([torch.empty(shape, device="meta") for shape in targets]).shape
            if tensor.shape != expected:
                raise InteropError(f"{checkpoint}: tensor {link.theirs} is {tuple(tensor.shape)}, the config implies "
                                   f"{tuple(expected)}")
            parts = link.split(tensor, targets)
            if link.log and not all(torch.isfinite(part).all() for part in parts):  # the log of a rate <= 0
                raise InteropError(f"{checkpoint}: tensor {link.theirs} must be positive (attnspec holds its log)")
            for name, part in zip(link.ours, parts):
                scale = scales.get(name, 1.0)  # μP multipliers folded into the weights they multiply
                part = part * scale if scale != 1.0 else part
                yield name, part.to(getattr(torch, layout[name][1])).contiguous()

    return layout, tensors()


def _stored_links(opened, spec, model_type: str) -> tuple[list, str | None]:
    """(``spec``'s links with each transformers tensor named as the checkpoint stores it, the prefixes of a
    multimodal checkpoint's tensors that are not its text model's, or None)."""
    links = architectures()[model_type].stored_links(spec, model_type)
    wrapper = wrappers().get(opened.config.get("model_type"))
    if wrapper is None or wrapper.text_type != model_type:
        return links, None
    return [dataclasses.replace(link, theirs=wrapper.stored_name(link.theirs)) for link in links], wrapper.foreign


def _tied_names(opened, spec, model_type: str) -> tuple[str | None, str | None]:
    """(the LM head's stored name, the embedding's) where ``spec`` ties its head (the names an untied head
    of the type reads); (None, None) for an untied head or a GGUF file (whose tie is its output tensor's
    absence)."""
    if not spec.head.tied or opened.gguf:
        return None, None
    untied = spec.model_copy(update={"head": spec.head.model_copy(update={"tied": False})})
    links, _ = _stored_links(opened, untied, model_type)
    named = {tuple(link.ours): link.theirs for link in links}
    return named.get(("head.weight",)), named.get(("embed.weight",))


def _holds(opened, name: str, copy: Copy) -> bool:
    """Whether the stored ``name`` is what ``copy`` computes from its source (both read as stored)."""
    stored, expected = opened.read(name), copy.compute(opened.read(copy.source))
    if stored.shape != expected.shape or stored.dtype != expected.dtype:
        return False
    if copy.rtol == 0:
        return bool(torch.equal(stored, expected))
    return bool(torch.allclose(stored, expected, rtol=copy.rtol, atol=0))


def stored_head_differs(opened, spec, model_type: str) -> bool:
    """Whether a checkpoint whose ``spec`` ties the head stores a head other than its embedding: transformers
    then loads the stored head, untied (its warning: "both are present in the checkpoints with different
    values, so we will NOT tie them")."""
    if not spec.head.tied or opened.gguf or not opened.stores_weights():  # a config alone: nothing to compare
        return False
    head, embed = _tied_names(opened, spec, model_type)
    if head is None or embed is None:
        return False
    stored = opened.bind([head, embed])
    if head not in stored or embed not in stored:
        return False
    return not _holds(opened, head, Copy(embed, lambda tensor: tensor))


def write_converted(spec, checkpoint: Path | str, model_type: str, path: Path) -> None:
    """The checkpoint's tensors as ``spec``'s model's weights file ``path``, converted and written one
    link at a time (:class:`attnspec.io.TensorFileWriter`): an import holds one tensor, never two models."""
    from attnspec.io import TensorFileWriter

    layout, tensors = converted_tensors(spec, checkpoint, model_type)
    with TensorFileWriter(path, layout) as writer:
        for name, tensor in tensors:
            writer.write(name, tensor)


def import_hf(checkpoint: Path | str, output: Path | str, *, max_len: int | None = None,
              compile_check: bool | str = "trace",
              force: bool = False, calibrate: bool = True, on_stage=None, dtype: str | None = None,
              programs=(), check: bool = True):
    """``attnspec import-hf``: a transformers checkpoint as an attnspec build directory.

    ``dtype``: the parameters' (default the checkpoint's own). ``programs``: the exported programs to write
    (:data:`attnspec.compiler.build.PROGRAMS`; none by default: a released model's are seconds of tracing
    per block and a copy of its weights each, and nothing but a user without attnspec needs them).
    The weights are converted tensor by tensor straight into the build's ``model.safetensors``.
    ``compile_check``: as :func:`~attnspec.compiler.build.build_directory`'s; ``"trace"`` by default (fullgraph
    and equal to eager through Dynamo and AOTAutograd; Inductor's code generation, 15-30 s on a 2-core CPU
    for any model, is what a released model's standard blocks need least checked: the suite compiles each
    component with it, and ``attnspec export`` runs it).
    ``check``: then compare the built model with transformers' on a short prompt (:mod:`attnspec.interop.check`;
    the result's ``import_check``, reported as skipped where transformers is absent or cannot load it).

    Returns the :class:`~attnspec.compiler.build.BuildResult` (its spec data is in ``manifest["spec"]``).
    Nothing is written when the checkpoint cannot be imported.
    """
    from attnspec.compiler.build import build_directory

    opened = _opened(checkpoint)
    checkpoint = opened.path
    data, spec, model_type = spec_from_checkpoint(opened, max_len=max_len, dtype=dtype)
    converted_tensors(spec, opened, model_type)  # every name and shape checked before anything is written
    try:  # a tokenizer.json beside the weights travels with them (a GGUF file's is made from its metadata)
        tokenizer = gguf_tokenizer(opened) if opened.gguf else tokenizer_in(checkpoint)
    except TokenizerError as error:
        if opened.gguf:
            raise InteropError(f"{checkpoint}: its tokenizer cannot be carried ({error})") from None
        raise InteropError(f"{checkpoint}: its tokenizer cannot be carried ({error}); move tokenizer.json away to "
                           "import the weights alone") from None
    generation = None  # and the release's decoding defaults (its checked fields)
    if not opened.gguf and (checkpoint / GENERATION_FILE).exists():
        try:
            generation = read_generation_config(Path(checkpoint) / GENERATION_FILE, spec.input.vocab_size,
                                                follow_links=True)
        except RunError as error:
            raise InteropError(f"{error}; move {GENERATION_FILE} away to import the weights without it") from None
    compared = check and model_type == opened.config.get("model_type")
    ours, seconds = [], []

    def beside_compile_check(model):  # attnspec's side of the check, and transformers' import, on this core
        from attnspec.interop.check import import_transformers, our_side

        if on_stage is not None:
            on_stage("check", None)
        start = time.perf_counter()
        ours.append(our_side(model))
        import_transformers(opened)
        seconds.append(time.perf_counter() - start)

    result = build_directory(data, output, weights=lambda path: write_converted(spec, opened, model_type, path),
                             compile_check=compile_check, force=force, programs=programs,
                             calibrate=calibrate, on_stage=on_stage, tokenizer=tokenizer, generation=generation,
                             beside_compile_check=beside_compile_check if compared else None)
    if compared:  # transformers' side, now that the build's model is dropped
        from attnspec.interop.check import compare

        start = time.perf_counter()
        result.import_check = compare(opened, ours[0])
        if on_stage is not None:
            on_stage("check", round(seconds[0] + time.perf_counter() - start, 3))
    elif check:  # the text model of a multimodal release
        from attnspec.interop.check import ImportCheck

        result.import_check = ImportCheck(skipped=f"transformers' model of this checkpoint is multimodal; its "
                                                  f"{model_type} text model is what was imported")
    return result


# --------------------------------------------------------------------------- export


def _comparable(spec) -> dict:
    """What a spec computes, for the round-trip test: its fields but the name, description, seed,
    initialisation and the layers' grouping, with every block's mode and chunk size dropped (they
    choose how or where training starts, not what is computed)."""
    data = spec_to_data(spec, minimal=False)
    for key in ("name", "description", "seed", "init", "layers"):
        data.pop(key, None)

    def without_modes(value):
        if isinstance(value, dict):
            return {k: without_modes(v) for k, v in value.items() if k not in ("mode", "chunk_size")}
        if isinstance(value, list):
            return [without_modes(v) for v in value]
        return value

    data["blocks"] = [without_modes(block.model_dump(mode="json")) for _, block in iter_blocks(spec, expand=True)]
    data["shared"] = without_modes(data.get("shared", []))
    return data


def native_config(spec, model_type: str) -> dict:
    """The transformers ``config.json`` of ``spec`` as ``model_type``.

    Raises:
        NotExpressible: the type cannot state this spec (its config would import as another one).
    """
    architecture = architectures()[model_type]
    try:  # a draft the round trip below confirms; a spec of another shape lacks what it reads
        drafted = architecture.config(spec, model_type)
    except AttributeError as error:
        raise NotExpressible(f"the spec has no {error.name!r} where a {model_type} model has one") from None
    config = {"model_type": model_type, "architectures": [architecture.causal_lm[model_type]],
              "vocab_size": spec.input.vocab_size, "max_position_embeddings": spec.max_len,
              "tie_word_embeddings": spec.head.tied, "dtype": spec.dtype, **drafted}
    try:
        again = validate_data({"name": spec.name, **architecture.spec(architecture.read(config, model_type, "config"),
                                                                      model_type)})
    except AttnSpecError as error:
        raise NotExpressible(str(error)) from None
    if _comparable(again) != _comparable(spec):
        raise NotExpressible(f"a {model_type} config cannot state every field of this spec")
    return config


PLUGINS_REFUSED = ("its spec uses plugins, which a transformers directory cannot carry (loading it would import "
                   "modules a file names)")


def _lm_problem(spec) -> str | None:
    if spec.input.kind != "tokens" or spec.head.kind != "lm":
        return "transformers' causal LMs take tokens and predict them: the spec needs token input and an lm head"
    return PLUGINS_REFUSED if spec.plugins else None


EXPORT_MARKER = "attnspec_export.json"
"""What export-hf writes beside the transformers files: every file it wrote, with its size and SHA-256.
``--force`` replaces a directory only where this record holds and the directory holds exactly what it
lists (a file name says nothing of who wrote it: a user's own llama directory has the same names)."""
MAX_MARKER_BYTES = 1 << 16


def _write_marker(directory: Path) -> None:
    """Record every file in the (scratch) ``directory`` as export-hf's, in :data:`EXPORT_MARKER`."""
    import json

    from attnspec.io import VERSION, write_atomic

    files = {name: {"size": (directory / name).stat().st_size, "sha256": sha256(directory / name)}
             for name in sorted(os.listdir(directory))}
    write_atomic(directory / EXPORT_MARKER, json.dumps({"written_by": "attnspec export-hf",
                                                        "attnspec_version": VERSION, "files": files}, indent=2) + "\n")


def _export_problem(output: Path) -> str | None:
    """Why ``--force`` may not replace ``output``: it must hold export-hf's record (:data:`EXPORT_MARKER`)
    and exactly the files it lists, each of its recorded size and SHA-256."""
    from attnspec.io import read_json

    if output.is_symlink() or not output.is_dir():
        return "it is a symbolic link" if output.is_symlink() else "it is not a directory"
    try:
        record = read_json(output / EXPORT_MARKER, MAX_MARKER_BYTES)
    except AttnSpecError:
        return f"it holds no {EXPORT_MARKER}, the record export-hf writes, so attnspec did not write it"
    files = record.get("files") if isinstance(record, dict) and record.get("written_by") == "attnspec export-hf" \
        else None
    if not isinstance(files, dict) or not all(isinstance(v, dict) for v in files.values()):
        return f"its {EXPORT_MARKER} is not one export-hf wrote"
    present = set(os.listdir(output)) - {EXPORT_MARKER}
    foreign = sorted(present - set(files))
    if foreign:
        return f"it holds files export-hf did not write ({', '.join(shorten(n) for n in foreign[:5])}); move them out"
    for name in sorted(present):  # only the directory's own entries are read: a record's "../x" names nothing
        path, entry = output / name, files[name]
        if path.is_symlink() or not path.is_file() or path.stat().st_size != entry.get("size") \
                or sha256(path) != entry.get("sha256"):
            return f"its {shorten(name)} is not the file export-hf wrote (changed since)"
    if present != set(files):
        return f"it lacks files export-hf wrote ({', '.join(shorten(n) for n in sorted(set(files) - present)[:5])})"
    return None


EXPORT_FILES = frozenset({CONFIG, WEIGHTS, TOKENIZER_CONFIG, EXPORT_MARKER, GENERATION_FILE, *TOKENIZER_FILES.values()})
EXPORT = OutputKind("transformers directory", EXPORT_FILES, _export_problem)


def export_hf(directory: Path | str, output: Path | str, *, model_type: str | None = None,
              force: bool = False) -> tuple[Path, str]:
    """``attnspec export-hf``: a build or run directory as a transformers directory.

    Args:
        directory: a build directory, or a training run directory (its latest checkpoint).
        output: the directory to create (it must not exist).
        model_type: a native type to insist on (an InteropError says why it does not fit); by default
            the first native type that states the spec exactly, else ``attnspec``.
        force: replace an existing directory that export-hf wrote (nothing else), atomically.

    Returns:
        (the output directory, the model type written).
    """
    from attnspec.compiler.load import generation_of, tokenizer_of
    from attnspec.io import RUN_FILE
    from attnspec.training.rundir import load_trained

    directory, output = Path(directory), Path(output)
    check_output(output, force, EXPORT)
    _check_model_type(model_type)
    generation = None if (directory / RUN_FILE).is_file() else generation_of(directory)
    return export_model_hf(load_trained(directory), output, model_type=model_type, force=force, source=str(directory),
                           tokenizer=tokenizer_of(directory), generation=generation)


def _check_model_type(model_type: str | None) -> None:
    if model_type is not None and model_type != ATTNSPEC_TYPE and model_type not in architectures():
        raise InteropError(f"--model-type {shorten(model_type)}: attnspec writes {', '.join(sorted(architectures()))} "
                           f"or {ATTNSPEC_TYPE}")


def export_model_hf(model, output: Path | str, *, model_type: str | None = None, force: bool = False,
                    source: str = "the model", tokenizer=None, generation: dict | None = None) -> tuple[Path, str]:
    """An attnspec model (built, loaded or trained in Python) as a transformers directory: what
    :func:`export_hf` writes for a build directory; ``source`` names the model in errors; ``tokenizer``
    (:class:`attnspec.tokenizer.Tokenizer`) is written beside the weights, with the
    ``tokenizer_config.json`` ``AutoTokenizer`` reads (and the config's ``eos_token_id``); ``generation``
    (checked fields of a release's decoding defaults, :mod:`attnspec.compiler.generation`) as its
    ``generation_config.json``, which transformers' ``generate`` follows."""
    output = Path(output)
    check_output(output, force, EXPORT)
    _check_model_type(model_type)
    spec = model.spec
    problem = _lm_problem(spec)
    if problem:
        raise InteropError(f"{source}: {problem}")
    ours = {name: t.detach().cpu() for name, t in model.state_dict().items()}
    candidates = export_order() if model_type is None else () if model_type == ATTNSPEC_TYPE else (model_type,)
    config = None
    for candidate in candidates:
        try:
            config = native_config(spec, candidate)
        except NotExpressible as reason:
            if model_type is not None:
                raise InteropError(f"{source}: its spec is not a {model_type} model ({reason}); export it as "
                                   f"`--model-type {ATTNSPEC_TYPE}` or leave --model-type out") from None
            continue
        model_type = candidate
        break
    if config is not None:
        tensors = {link.theirs: link.join([ours[name] for name in link.ours])
                   for link in architectures()[model_type].stored_links(spec, model_type)}
        tensors.update(architectures()[model_type].derived_tensors(spec, tensors, config))
    else:
        model_type = ATTNSPEC_TYPE
        config = attnspec_config(spec, [block.mixer.mode for block in model.blocks])
        tensors = {f"model.{name}": tensor for name, tensor in ours.items()}
    if tokenizer is not None:
        config["eos_token_id"] = tokenizer.eos_id
        if tokenizer.bos_id is not None:
            config["bos_token_id"] = tokenizer.bos_id
    with Scratch(output, EXPORT) as scratch:
        write_checkpoint(scratch.path, config, tensors)
        if tokenizer is not None:
            save_tokenizer(tokenizer, scratch.path, max_len=spec.max_len)
        if generation:
            write_generation_config(scratch.path, checked_generation_config(generation, spec.input.vocab_size,
                                                                            "the generation config"))
        _write_marker(scratch.path)
        scratch.publish(force)
    return output, model_type


def attnspec_config(spec, modes: list[str]) -> dict:
    """The ``config.json`` of the ``attnspec`` model type: the resolved spec and the planned modes."""
    return {"model_type": ATTNSPEC_TYPE, "architectures": ["AttnspecForCausalLM"],
            "spec": spec_to_data(spec, minimal=False), "modes": modes, "vocab_size": spec.input.vocab_size,
            "max_position_embeddings": spec.max_len, "tie_word_embeddings": spec.head.tied, "dtype": spec.dtype}
