"""The ``attnspec`` model type for transformers: any causal token spec as a ``PreTrainedModel``.

``AttnspecConfig`` carries the resolved spec and the planned modes; ``AttnspecForCausalLM`` wraps
attnspec's :class:`~attnspec.nn.model.Model` (the weights are its state dict under ``model.``).
``generate()`` works through attnspec's decoding state: the first call runs
:meth:`~attnspec.nn.model.Model.prefill` over the prompt, every later one
:meth:`~attnspec.nn.model.Model.step` per new token, with the state carried as the cache
(:class:`AttnspecCache`). Prompts are unpadded and of equal length, as attnspec's own decoding.

Imported by :mod:`attnspec.hf`, which registers both classes with the Auto classes.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor
from transformers import GenerationMixin, PreTrainedConfig, PreTrainedModel
from transformers.modeling_outputs import CausalLMOutputWithPast

from attnspec.errors import InteropError


class AttnspecConfig(PreTrainedConfig):
    """A resolved attnspec spec (``spec``, as data) and its planned full-sequence ``modes``."""

    model_type = "attnspec"
    spec: dict | None = None
    modes: list | None = None
    vocab_size: int | None = None
    max_position_embeddings: int | None = None
    use_cache: bool = True


class AttnspecCache:
    """attnspec's flat decoding state (position, then every mixer's tensors) as a generation cache."""

    is_compileable = False

    def __init__(self, state: tuple[Tensor, ...]):
        self.state = state

    def get_seq_length(self, layer_idx: int = 0) -> int:
        """Positions the state has seen (equal for every row)."""
        return int(self.state[0][0])


class AttnspecForCausalLM(PreTrainedModel, GenerationMixin):
    """attnspec's model of ``config.spec`` behind transformers' causal-LM interface."""

    config_class = AttnspecConfig
    base_model_prefix = "model"
    main_input_name = "input_ids"
    _is_stateful = True  # the cache is a recurrent state: no assisted decoding, no cropping

    def __init__(self, config: AttnspecConfig):
        super().__init__(config)
        from attnspec.compiler.plan import backends_for
        from attnspec.nn.model import build_model_from_spec
        from attnspec.spec.validate import validate_data

        if not isinstance(config.spec, dict):
            raise InteropError("an attnspec config must carry its spec (config.spec); export it with attnspec "
                               "export-hf")
        if config.spec.get("plugins"):
            raise InteropError("this attnspec config's spec names plugins; a transformers directory never brings "
                               "code along, so it cannot be loaded")
        spec = validate_data(config.spec)
        self.model = build_model_from_spec(spec)
        modes = config.modes or [block.mixer.mode for block in self.model.blocks]
        self.model.set_modes(modes, backends_for(spec, modes, device="cpu"))
        self.post_init()

    @classmethod
    def _supports_default_dynamic_cache(cls) -> bool:
        return False  # the state is attnspec's, made by the first forward

    def _init_weights(self, module) -> None:
        """attnspec initialises its own modules (the spec's seed); transformers' scheme would replace it."""

    def get_input_embeddings(self):
        return self.model.embed

    def set_input_embeddings(self, value):
        self.model.embed = value

    def prepare_inputs_for_generation(self, input_ids: Tensor, past_key_values: AttnspecCache | None = None,
                                      attention_mask: Tensor | None = None, use_cache: bool | None = True, **_):
        """The tokens the state has not seen yet, with the state."""
        if past_key_values is not None:
            input_ids = input_ids[:, past_key_values.get_seq_length():]
        return {"input_ids": input_ids, "past_key_values": past_key_values, "attention_mask": attention_mask,
                "use_cache": use_cache}

    def forward(self, input_ids: Tensor, past_key_values: AttnspecCache | None = None,
                attention_mask: Tensor | None = None, labels: Tensor | None = None, use_cache: bool | None = None,
                **_) -> CausalLMOutputWithPast:
        """Logits (B, L, vocab) of ``input_ids`` (B, L), continuing ``past_key_values`` if given; with
        ``use_cache`` the state after them; with ``labels`` the mean next-token cross-entropy (-100 ignored)."""
        if attention_mask is not None and not bool(attention_mask.all()):
            raise ValueError("attnspec models take prompts of equal length without padding (the attention mask "
                             "must be all ones); batch prompts of equal length or generate them one at a time")
        model = self.model
        use_cache = self.config.use_cache if use_cache is None else use_cache
        state = None
        if past_key_values is not None:
            state, steps = past_key_values.state, []
            for t in range(input_ids.shape[1]):
                logits_t, *state = model.step(input_ids[:, t].contiguous(), *state)
                steps.append(logits_t)
            logits = torch.stack(steps, dim=1)
        elif use_cache and model.has_step:
            logits, *state = model.prefill(input_ids)
        else:
            logits = model(input_ids)
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), labels[:, 1:].flatten(), ignore_index=-100)
        cache = AttnspecCache(tuple(state)) if use_cache and state is not None else None
        return CausalLMOutputWithPast(loss=loss, logits=logits, past_key_values=cache)
