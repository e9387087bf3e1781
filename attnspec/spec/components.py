"""The component registry of the spec layer: which IR classes fill each slot of a spec (no torch).

A *slot* is a place in a spec that takes one of several kinds of component: ``feature_map``,
``reweighting``, ``transition``, ``lowrank``, ``sparse``, ``mixer``. Each kind is one IR class
(a pydantic model with a ``kind`` literal) that carries its facts as class attributes and methods
(its feature width, whether it is non-negative, complex, per channel, its own rules, ...), and
names its implementation: the ``nn.Module`` class registered for the same kind in
:mod:`attnspec.nn.registry`, or, for plugins, a ``"module:Class"`` string that registry imports on
first build (so that ``attnspec check`` never imports torch).

The slot unions of the IR (:data:`attnspec.spec.ir.FeatureMap`, ...) are built from this registry;
:func:`register` adds a kind at run time (a plugin) and rebuilds the IR models that have the slot,
so validation, did-you-mean suggestions, the JSON Schema, the grammar and everything downstream
see the new kind exactly like a built-in one.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.machinery
import json
import os
import re
import sys
import typing
from pathlib import Path
from typing import Annotated, Any, Callable, Union

from pydantic import BaseModel, BeforeValidator, Discriminator, Field, Tag

from attnspec.errors import Problem, SpecError, shorten

SLOTS: dict[str, dict[str, type]] = {}
"""slot -> kind -> IR class, in registration order."""
DEFAULT_KINDS: dict[str, str] = {}
"""slot -> the kind a mapping without ``kind`` means (``mlp: {expansion: 2}`` is an ``mlp``)."""
BASES: dict[str, type] = {}
"""slot -> base class: the facts, with defaults, that every component of the slot (a plugin's too) inherits."""
_MODELS: list[type] = []
"""Every model whose fields hold components, leaves first: the order :func:`register` rebuilds them in."""
_FIELDS: list[tuple[type, str, str]] = []
"""(IR model, field name, slot) for every field whose type is a slot union."""
_LIST_FIELDS: list[tuple[type, str, str]] = []
"""(IR model, field name, slot) for every field that is a list of a slot's components."""
_DECLARED: list[tuple[Any, str]] = []
"""(union, slot) for every union :func:`declare` returned."""
ENTRY_POINT_GROUP = "attnspec.components"
PLUGIN_ENV = "ATTNSPEC_PLUGINS"
"""The environment variable naming the plugin modules the user allows (comma-separated); child
processes of attnspec inherit it, so a sweep's workers allow what the sweep's user allowed."""
PLUGIN_FILES_ENV = "ATTNSPEC_PLUGIN_FILES"
"""Set by attnspec for its child processes: the file and sha256 of each plugin the parent imported, so
a child imports the very file the user's consent covered (JSON, name -> [path, sha256])."""
_allowed: set[str] = set()
"""Modules the user named (``--plugin``, :func:`allow_plugins`) or installed as entry points."""
_MODULE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")


def kind_of(cls: type) -> str:
    """The ``kind`` literal of an IR component class."""
    return typing.get_args(cls.model_fields["kind"].annotation)[0]


def kind_shorthand(value: Any) -> Any:
    """Accept ``"relu"`` as shorthand for ``{"kind": "relu"}``."""
    return {"kind": value} if isinstance(value, str) else value


def union(slot: str) -> Any:
    """The annotation of a field of ``slot``: the discriminated union of its kinds, with the shorthand."""
    members = tuple(SLOTS[slot].values())
    default = DEFAULT_KINDS.get(slot)
    if default is None:
        inner = Annotated[Union[members], Field(discriminator="kind")]  # type: ignore[valid-type]
    else:  # a mapping without `kind` is the default kind
        tagged = tuple(Annotated[cls, Tag(kind_of(cls))] for cls in members)
        inner = Annotated[Union[tagged], Discriminator(_kind_or(default))]  # type: ignore[valid-type]
    return Annotated[inner, BeforeValidator(kind_shorthand)]


def _kind_or(default: str) -> Callable[[Any], str]:
    def kind(value: Any) -> str:
        return value.get("kind", default) if isinstance(value, dict) else getattr(value, "kind", default)
    return kind


def declare(slot: str, *members: type, default: str | None = None, base: type | None = None) -> Any:
    """Register the built-in ``members`` of ``slot`` (in order) and return the slot's union;
    ``default``: the kind a mapping without ``kind`` stands for; ``base``: the class every member
    of a slot declared outside the spec IR derives from (plugins must too)."""
    if base is not None:
        BASES[slot] = base
    for cls in members:
        SLOTS.setdefault(slot, {})[kind_of(cls)] = cls
        cls.slot = slot
    if default is not None:
        DEFAULT_KINDS[slot] = default
    declared = union(slot)
    _DECLARED.append((declared, slot))
    return declared


def slot_of(annotation: Any) -> str | None:
    """The slot whose union :func:`declare` returned as ``annotation``, or None."""
    return next((slot for declared, slot in _DECLARED if declared is annotation), None)


def slot_fields_of(models: list[type], namespace: dict[str, Any]) -> None:
    """Record (:func:`slot_field`) every field of ``models`` annotated with a slot's union, as the class
    bodies write it (``feature_map: FeatureMap``, ``position: Position | None``, inherited fields
    too), the union's name looked up in ``namespace`` (the defining module's globals). ``models``
    come leaves first: a plugin's kind rebuilds them in this order."""
    for model in models:
        if model not in _MODELS:
            _MODELS.append(model)
        annotations = {}
        for cls in reversed(model.__mro__):
            annotations.update(cls.__dict__.get("__annotations__", {}))
        for name, annotation in annotations.items():
            text = annotation if isinstance(annotation, str) else ""
            slot = slot_of(namespace.get(text.removesuffix(" | None").strip()))
            if slot is not None and name in model.model_fields:
                slot_field(model, name, slot)


def slot_field(model: type, name: str, slot: str) -> None:
    """Record that ``model.name`` holds a component of ``slot`` (rebuilt when the slot grows)."""
    _FIELDS.append((model, name, slot))


def slot_list_field(model: type, name: str, slot: str) -> None:
    """Make ``model.name`` a list of ``slot``'s components (its length limits kept: a parallel mixer's
    branches) and record it, so a plugin's kind is accepted in the list too."""
    _LIST_FIELDS.append((model, name, slot))
    _set_list_field(model, name, slot)
    model.model_rebuild(force=True)


def _set_list_field(model: type, name: str, slot: str) -> None:
    from pydantic.fields import FieldInfo

    old = model.model_fields[name]
    model.model_fields[name] = FieldInfo.from_annotated_attribute(
        Annotated[list[union(slot)], *old.metadata], Field(description=old.description))


def register(slot: str, cls: type[BaseModel]) -> type[BaseModel]:
    """Add the IR class ``cls`` to ``slot`` (a plugin's component) and rebuild the IR around it.

    Raises:
        SpecError: the slot does not exist, or the kind is taken by another class.
    """
    from pydantic.fields import FieldInfo

    if slot not in SLOTS:
        raise SpecError(Problem(f"no component slot {shorten(slot)}; slots are {', '.join(SLOTS)}"))
    base = BASES[slot]
    if not (isinstance(cls, type) and issubclass(cls, base)):
        raise SpecError(Problem(f"a {slot} component must be a subclass of attnspec.spec.ir.{base.__name__} (it "
                                f"states the facts every {slot} has), got {shorten(cls)}"))
    missing = [name for name in getattr(base, "required_overrides", ()) if getattr(cls, name) is getattr(base, name)]
    if missing:
        raise SpecError(Problem(f"{shorten(cls)} must state {', '.join(missing)} (every {slot} family does: see "
                                f"attnspec.spec.ir.{base.__name__} and examples/plugins/ema.py)"))
    kind = kind_of(cls)
    existing = SLOTS[slot].get(kind)
    if existing is cls:
        return cls
    if existing is not None:
        raise SpecError(Problem(f"{slot} kind {kind!r} is already defined by {existing.__module__}."
                                f"{existing.__qualname__}; choose another kind name"))
    SLOTS[slot][kind] = cls
    cls.slot = slot
    for model, name, field_slot in _FIELDS:
        if field_slot == slot:
            old = model.model_fields[name]
            model.model_fields[name] = FieldInfo.from_annotated_attribute(
                union(slot), Field(default_factory=old.default_factory, description=old.description)
                if old.default_factory is not None else Field(description=old.description))
    for model, name, field_slot in _LIST_FIELDS:
        if field_slot == slot:
            _set_list_field(model, name, slot)
    others = [model for model, _, _ in _FIELDS if model not in _MODELS]  # outside the spec (training configs)
    for model in [*_MODELS, *dict.fromkeys(others)]:  # leaves first, so every parent embeds the rebuilt children
        model.model_rebuild(force=True)
    return cls


def component(slot: str) -> Callable[[type], type]:
    """Class decorator for plugins: ``@component("feature_map")`` registers the IR class in ``slot``."""
    return lambda cls: register(slot, cls)


def allow_plugins(names: Any) -> None:
    """The user's consent: let specs name these plugin modules (``attnspec --plugin MODULE``).

    A spec, sweep or build directory is data someone else may have written, so its ``plugins:``
    list is a request, not a command: :func:`import_plugins` imports only modules allowed here, in
    ``$ATTNSPEC_PLUGINS``, or declared by an installed package's entry point, and only from the file
    that name resolves to through the places *you* put on the path (:func:`locate_plugin`). The names
    are also written to ``$ATTNSPEC_PLUGINS`` so attnspec's child processes (compile check, sweep
    workers, torchrun ranks) allow the same.

    Raises:
        SpecError: a name is not a Python module name.
    """
    for name in names or ():
        if not isinstance(name, str) or len(name) > 200 or not _MODULE_NAME.fullmatch(name):
            raise SpecError(Problem(f"{shorten(name)} is not a Python module name (such as `my_lab.components`)",
                                    path="--plugin"))
        _allowed.add(name)
    if _allowed:
        os.environ[PLUGIN_ENV] = ",".join(sorted(_allowed | _from_environment()))


def _from_environment() -> set[str]:
    return {name.strip() for name in os.environ.get(PLUGIN_ENV, "").split(",") if name.strip()}


def is_allowed(name: str) -> bool:
    """Whether importing the plugin ``name`` is the user's choice (or runs nothing: already imported)."""
    return name in sys.modules or name in _allowed or name in _from_environment()


class PluginRefused(Exception):
    """A consented plugin name that resolves to no file attnspec may import (the message says why)."""


def _places_of_chance() -> set[str]:
    """The ``sys.path`` entries that depend on where attnspec happens to run, not on the user's choice:
    the working directory Python puts first (``python -m``, ``-c``; not under ``-P``), and the empty and
    relative ``PYTHONPATH`` entries (Python turns them into absolute paths under the working directory
    at start-up, so they cannot be told apart in ``sys.path`` itself). A received folder holding a file
    of a consented name must not be imported because the user ran attnspec inside it."""
    cwd = os.getcwd()
    chance = {"", "."}
    if sys.path and not sys.flags.safe_path and os.path.realpath(sys.path[0] or ".") == os.path.realpath(cwd):
        chance.add(sys.path[0])
    for entry in os.environ.get("PYTHONPATH", "").split(os.pathsep):
        if not os.path.isabs(entry):
            chance.add(os.path.normpath(os.path.join(cwd, entry)))
    return chance


def _trusted_path() -> list[str]:
    chance = _places_of_chance()
    return [entry for entry in sys.path if entry not in chance and os.path.isabs(entry)]


def locate_plugin(name: str) -> Path:
    """The file the plugin module ``name`` would be imported from, found without running anything
    (no parent package's ``__init__`` is executed): through ``sys.path`` less the places of chance
    (:func:`_places_of_chance`).

    Raises:
        PluginRefused: the name resolves only through the working directory or a relative or empty
            ``PYTHONPATH`` entry, or nowhere, or to something that is not a Python source file.
    """
    def find(path: list[str]):
        search: list[str] | None = path
        found = None
        for part in name.split("."):
            found = importlib.machinery.PathFinder.find_spec(part, search)
            if found is None:
                return None
            search = list(found.submodule_search_locations or [])
        return found

    found = find(_trusted_path())
    if found is None:
        anywhere = find([os.path.abspath(entry or ".") for entry in sys.path])
        if anywhere is not None:
            raise PluginRefused(f"{name!r} is found only at {anywhere.origin}, through the working directory or a "
                                "relative or empty PYTHONPATH entry; attnspec imports a plugin only from a place you "
                                "chose, never from where it happens to run (a received folder may hold a file of "
                                "that name). Put the plugin's folder on PYTHONPATH as an absolute path (export "
                                "PYTHONPATH=$PWD/examples/plugins) or install it")
        raise PluginRefused(f"cannot import plugin {name!r}: no such module; is it installed, or on PYTHONPATH (as an "
                            "absolute path)?")
    origin = found.origin
    if not origin or not origin.endswith(".py") or not os.path.isfile(origin):
        raise PluginRefused(f"plugin {name!r} resolves to {shorten(origin)}, not a Python source file; attnspec "
                            "imports plugins from .py files only")
    return Path(origin).resolve()


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _approved() -> dict[str, list[str]]:
    """name -> [file, sha256] the parent attnspec process imported (children import the same file only)."""
    try:
        value = json.loads(os.environ.get(PLUGIN_FILES_ENV, "{}"))
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def _import_plugin(name: str) -> None:
    """Import the consented plugin ``name`` from the file :func:`locate_plugin` finds, and record that
    file and its sha256 for child processes, which refuse any other file or content."""
    origin = locate_plugin(name)
    digest = _sha256(origin)
    approved = _approved()
    if name in approved and approved[name] != [str(origin), digest]:
        raise PluginRefused(f"plugin {name!r} is now {origin} (sha256 {digest[:12]}...), not the file attnspec's "
                            f"parent process approved ({shorten(approved[name][0], 120)}); refusing to import "
                            "another file or a changed one")
    saved = sys.path[:]
    sys.path[:] = _trusted_path()  # the import system looks where locate_plugin looked, nowhere else
    try:
        module = importlib.import_module(name)
    finally:
        sys.path[:] = saved
    loaded = getattr(module, "__file__", None)
    if loaded is None or Path(loaded).resolve() != origin:
        raise PluginRefused(f"plugin {name!r} was imported from {shorten(loaded, 120)}, not {origin}")
    os.environ[PLUGIN_FILES_ENV] = json.dumps({**approved, name: [str(origin), digest]})


def import_plugins(names: Any, where: Callable[[tuple], Any]) -> None:
    """Import the modules a spec's ``plugins:`` lists, so their components are registered; only those
    the user allowed (:func:`allow_plugins`), each from the file its name resolves to through the
    places the user chose (:func:`locate_plugin`): a module the user did not name, or one found only
    through the working directory, is never imported.

    ``where(path)`` gives the source position of ``plugins[i]`` for error messages. Raises a
    located SpecError for anything but a list of allowed, importable module names.
    """
    if names is None:
        return
    if not isinstance(names, list) or len(names) > 64:
        raise _plugin_error("`plugins` must be a list of at most 64 module names, e.g. [my_components]", (), where)
    for index, name in enumerate(names):
        if not isinstance(name, str) or len(name) > 200 or not _MODULE_NAME.fullmatch(name):
            raise _plugin_error(f"{shorten(name)} is not a Python module name (such as `my_lab.components`)",
                                (index,), where)
        if not is_allowed(name):
            raise _plugin_error(f"this spec asks to import the plugin module {name!r}, which you have not allowed: "
                                "attnspec imports only plugins you name, since a module runs code when imported. If "
                                f"you trust it, run `attnspec --plugin {name} ...`, set {PLUGIN_ENV}={name}, or install "
                                f"it with an entry point in the group {ENTRY_POINT_GROUP!r}", (index,), where)
        if name in sys.modules:
            continue  # imported already (by the user's code, an entry point or an earlier spec): nothing runs
        try:
            _import_plugin(name)
        except PluginRefused as error:
            raise _plugin_error(str(error), (index,), where) from None
        except SpecError as error:  # a plugin registering a bad component: located at the plugin
            raise _plugin_error(f"plugin {name!r} failed: {error.problems[0].message}", (index,), where) from None
        except Exception as error:  # noqa: BLE001 - any failure of the user's module is theirs to fix
            raise _plugin_error(f"cannot import plugin {name!r}: {type(error).__name__}: {shorten(str(error), 200)}; "
                                "is it installed, or on PYTHONPATH?", (index,), where) from None


def load_entry_points() -> None:
    """Import every module registered under the ``attnspec.components`` entry-point group (once)."""
    global _entry_points_loaded
    if _entry_points_loaded:
        return
    _entry_points_loaded = True
    from importlib.metadata import entry_points

    for entry in entry_points(group=ENTRY_POINT_GROUP):
        _allowed.add(entry.module)  # installing a package is consent to its plugins
        try:
            entry.load()
        except Exception as error:  # noqa: BLE001 - a broken installed plugin must not break attnspec
            import warnings

            warnings.warn(f"attnspec: the installed plugin {entry.name!r} ({entry.value}) failed to load: "
                          f"{type(error).__name__}: {error}", RuntimeWarning, stacklevel=2)


_entry_points_loaded = False


def _plugin_error(message: str, index: tuple, where: Callable[[tuple], Any]) -> SpecError:
    position = where(("plugins", *index))
    return SpecError(Problem(message, path="plugins" + "".join(f"[{i}]" for i in index),
                             source=getattr(position, "source", None), line=getattr(position, "line", None),
                             column=getattr(position, "column", None)))


__all__ = ["SLOTS", "register", "component", "declare", "union", "kind_of", "import_plugins", "load_entry_points",
           "allow_plugins", "is_allowed", "locate_plugin", "PLUGIN_ENV",
           "ENTRY_POINT_GROUP"]
