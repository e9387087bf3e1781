"""Position re-weightings rho(t) of the features (a slot): cosFormer's cos, or none."""

from __future__ import annotations

from typing import ClassVar, Iterator, Literal

from attnspec.spec import limits
from attnspec.spec.components import declare
from attnspec.spec.nodes import Component, Count


class ReweightingComponent(Component):
    """A separable position re-weighting rho(t) of the features."""

    width_factor: ClassVar[int] = 1
    """How many times the feature width the re-weighted features have."""

    def problems(self, *, causal: bool, max_len: int) -> Iterator[tuple[tuple, str]]:
        return iter(())






class NoReweighting(ReweightingComponent):
    """No position re-weighting."""

    kind: Literal["none"]


class CosReweighting(ReweightingComponent):
    """cosFormer: weights cos(pi/2 (i-j)/M), split by Ptolemy's identity (feature width doubles)."""

    kind: Literal["cos"]
    M: Count(limits.MAX_SUPPORT) | None = None
    """Horizon M >= sequence length. Required (and >= max_len) for causal use so that every mode
    and the decoder use the same M; `null` means M = L per call (non-causal only)."""
    width_factor: ClassVar[int] = 2

    def problems(self, *, causal: bool, max_len: int) -> Iterator[tuple[tuple, str]]:
        if self.M is None and causal:
            yield ("M",), (f"causal cos re-weighting needs a fixed M so every mode and the decoder use the same "
                           f"weights; set `M: {max_len}` (>= max_len)")
        elif self.M is not None and self.M < max_len:
            yield ("M",), (f"M = {self.M} is below max_len = {max_len}: cos(pi/2 (i-j)/M) turns negative for "
                           f"|i-j| > M; set M >= {max_len}")


Reweighting = declare("reweighting", NoReweighting, CosReweighting, base=ReweightingComponent)


__all__ = ["ReweightingComponent", "NoReweighting", "CosReweighting", "Reweighting"]
