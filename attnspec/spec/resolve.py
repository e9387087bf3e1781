"""Resolution: fill every derived default so the resolved spec states exactly what is built.

The resolved spec (written as ``spec.yaml`` in a build directory) validates to the same
IR and rebuilds the same model.
"""

from __future__ import annotations

from attnspec.spec.ir import Block, Group, Spec
from attnspec.spec.rules import input_width


def resolve(spec: Spec) -> Spec:
    """Return ``spec`` with d_qk, d_v, scale, each mixer's parts (``resolved_parts``) and
    its position scheme (``resolved_position``: the model's, unless it names its own) resolved, and
    the LM head's logit scale.

    Assumes :func:`attnspec.spec.rules.check_rules` found nothing.
    """
    update = {"layers": [_resolve_layer(spec, item) for item in spec.layers],
              "shared": [shared.model_copy(update={"block": _resolve_layer(spec, shared.block, input_width(spec, shared))})
                         for shared in spec.shared]}
    if spec.head.kind == "lm" and spec.head.scale is None:
        update["head"] = spec.head.model_copy(update={"scale": spec.head.default_scale(spec.d_model, spec.version)})
    return spec.model_copy(update=update)


def _resolve_layer(spec: Spec, item: Block | Group, width: int | None = None) -> Block | Group:
    """A block (or every block of a group) resolved; its mixer reads inputs of ``width`` (d_model unless given)."""
    if isinstance(item, Group):
        return item.model_copy(update={"layers": [_resolve_layer(spec, sub) for sub in item.layers]})
    return item.model_copy(update={"mixer": _resolve_mixer(spec, item.mixer, width or spec.d_model)})


def _resolve_mixer(spec: Spec, mixer, width: int):
    update = dict(mixer.resolved_widths(width))
    d_qk = update.get("d_qk", mixer.d_qk)
    update["scale"] = mixer.scale or (d_qk ** -0.5 if mixer.softmax_temperature else 1.0)
    update.update(mixer.resolved_parts(d_qk=d_qk, max_len=spec.max_len))
    update["position"] = mixer.resolved_position(spec.position)
    update.update(mixer.resolved_sub_mixers(lambda sub: _resolve_mixer(spec, sub, width)))  # a parallel mixer's branches
    return mixer.model_copy(update=update)
