"""transformers' ``arcee`` model type (Arcee AFM) as attnspec specs, and back
(what a family states: :mod:`attnspec.interop.architecture`)."""

from __future__ import annotations

from attnspec.interop.architecture import Link, Row, expanded_blocks
from attnspec.interop.architecture import mlp_links as plain_mlp_links
from attnspec.interop.config import Config, NotExpressible
from attnspec.interop.families.llama import LlamaFamily


class Arcee(LlamaFamily):
    """Arcee: Llama's attention and norms with a plain MLP, down(act(up x)) of ``hidden_act`` (squared ReLU),
    biased with ``mlp_bias``."""

    ALIASES: dict[str, str] = {}
    model_types = ("arcee",)
    causal_lm = {"arcee": "ArceeForCausalLM"}
    export_order = None

    rows = (
        Row(("arcee",),
            "llama's attention with a plain MLP (`mlp: {kind: mlp}`, down(act(up x)), `hidden_act` squared ReLU, "
            "biases with `mlp_bias`)",
            "as llama"),
    )

    def spec(self, config: Config, model_type: str) -> dict:
        blocks, eps = self.layer_blocks(config, "llama")
        mlp = {**blocks[0]["mlp"], "kind": "mlp", "activation": config.activation(default="relu2")}
        return self.assembled(config, [{**block, "mlp": mlp} for block in blocks], eps)

    def config(self, spec, model_type: str) -> dict:
        if any(block.mlp.kind != "mlp" for block in expanded_blocks(spec)):
            raise NotExpressible("arcee's MLP is plain (no gate)")
        return super().config(spec, "llama")

    def mlp_links(self, mlp, theirs: str, ours: str) -> list[Link]:
        return plain_mlp_links(theirs, ours, mlp.bias)


ARCHITECTURES = (Arcee(),)
