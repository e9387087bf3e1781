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

from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor
from transformers import GenerationMixin, PreTrainedConfig, PreTrainedModel
from transformers.modeling_outputs import CausalLMOutputWithPast

from attnspec.errors import AttnSpecError, InteropError, RunError, shorten
from attnspec.io import all_finite


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

    def __init__(self, state: tuple[Tensor, ...], columns: int):
        self.state = state
        self.columns = columns

    def get_seq_length(self, layer_idx: int = 0) -> int:
        """Input columns the state has seen, left padding included (a padded row's own position, in the
        state, is fewer)."""
        return self.columns


CACHE_FIELD = "cache" if "cache" in CausalLMOutputWithPast.__dataclass_fields__ else "past_key_values"
"""The name transformers gives the cache, in outputs and in the model's inputs: ``past_key_values``
until 5.2x, ``cache`` since (5.24 passes the cache back as ``cache`` only: reading ``past_key_values``
alone made every generated token re-run the whole sequence)."""


def check_directory(directory: Path) -> None:
    """Check an ``attnspec``-type directory before transformers reads it, as ``attnspec.load`` checks a
    build directory: a local directory, a bounded ``config.json`` whose spec is valid and within the
    parameter and decoding-state limits, and a ``model.safetensors`` whose header lists exactly the
    model's tensors with their shapes and floating dtypes (transformers would leave a missing tensor
    as uninitialised memory and load an extra one silently). Nothing is allocated here.

    Raises:
        InteropError: naming the file, the field or the tensor.
    """
    from attnspec.compiler.sizes import check_model_size
    from attnspec.interop.checkpoint import CONFIG, MAX_WEIGHT_BYTES, WEIGHTS, read_json_file, regular_file
    from attnspec.io import read_safetensors_header
    from attnspec.nn.model import Model, cast_parameters, meta_values_skipped

    if not directory.is_dir():
        raise InteropError(f"{directory}: not a local directory; attnspec models load from a directory written by "
                           "`attnspec export-hf` (nothing is downloaded)")
    config = read_json_file(directory / CONFIG, "export-hf writes one")
    spec = _spec_of(config.get("spec"), f"{directory / CONFIG}")
    try:
        check_model_size(spec)
    except AttnSpecError as error:
        raise InteropError(f"{directory / CONFIG}: {error}") from None
    with torch.device("meta"), meta_values_skipped():  # in the dtypes the model holds (the spec's: bf16 stays bf16)
        expected = {f"model.{name}": t for name, t in cast_parameters(Model(spec), spec).state_dict().items()}
    weights = regular_file(directory / WEIGHTS, MAX_WEIGHT_BYTES, "export-hf writes one")
    try:
        found = read_safetensors_header(weights, follow_links=True)
    except RunError as error:
        raise InteropError(str(error)) from None
    missing, extra = sorted(set(expected) - set(found)), sorted(set(found) - set(expected))
    if missing or extra:
        raise InteropError(f"{weights} does not fit its spec's model: missing {[shorten(n) for n in missing[:3]]}"
                           f"{' and more' if len(missing) > 3 else ''}, unexpected {[shorten(n) for n in extra[:3]]}"
                           f"{' and more' if len(extra) > 3 else ''}; export it again with attnspec export-hf")
    for name, tensor in expected.items():
        shape, dtype = found[name]
        if shape != tuple(tensor.shape) or _DTYPES.get(dtype) != tensor.dtype:
            raise InteropError(f"{weights}: tensor {shorten(name)} is {dtype} {shape}, the spec's model has "
                               f"{str(tensor.dtype).replace('torch.', '')} {tuple(tensor.shape)}")


_DTYPES = {"F32": torch.float32, "F64": torch.float64, "F16": torch.float16, "BF16": torch.bfloat16}
"""safetensors' dtype names of floating tensors (integer, boolean and other tensors are refused)."""


def _spec_of(data, source: str):
    """The validated spec of an ``attnspec`` config, or an InteropError."""
    from attnspec.spec.validate import validate_data

    if not isinstance(data, dict):
        raise InteropError(f"{source}: an attnspec config must carry its spec (config.spec); export it with "
                           "attnspec export-hf")
    if data.get("plugins"):
        raise InteropError(f"{source}: its spec names plugins; a transformers directory never brings code along, "
                           "so it cannot be loaded")
    try:
        return validate_data(data)
    except AttnSpecError as error:
        raise InteropError(f"{source}: its spec is not valid:\n{error}") from None


class AttnspecForCausalLM(PreTrainedModel, GenerationMixin):
    """attnspec's model of ``config.spec`` behind transformers' causal-LM interface."""

    config_class = AttnspecConfig
    base_model_prefix = "model"
    main_input_name = "input_ids"
    _is_stateful = True  # the cache is a recurrent state: no assisted decoding, no cropping

    def __init__(self, config: AttnspecConfig):
        super().__init__(config)
        from attnspec.compiler.sizes import check_model_size
        from attnspec.nn.model import build_model_from_spec

        spec = _spec_of(config.spec, "the attnspec config")
        try:
            check_model_size(spec)  # parameters and decoding state, before either is allocated
        except AttnSpecError as error:
            raise InteropError(f"the attnspec config: {error}") from None
        self.model = build_model_from_spec(spec)
        modes = config.modes or [block.mixer.mode for block in self.model.blocks]
        self.model.set_modes(modes)
        self.post_init()

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *args, **kwargs):
        """transformers' ``from_pretrained`` for a local directory that passes :func:`check_directory`,
        then a check that every loaded tensor is finite.

        Raises:
            InteropError: the directory, its spec or its weights (missing, extra, of another shape or
                dtype, NaN or infinite), naming which.
        """
        directory = Path(pretrained_model_name_or_path)
        check_directory(directory)
        model = super().from_pretrained(pretrained_model_name_or_path, *args, **kwargs)
        for name, tensor in model.state_dict().items():
            if tensor.is_floating_point() and not all_finite(tensor):
                raise InteropError(f"{directory}/model.safetensors: tensor {shorten(name)} holds NaN or infinite "
                                   "values")
        return model

    @classmethod
    def _supports_default_dynamic_cache(cls) -> bool:
        return False  # the state is attnspec's, made by the first forward

    def _init_weights(self, module) -> None:
        """attnspec initialises its own modules (the spec's seed); transformers' scheme would replace it."""

    def get_input_embeddings(self):
        return self.model.embed

    def set_input_embeddings(self, value):
        self.model.embed = value

    def prepare_inputs_for_generation(self, input_ids: Tensor, cache: AttnspecCache | None = None,
                                      past_key_values: AttnspecCache | None = None,
                                      attention_mask: Tensor | None = None, use_cache: bool | None = True, **_):
        """The tokens the state has not seen yet, with the state (under either name transformers uses)."""
        cache = cache if cache is not None else past_key_values
        if cache is not None:
            input_ids = input_ids[:, cache.get_seq_length():]
        return {"input_ids": input_ids, CACHE_FIELD: cache, "attention_mask": attention_mask, "use_cache": use_cache}

    def forward(self, input_ids: Tensor, cache: AttnspecCache | None = None,
                past_key_values: AttnspecCache | None = None, attention_mask: Tensor | None = None,
                labels: Tensor | None = None, use_cache: bool | None = None, **_) -> CausalLMOutputWithPast:
        """Logits (B, L, vocab) of ``input_ids`` (B, L), continuing the cache if given (``cache``, or
        ``past_key_values`` before transformers 5.24): one decoding step per new token; without one, a
        prefill of the whole prompt. With ``use_cache`` the state after them; with ``labels`` the mean
        next-token cross-entropy (-100 ignored). Prompts of different lengths come left-padded with an
        ``attention_mask`` 0 on the padding (as ``generate`` passes them): the prefill takes each length's
        rows without their padding (:func:`attnspec.nn.generate.prefill_left_padded`; the padding's
        logits are 0), and each row then decodes from its own position."""
        from attnspec.nn.generate import prefill_left_padded, prompt_lengths

        model = self.model
        use_cache = self.config.use_cache if use_cache is None else use_cache
        cache = cache if cache is not None else past_key_values
        lengths = None
        if attention_mask is not None and not bool(attention_mask.all()):
            if cache is not None:  # the padding was left behind at the prefill; new tokens are never padding
                if not bool(attention_mask[:, -input_ids.shape[1]:].all()):
                    raise ValueError("new tokens after the prompt cannot be padding (the attention mask's last "
                                     "columns must be ones)")
            elif not (use_cache and model.has_step):
                raise ValueError("a padded batch runs through the decoding state (use_cache=True, a causal "
                                 "model); without it, give prompts of equal length (an attention mask of ones)")
            else:
                lengths = prompt_lengths(input_ids, attention_mask)
        state = None
        if lengths is not None:
            logits, state = prefill_left_padded(model.step, lambda: model.init_state(input_ids.shape[0]), input_ids,
                                                lengths, model.prefill, last_only=False)
        elif cache is not None:
            state, steps = cache.state, []
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
        seen = (cache.columns if cache is not None else 0) + input_ids.shape[1]
        new_cache = AttnspecCache(tuple(state), seen) if use_cache and state is not None else None
        return CausalLMOutputWithPast(loss=loss, logits=logits, **{CACHE_FIELD: new_cache})
