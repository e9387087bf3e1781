"""The compiler (``attnspec.compiler``): plan, lower, compile, export, load, verify, run.

Public API: :func:`build_model` (spec -> eager, planned model), :func:`load_model` (build
directory -> model), :func:`build_directory` (the ``attnspec build`` job).
"""

from attnspec.compiler.lower import build_model, count_parameters
from attnspec.compiler.plan import plan_spec


def __getattr__(name):  # the build/load machinery imports safetensors and export: load it on use
    if name == "load_model":
        from attnspec.compiler.load import load_model

        return load_model
    if name == "build_directory":
        from attnspec.compiler.build import build_directory

        return build_directory
    raise AttributeError(name)


__all__ = ["build_model", "count_parameters", "plan_spec", "load_model", "build_directory"]
