"""The per-position parts of a block: norms over the model width and the channel mixer (MLP).

Each is registered for its IR kind; ``none`` kinds are the IR's ``is_identity`` fact, which the
block reads (a block without an MLP has no second norm either).
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnspec.nn.registry import build, register


@register("norm", "layernorm")
class LayerNorm(nn.LayerNorm):
    """LayerNorm over the last dimension, with weight and (unless ``bias: false``) bias, or neither
    (``affine: false``)."""

    def __init__(self, node, *, dim: int, **_):
        super().__init__(dim, eps=node.eps, elementwise_affine=node.affine, bias=node.bias)


@register("norm", "rmsnorm")
class RMSNorm(nn.Module):
    """``x / rms(x) * weight``; half-precision ``x`` is normalised in float32 and rounded back before the
    weight multiplies it (as transformers' Llama norm does), and the output keeps ``x``'s dtype (a weight
    kept in float32 by ``keep_float32`` included)."""

    def __init__(self, node, *, dim: int, **_):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim)) if node.affine else None  # `affine: false`: none (nanochat)
        self.eps = node.eps

    def forward(self, x: Tensor) -> Tensor:
        if x.dtype not in (torch.bfloat16, torch.float16):
            normed = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
            return normed if self.weight is None else normed * self.weight
        wide = x.float()
        normed = (wide * torch.rsqrt(wide.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype)
        return normed if self.weight is None else (self.weight * normed).to(x.dtype)


@register("norm", "none")
class NoNorm(nn.Identity):
    def __init__(self, node, **_):
        super().__init__()


_ACTIVATIONS = {"gelu": F.gelu, "gelu_10": lambda x: torch.clamp(F.gelu(x), -10.0, 10.0),
                "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"), "mish": F.mish,
                "quick_gelu": lambda x: x * torch.sigmoid(1.702 * x), "relu": F.relu,
                "relu2": lambda x: F.relu(x).square(), "relu6": F.relu6, "silu": F.silu, "tanh": torch.tanh}


class XIELU(nn.Module):
    """xIELU (Huang 2024, Apertus's MLPs): x > 0: a_p x² + β x; else a_n (expm1(min(x, ε)) - x) + β x, with
    a_p = softplus(α_p) and a_n = β + softplus(α_n) from the learnt ``alpha_p``, ``alpha_n`` (1,), and β, ε
    buffers the weights carry (0.5 and -1e-6: a release's own values load with it). Elementwise, any shape."""

    def __init__(self, alpha_p: float = 0.8, alpha_n: float = 0.8, beta: float = 0.5, eps: float = -1e-6):
        super().__init__()
        inverse_softplus = lambda y: math.log(math.expm1(y))  # noqa: E731
        self.alpha_p = nn.Parameter(torch.tensor([inverse_softplus(alpha_p)]))
        self.alpha_n = nn.Parameter(torch.tensor([inverse_softplus(alpha_n - beta)]))
        self.register_buffer("beta", torch.tensor(beta))
        self.register_buffer("eps", torch.tensor(eps))

    def forward(self, x: Tensor) -> Tensor:
        a_p, a_n = F.softplus(self.alpha_p), self.beta + F.softplus(self.alpha_n)
        return torch.where(x > 0, a_p * x * x + self.beta * x,
                           (torch.expm1(torch.minimum(x, self.eps)) - x) * a_n + self.beta * x)


@register("mlp", "mlp", "glu")
class Mlp(nn.Module):
    """``W2 act(W1 x)``, or with a gate (``glu``) ``W2 (act(W1 x) * W3 x)``, clamped where ``glu_limit`` is set
    (``W2 (act(min(W1 x, limit)) * (clamp(W3 x, -limit, limit) + 1))``), the hidden normalised before W2 where
    ``inner_norm`` is set; hidden width ``hidden`` or expansion * d_model."""

    aux_loss: Tensor | None = None  # a dense MLP has no load-balancing loss (MoeMlp's protocol)

    def __init__(self, node, *, d_model: int, **_):
        super().__init__()
        hidden = node.hidden or node.expansion * d_model
        self.activation = XIELU() if node.activation == "xielu" else _ACTIVATIONS[node.activation]
        self.up = nn.Linear(d_model, hidden, bias=node.bias)
        self.gate = nn.Linear(d_model, hidden, bias=node.bias) if node.gated else None
        self.down = nn.Linear(hidden, d_model, bias=node.bias)
        self.glu_limit = node.glu_limit
        # a norm of the hidden width before `down` (BitNet's); experts' (plain namespaces) is None
        inner = node.inner_norm
        self.inner_norm = None if inner is None or inner.is_identity else build("norm", inner, dim=hidden)

    def projections(self) -> list[nn.Linear]:
        """Its linear maps (``down`` writes into the residual stream)."""
        return [p for p in (self.up, self.gate, self.down) if p is not None]

    def residual_writers(self) -> list[Tensor]:
        """The weights that write into the residual stream (``init.residual_scaling`` scales them)."""
        return [self.down.weight]

    def active_parameters(self) -> int:
        """Parameters one token's output depends on (all of a dense MLP's)."""
        return sum(p.numel() for p in self.parameters())

    def forward(self, x: Tensor) -> Tensor:
        h = self.up(x)
        if self.glu_limit is None:
            h = self.activation(h)
            h = h if self.gate is None else h * self.gate(x)
        else:
            h = self.activation(h.clamp(max=self.glu_limit)) * (self.gate(x).clamp(-self.glu_limit, self.glu_limit) + 1)
        return self.down(h if self.inner_norm is None else self.inner_norm(h))


@register("mlp", "moe")
class MoeMlp(nn.Module):
    """A mixture of experts (:class:`attnspec.spec.channel.MoeMlp`) over x (..., d_model) -> (..., d_model).

    Weights: ``router.weight`` (E + Z, d), Z the zero-computation experts (and ``router.bias`` (E + Z,) with
    ``router_bias``); ``score_bias`` (E + Z,), a
    buffer (it chooses, it is not trained by the loss); ``routed.{e}`` the experts, each an :class:`Mlp` (one
    module per expert, as released checkpoints store them); ``shared`` (a GLU MLP) and ``shared_gate`` (1, d);
    ``output_bias`` (d,) with ``output_bias``.

    Eager calls send each expert only the tokens routed to it; compiled and exported graphs compute
    every expert on every token and weight the unchosen by 0 (no shape depends on the routing), the
    same function in another order of sums. The router's scores and the choice run in float32 at
    least. The last call's (eager or compiled, not exported) load-balancing loss is ``aux_loss``:
    Switch Transformer's, as transformers' ``load_balancing_loss_func`` computes it for one layer,
    E sum_e f_e P_e with f_e the share of tokens routed to e and P_e the mean score of e (1 * top_k when
    balanced); the tokens each expert received are ``expert_counts``.
    """

    def __init__(self, node, *, d_model: int, **_):
        super().__init__()
        self.experts, self.top_k = node.experts, node.top_k
        # the router's choices: the experts, then the zero-computation ones (LongCat's: w x, no weights)
        self.choices = node.experts + node.zero_experts
        self.softmax, self.normalize, self.routed_scale = node.scoring == "softmax", node.normalize, node.routed_scale
        self.groups, self.top_groups = node.groups, node.top_groups or node.groups
        self.group_max = node.group_score == "max"  # DeepSeek-V2's groups ranked by their best score
        self.router = nn.Linear(d_model, self.choices, bias=node.router_bias)
        self.register_buffer("score_bias", torch.zeros(self.choices) if node.score_bias else None)
        self.bias_on_logits = node.score_bias_on_logits  # Kolibri: the bias added to the logits to choose
        self.router_softcap = node.router_softcap
        self.weight_inputs = node.weight_inputs  # Llama 4: E(w x) rather than w E(x)
        expert = SimpleNamespace(hidden=node.hidden, expansion=1, activation=node.activation, bias=node.expert_bias,
                                 gated=node.gated, glu_limit=node.glu_limit, inner_norm=None)
        self.routed = nn.ModuleList(Mlp(expert, d_model=d_model) for _ in range(node.experts))
        shared = SimpleNamespace(hidden=node.shared_hidden or node.shared * node.hidden, expansion=1,
                                 activation=node.activation, bias=False, gated=node.gated, glu_limit=node.glu_limit,
                                 inner_norm=None)
        self.shared = Mlp(shared, d_model=d_model) if node.shared else None
        self.shared_gate = nn.Linear(d_model, 1, bias=False) if node.shared and node.shared_gate else None
        self.output_bias = nn.Parameter(torch.zeros(d_model)) if node.output_bias else None  # JetMoE's
        self.aux_loss: Tensor | None = None
        self.expert_counts: Tensor | None = None

    def projections(self) -> list[nn.Linear]:
        experts = [p for expert in self.routed for p in expert.projections()]
        return [self.router, *experts, *(self.shared.projections() if self.shared is not None else []),
                *([self.shared_gate] if self.shared_gate is not None else [])]

    def residual_writers(self) -> list[Tensor]:
        writers = [w for expert in self.routed for w in expert.residual_writers()]
        return writers + (self.shared.residual_writers() if self.shared is not None else [])

    def active_parameters(self) -> int:
        """Parameters one token's output depends on: the router, top_k routed experts and the shared ones."""
        routed = sum(p.numel() for p in self.routed[0].parameters())
        return sum(p.numel() for p in self.parameters()) - (self.experts - self.top_k) * routed

    def route(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """x (T, d) -> the router's scores (T, E), the chosen experts (T, k) and their weights (T, k),
        in float32 or wider. With groups, only the ``top_groups`` best groups' experts are chosen from."""
        logits = self.router(x)
        logits = logits.float() if logits.dtype in (torch.bfloat16, torch.float16) else logits
        if self.router_softcap is not None:  # Laguna's: cap * tanh(logits / cap)
            logits = self.router_softcap * torch.tanh(logits / self.router_softcap)
        scores = logits.softmax(-1) if self.softmax else logits.sigmoid()
        choosing = scores if self.score_bias is None else \
            (logits if self.bias_on_logits else scores) + self.score_bias.to(scores.dtype)
        if self.top_groups < self.groups:  # choose within the groups ranked highest (two best scores' sum, or best)
            grouped = choosing.view(-1, self.groups, self.experts // self.groups)
            ranks = grouped.amax(-1) if self.group_max else grouped.topk(2, dim=-1).values.sum(-1)
            kept = ranks.topk(self.top_groups, dim=-1).indices
            mask = torch.zeros_like(grouped[..., 0], dtype=torch.bool).scatter(1, kept, True)
            choosing = grouped.masked_fill(~mask.unsqueeze(-1), float("-inf")).view_as(choosing)
        chosen = choosing.topk(self.top_k, dim=-1).indices
        weights = scores.gather(-1, chosen)
        if self.normalize:
            weights = weights / weights.sum(-1, keepdim=True)
        return scores, chosen, weights * self.routed_scale

    def forward(self, x: Tensor) -> Tensor:
        flat = x.reshape(-1, x.shape[-1])
        scores, chosen, weights = self.route(flat)
        weights = weights.to(flat.dtype)
        traced = torch.compiler.is_compiling() or torch.compiler.is_exporting()
        out = (self.every_expert if traced else self.routed_experts)(flat, chosen, weights)
        if not torch.compiler.is_exporting():  # an exported program keeps no side outputs
            self._record(scores, chosen)
        if self.shared is not None:
            shared = self.shared(flat)
            out = out + (torch.sigmoid(self.shared_gate(flat)) * shared if self.shared_gate is not None else shared)
        if self.output_bias is not None:
            out = out + self.output_bias.to(out.dtype)
        return out.reshape(x.shape)

    def routed_experts(self, x: Tensor, chosen: Tensor, weights: Tensor) -> Tensor:
        """The weighted sum of each token's chosen experts, each expert run on its tokens only:
        x (T, d), chosen and weights (T, k) -> (T, d)."""
        out = torch.zeros_like(x)
        for index in chosen.unique().tolist():
            token, slot = torch.where(chosen == index)
            weight = weights[token, slot, None]
            if index >= self.experts:  # a zero-computation expert: the input, weighted
                out.index_add_(0, token, x[token] * weight)
                continue
            expert = self.routed[index]
            out.index_add_(0, token, expert(x[token] * weight) if self.weight_inputs else expert(x[token]) * weight)
        return out

    def every_expert(self, x: Tensor, chosen: Tensor, weights: Tensor) -> Tensor:
        """The same sum with every expert run on every token, the unchosen weighted by 0: no shape
        depends on the routing (what compiled and exported graphs run)."""
        dense = torch.zeros(x.shape[0], self.choices, dtype=x.dtype, device=x.device).scatter(1, chosen, weights)
        out = dense[:, self.experts:].sum(-1, keepdim=True) * x  # the zero-computation experts' w x (0 without)
        if self.weight_inputs:  # E(w x) of the chosen: an unchosen expert's E(0) is masked, not assumed 0
            picked = torch.zeros_like(dense).scatter(1, chosen, 1.0)
            for index, expert in enumerate(self.routed):
                out = out + picked[:, index:index + 1] * expert(dense[:, index:index + 1] * x)
            return out
        for index, expert in enumerate(self.routed):
            out = out + dense[:, index:index + 1] * expert(x)
        return out

    def _record(self, scores: Tensor, chosen: Tensor) -> None:
        """The load-balancing loss of this call (differentiable in the scores) and the tokens per expert."""
        counts = torch.zeros(self.choices, dtype=scores.dtype, device=scores.device)
        counts.scatter_add_(0, chosen.reshape(-1), torch.ones_like(chosen.reshape(-1), dtype=scores.dtype))
        share = counts / max(chosen.shape[0], 1)  # f_e: the share of tokens routed to e (they sum to top_k)
        self.aux_loss = self.choices * (share.detach() * scores.mean(0)).sum()
        self.expert_counts = counts.detach()

