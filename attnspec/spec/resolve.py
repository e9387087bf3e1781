"""Resolution: fill every derived default so the resolved spec states exactly what is built.

The resolved spec (written as ``spec.yaml`` in a build directory) validates to the same
IR and rebuilds the same model.
"""

from __future__ import annotations

from attnspec.spec.ir import (
    Block,
    Group,
    ScatterbrainMixer,
    Spec,
)



def resolve(spec: Spec) -> Spec:
    """Return ``spec`` with d_qk, d_v, scale, AOGLU ranks and Scatterbrain sizes filled in.

    Assumes :func:`attnspec.spec.rules.check_rules` found nothing.
    """
    return spec.model_copy(update={"layers": [_resolve_layer(spec, item) for item in spec.layers]})


def _resolve_layer(spec: Spec, item: Block | Group) -> Block | Group:
    if isinstance(item, Group):
        return item.model_copy(update={"layers": [_resolve_layer(spec, sub) for sub in item.layers]})
    mixer = item.mixer
    d_qk = mixer.d_qk or spec.d_model // mixer.heads
    d_v = mixer.d_v or spec.d_model // mixer.heads
    fmap = getattr(mixer, "feature_map", None)
    update = {"d_qk": d_qk, "d_v": d_v, "scale": mixer.scale or (d_qk ** -0.5 if mixer.softmax_temperature else 1.0)}
    if fmap is not None:
        update["feature_map"] = fmap.resolved(d_qk)
    if isinstance(mixer, ScatterbrainMixer):
        update.update(_scatterbrain_sizes(spec, mixer))
    return item.model_copy(update={"mixer": mixer.model_copy(update=update)})


def _scatterbrain_sizes(spec: Spec, mixer: ScatterbrainMixer) -> dict:
    sizes = mixer.sizes_for_budget(spec.max_len) if mixer.budget is not None else None
    lowrank, sparse = mixer.lowrank, mixer.sparse
    if lowrank.size_field and getattr(lowrank, lowrank.size_field) is None:
        size = sizes["lowrank"] if sizes else lowrank.default_size
        lowrank = lowrank.model_copy(update={lowrank.size_field: size})
    if getattr(sparse, sparse.size_field) is None:
        size = sparse.size_for_budget(sizes["sparse"]) if sizes else sparse.default_size
        sparse = sparse.model_copy(update={sparse.size_field: size})
    return {"lowrank": lowrank, "sparse": sparse}
