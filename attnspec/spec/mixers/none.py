"""No sequence mixer: a block that is its MLP alone (Nemotron-H's MLP and mixture-of-experts layers)."""

from __future__ import annotations

from typing import ClassVar, Iterator, Literal

from attnspec.spec.family import Cost
from attnspec.spec.mixers.base import MixerComponent


class NoMixer(MixerComponent):
    """No sequence mixer: the block computes x + mlp(norm(x)) alone, with no mixer sub-layer and no
    norm before it. Its one mode does nothing and its decoding state is empty."""

    kind: Literal["none"]
    is_identity: ClassVar[bool] = True

    def modes(self) -> tuple[str, ...]:
        return ("quadratic",)  # nothing to compute: one mode in name only, one that exports at any length

    def mode_costs(self, L: int) -> dict[str, Cost]:
        return {"quadratic": Cost(macs=0, bytes=0, state_bytes=0, sequential_steps=0)}

    @property
    def has_step(self) -> bool:
        return True

    def parts(self) -> list[tuple[str, str]]:
        return []

    def problems(self, *, max_len: int, d_qk: int | None) -> Iterator[tuple[tuple, str]]:
        yield from super().problems(max_len=max_len, d_qk=d_qk)
        resolved = {"kind", "scale", "position"}  # what resolution states for every mixer
        for name, field in type(self).model_fields.items():
            if name not in resolved and getattr(self, name) != field.get_default(call_default_factory=True):
                yield (name,), f"a block without a mixer (`mixer: none`) has no `{name}`: remove it"

    def resolved_widths(self, d_model: int) -> dict[str, int]:
        return {}

    def describe(self) -> str:
        return "none (the block is its MLP alone)"


__all__ = ["NoMixer"]
