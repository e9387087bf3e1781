"""Released models in and out (DESIGN sec. 3, layer 6): transformers checkpoints as specs, specs as
transformers directories.

* :mod:`~attnspec.interop.config` reads a ``config.json``; :mod:`~attnspec.interop.architecture` is
  what a family states (its spec, its config, its weights' :class:`~attnspec.interop.architecture.Link`
  rows); :mod:`~attnspec.interop.families` holds one module per family and
  :mod:`~attnspec.interop.registry` the one list of them.
* :mod:`~attnspec.interop.checkpoint` reads checkpoints lazily; :mod:`~attnspec.interop.convert` is
  ``import-hf`` and ``export-hf``; :mod:`~attnspec.interop.check` compares an import with transformers.

Nothing here needs transformers (the check uses it where installed). The ``attnspec`` model type that
transformers' Auto classes load is :mod:`attnspec.hf`'s: importing that package registers it, which
costs transformers' modelling stack (~200 MB, seconds), so conversion lives apart from it.
"""
