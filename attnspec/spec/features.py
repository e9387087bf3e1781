"""Feature maps phi (a slot): the base's facts and every built-in kind."""

from __future__ import annotations

from typing import ClassVar, Iterator, Literal

from attnspec.spec import limits
from attnspec.spec.components import declare
from attnspec.spec.nodes import Component, Count, NonNegativeFloat, Seed


class FeatureMapComponent(Component):
    """A feature map phi applied per head to queries and keys: width n -> ``width(n)``."""

    non_negative: ClassVar[bool] = True
    """phi >= 0, so the linear-attention normaliser q~.z stays positive."""
    finite: ClassVar[bool] = True
    """phi has a finite feature expansion (False: the softmax kernel, computed quadratically)."""
    consumes_scale: ClassVar[bool] = False
    """The feature map applies the mixer's `scale` (the softmax temperature) itself."""
    unit_norm: ClassVar[bool] = False
    """|phi(x)| <= 1 per head, = 1 up to a 1e-6 smoothing (what the delta rule needs for I - beta k kᵀ,
    beta <= 2, to stay a contraction)."""

    def width(self, n: int) -> int:
        """Feature width for query/key width ``n``."""
        return n

    def resolved(self, d_qk: int) -> "FeatureMapComponent":
        """This component with its derived defaults filled in (``d_qk``: the per-head width)."""
        return self

    def problems(self, d_qk: int | None) -> Iterator[tuple[tuple, str]]:
        """Rule violations of this component alone, as (path below it, message)."""
        return iter(())






class IdentityFeatures(FeatureMapComponent):
    """phi(x) = x. Signed, so only valid without normalisation (GateLoop uses it)."""

    kind: Literal["identity"]
    non_negative: ClassVar[bool] = False


class Elu1Features(FeatureMapComponent):
    """phi(x) = elu(x) + 1 (Katharopoulos et al.), strictly positive."""

    kind: Literal["elu1"]


class ReluFeatures(FeatureMapComponent):
    """phi(x) = max(x, 0) (cosFormer), non-negative; rows may be all zero (eps clamp)."""

    kind: Literal["relu"]


class SoftplusFeatures(FeatureMapComponent):
    """phi(x) = log(1 + e^x), strictly positive."""

    kind: Literal["softplus"]


class SiluFeatures(FeatureMapComponent):
    """phi(x) = x sigmoid(x) (SiLU/swish), signed; DeltaNet's q/k activation before the L2 norm."""

    kind: Literal["silu"]
    non_negative: ClassVar[bool] = False


class L2NormFeatures(FeatureMapComponent):
    """phi(x) = act(x) / |act(x)|, per head (DeltaNet, Gated DeltaNet, KDA: q and k of unit norm), with
    act the identity or SiLU."""

    kind: Literal["l2norm"]
    activation: Literal["none", "silu"] = "none"
    """Applied before the normalisation (FLA's `qk_activation`; a short convolution's SiLU comes before it)."""
    non_negative: ClassVar[bool] = False
    unit_norm: ClassVar[bool] = True


class ExpFeatures(FeatureMapComponent):
    """The softmax kernel exp(q.k). It has no finite feature expansion: quadratic mode only."""

    kind: Literal["exp"]
    finite: ClassVar[bool] = False
    consumes_scale: ClassVar[bool] = True


class PerformerFeatures(FeatureMapComponent):
    """Performer positive random features phi(x) = exp(Wx - |x|^2/2)/sqrt(m), unbiased for exp(q.k)."""

    kind: Literal["performer"]
    num_features: Count(limits.MAX_FEATURES) = 64
    """Number of random features m (the feature width)."""
    projection: Literal["orthogonal", "iid"] = "orthogonal"
    """Rows of W drawn i.i.d. N(0, 1), or in orthogonal blocks with chi-distributed norms."""
    redraw: Literal["never", "interval"] = "never"
    """`never`: the projection is fixed by `seed`. `interval`: the training loop redraws it every
    `redraw_interval` steps through `attnspec.nn.redraw_random_features(model, step)`."""
    redraw_interval: Count(limits.MAX_STEPS) | None = None
    """Steps between redraws; required with `redraw: interval`, forbidden otherwise."""
    seed: Seed = 0
    """Seed of the projection (the model seed is added), so a rebuilt model computes the same function."""
    consumes_scale: ClassVar[bool] = True

    def width(self, n: int) -> int:
        return self.num_features

    def problems(self, d_qk: int | None) -> Iterator[tuple[tuple, str]]:
        if self.redraw == "interval" and self.redraw_interval is None:
            yield ("redraw_interval",), "`redraw: interval` needs `redraw_interval: N` (steps between redraws)"
        if self.redraw == "never" and self.redraw_interval is not None:
            yield ("redraw_interval",), "`redraw_interval` only applies with `redraw: interval`; remove it"


class _TrainableKernel(FeatureMapComponent):
    stack: Count(limits.MAX_STACK) = 1
    """Number of units applied in sequence; only the last one is made positive (Softplus)."""
    share_across_heads: bool = True
    """One set of kernel weights shared by all heads (true) or separate weights per head (false)."""

    # the facts the trainable kernel's module is built from (attnspec/nn/features.py)
    def is_orthogonal(self) -> bool:
        """W_f starts orthogonal and is regularised towards it."""
        return False

    def regulariser_weight(self) -> float:
        """lambda of the orthogonality regulariser (0: none)."""
        return 0.0

    def is_gated(self) -> bool:
        """A sigmoid gate multiplies each unit."""
        return True

    def gate_rank(self) -> int | None:
        """The rank of a low-rank gate W_g = U V (None: a full n x n gate)."""
        return None


class _OrthogonalKernel(_TrainableKernel):
    ortho_weight: NonNegativeFloat = 1e-3
    """Weight lambda of the regulariser lambda*|W^T W - I|_F^2 on the orthogonal matrices, exposed
    to the training loop as `model.regularization_loss()`."""

    def is_orthogonal(self) -> bool:
        return True

    def regulariser_weight(self) -> float:
        return self.ortho_weight if self.is_orthogonal() else 0.0


class SoftplusLinearFeatures(_OrthogonalKernel):
    """Trainable FFN kernel phi(X) = Softplus(X W), W n x n (Yorsh & Kovalenko)."""

    kind: Literal["softplus_linear"]
    orthogonal: bool = False
    """Initialise W orthogonal and add the orthogonality regulariser (the 'Orth. linear kernel')."""

    def is_orthogonal(self) -> bool:
        return self.orthogonal

    def is_gated(self) -> bool:
        return False


class GluFeatures(_TrainableKernel):
    """GLU kernel: (X W_f) * sigmoid(X W_g); the last unit uses Softplus(X W_f) so phi > 0."""

    kind: Literal["glu"]


class OgluFeatures(_OrthogonalKernel):
    """GLU kernel with W_f kept orthogonal (init + regulariser)."""

    kind: Literal["oglu"]


class AogluFeatures(_OrthogonalKernel):
    """OGLU with a low-rank gate W_g = U V (rank r < n/2); 1.5 n^2 weights per unit at r = n/4."""

    kind: Literal["aoglu"]
    rank: Count(limits.MAX_HEAD_WIDTH) | None = None
    """Rank r of the gate; defaults to n/4 (n = d_qk). Must be below n/2."""

    def resolved(self, d_qk: int) -> "AogluFeatures":
        return self if self.rank is not None else self.model_copy(update={"rank": max(1, d_qk // 4)})

    def gate_rank(self) -> int | None:
        return self.rank

    def problems(self, d_qk: int | None) -> Iterator[tuple[tuple, str]]:
        if self.rank is not None and d_qk is not None and 2 * self.rank >= d_qk:
            yield ("rank",), (f"the AOGLU gate rank must be below n/2 = {d_qk / 2:g} (n = d_qk = {d_qk}); the paper "
                              f"uses n/4 = {max(d_qk // 4, 1)}")
        if self.rank is None and d_qk is not None and d_qk < 4:
            yield (), f"AOGLU needs d_qk >= 4 for a gate of rank n/4 (d_qk = {d_qk}); use glu or oglu"


FeatureMap = declare(
    "feature_map",
    IdentityFeatures,
    Elu1Features,
    ReluFeatures,
    SoftplusFeatures,
    SiluFeatures,
    L2NormFeatures,
    ExpFeatures,
    PerformerFeatures,
    SoftplusLinearFeatures,
    GluFeatures,
    OgluFeatures,
    AogluFeatures,
    base=FeatureMapComponent,
)


__all__ = ["FeatureMapComponent", "IdentityFeatures", "Elu1Features", "ReluFeatures", "SoftplusFeatures",
           "SiluFeatures", "L2NormFeatures", "ExpFeatures", "PerformerFeatures", "SoftplusLinearFeatures",
           "GluFeatures", "OgluFeatures", "AogluFeatures", "FeatureMap"]
