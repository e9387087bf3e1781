"""The IR's building blocks: strict pydantic nodes, bounded counts, and the base of every component."""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Union

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

from attnspec.spec import limits
from attnspec.spec.components import kind_shorthand


NonNegativeFloat = Annotated[float, Field(ge=0)]
PositiveFloat = Annotated[float, Field(gt=0)]


def Count(limit: int) -> Any:
    """A positive integer at most ``limit`` (see :mod:`attnspec.spec.limits`)."""
    return Annotated[int, Field(gt=0, le=limit)]


Seed = Annotated[int, Field(ge=0, le=limits.MAX_SEED)]
ShareName = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")]
"""A name blocks refer to one another by (a shared block's, lent keys and values')."""


class Node(BaseModel):
    """Base of every IR node: strict types, unknown keys rejected, docstrings become descriptions."""

    model_config = ConfigDict(
        extra="forbid",
        strict=True,
        allow_inf_nan=False,
        str_max_length=limits.MAX_STRING_CHARS,
        use_attribute_docstrings=True,
        validate_default=True,
    )


def fixed_union(*members: type[Node]) -> Any:
    """A fixed union of ``kind``-tagged node types with the bare-string shorthand (for the model's own
    parts, such as heads; the slots plugins can extend are declared in :mod:`attnspec.spec.components`)."""
    union = Annotated[Union[members], Field(discriminator="kind")]  # type: ignore[valid-type]
    return Annotated[union, BeforeValidator(kind_shorthand)]


# Each slot's base class (in the slot's module: features, transitions, ...) states the facts every
# component of the slot has, with defaults; a kind overrides what differs. Rules, resolve, plan, lower
# and nn read these facts, never a kind name.
class Component(Node):
    """Base of every kind-tagged part of a spec that fills a slot (:mod:`attnspec.spec.components`)."""

    slot: ClassVar[str]
    """The slot this component fills (set when it is declared or registered)."""
    implementation: ClassVar[str | None] = None
    """``"module:Class"`` of the nn implementation for plugins (built-ins register in attnspec.nn)."""
    is_identity: ClassVar[bool] = False
    """The component does nothing (``none`` kinds): the model leaves it out."""
    no_weight_decay: ClassVar[bool] = False
    """The trainer's optimiser applies no weight decay to this component's parameters (norms,
    positions, transitions). Biases and the token embedding never take weight decay."""
    lr_multiplier: ClassVar[float] = 1.0
    """The trainer scales the learning rate of this component's parameters by this factor."""


__all__ = ["NonNegativeFloat", "PositiveFloat", "Count", "Seed", "Node", "fixed_union", "Component"]
