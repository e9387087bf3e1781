"""Token generation through a one-token decoding step: greedy, temperature, top-k and top-p sampling.

One loop serves the eager model (``Model.generate``) and an exported ``step.pt2`` program
(``attnspec run --generate --programs``): both are a ``step(token (B,), *state) -> (logits (B, V),
*state)``. The prompt goes through the model's ``prefill`` (each mixer in its planned mode) where there
is one, else position by position through the same step.

Prompts of different lengths come as transformers' ``generate`` takes them: left-padded to one length
with an ``attention_mask`` (B, T) that is 0 on the padding. The rows of each prompt length are prefilled
together without their padding, so no pad enters any mixer and every family (softmax caches, recurrent
states, short convolutions, positions) is exact without a mask of its own; their states are gathered
into one batch, and each row decodes from its own position (the decoding state's position is per row).
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch
from torch import Tensor

from attnspec.errors import ShapeError, shorten

Step = Callable[..., Sequence[Tensor]]
InitialState = Sequence[Tensor] | Callable[[], Sequence[Tensor]]
"""The decoding state before the prompt, or a function making it: called only where a prompt is stepped
through token by token (otherwise a full-capacity state is allocated and zeroed only to be replaced by
the prefill's)."""


def sample_next(logits: Tensor, *, temperature: float = 1.0, top_k: int | None = None, top_p: float | None = None,
                generator: torch.Generator | None = None) -> Tensor:
    """The next token of each row of ``logits`` (B, V): argmax at temperature 0, else a draw from
    softmax(logits / temperature) restricted to the ``top_k`` largest and to the smallest set whose
    probability reaches ``top_p`` (the most likely token always stays). Returns (B,) int64."""
    if temperature == 0:
        return logits.argmax(-1)
    logits = logits.double()  # float64: a temperature of 5e-324 is no float32 number (it would divide by 0)
    # the largest logit becomes 0 before dividing: any temperature > 0, however small (1e-45), then
    # gives finite logits (0 and -inf at worst), never inf - inf
    logits = (logits - logits.max(dim=-1, keepdim=True).values) / temperature
    if top_k is not None and top_k < logits.shape[-1]:
        threshold = torch.topk(logits, top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < threshold, float("-inf"))
    if top_p is not None and top_p < 1:
        ordered, order = torch.sort(logits, dim=-1, descending=True)
        before = torch.softmax(ordered, dim=-1).cumsum(-1) - torch.softmax(ordered, dim=-1)  # mass before each
        dropped = before >= top_p
        dropped[..., 0] = False  # the most likely token stays, whatever rounding puts before it
        ordered = ordered.masked_fill(dropped, float("-inf"))
        logits = torch.full_like(logits, float("-inf")).scatter(-1, order, ordered)
    return torch.multinomial(torch.softmax(logits, dim=-1), 1, generator=generator)[:, 0]


MAX_SEED = (1 << 63) - 1


def check_sampling(temperature: float, top_k: int | None, top_p: float | None, seed: int | None = None,
                   eos: int | None = None, vocab_size: int | None = None) -> None:
    """Refuse generation settings that mean nothing, naming the setting (a ShapeError, an AttnSpecError)."""
    def number(value) -> bool:
        return not isinstance(value, bool) and isinstance(value, (int, float))

    def integer(value) -> bool:
        return not isinstance(value, bool) and isinstance(value, int)

    if not number(temperature) or not 0 <= temperature <= 100:
        raise ShapeError(f"temperature must be a number in [0, 100] (0: greedy), got {shorten(temperature)}")
    if top_k is not None and (not integer(top_k) or top_k < 1):
        raise ShapeError(f"top_k must be a positive integer, got {shorten(top_k)}")
    if top_p is not None and (not number(top_p) or not 0 < top_p <= 1):
        raise ShapeError(f"top_p must be in (0, 1], got {shorten(top_p)}")
    if seed is not None and (not integer(seed) or not 0 <= seed <= MAX_SEED):
        raise ShapeError(f"seed must be an integer in [0, 2**63 - 1], got {shorten(seed)}")
    if eos is not None and (not integer(eos) or eos < 0 or (vocab_size is not None and eos >= vocab_size)):
        bound = f"[0, {vocab_size})" if vocab_size is not None else "[0, vocab_size)"
        raise ShapeError(f"eos must be a token id in {bound}, got {shorten(eos)}")


def prompt_lengths(tokens: Tensor, attention_mask: Tensor | None) -> Tensor | None:
    """Each row's prompt length (B,) int64 from a left-padding ``attention_mask`` (B, T) of 0 and 1 (bool
    or integer), or None when no row is padded. Refuses a mask of another shape, values other than 0
    and 1, a row with no token, and padding anywhere but on the left (a ShapeError naming it)."""
    if attention_mask is None:
        return None
    if not isinstance(attention_mask, Tensor) or attention_mask.shape != tokens.shape \
            or attention_mask.dtype.is_floating_point or attention_mask.dtype.is_complex:
        raise ShapeError(f"attention_mask must be a bool or integer tensor shaped like the prompts "
                         f"{tuple(tokens.shape)}, got {getattr(attention_mask, 'dtype', type(attention_mask).__name__)}"
                         f" {tuple(getattr(attention_mask, 'shape', ()))}")
    mask = attention_mask.to(device=tokens.device, dtype=torch.int64)
    if bool(((mask != 0) & (mask != 1)).any()):
        raise ShapeError("attention_mask must hold 0 (padding) and 1 (a prompt token) only")
    lengths = mask.sum(dim=1)
    T = tokens.shape[1]
    if bool((lengths == 0).any()):
        raise ShapeError("a row of attention_mask is all padding: every prompt needs at least one token")
    left_padded = torch.arange(T, device=mask.device).unsqueeze(0) >= (T - lengths).unsqueeze(1)
    if not torch.equal(mask.bool(), left_padded):
        raise ShapeError("attention_mask must pad on the left (a row's zeros before its ones, its prompt ending at "
                         "the last column), as transformers' generate takes it; right-padded prompts: shift each "
                         "row's tokens to the end")
    return None if bool((lengths == T).all()) else lengths


def prefill_left_padded(step: Step, state: InitialState, tokens: Tensor, lengths: Tensor,
                        prefill: Callable[[Tensor], Sequence[Tensor]] | None, *,
                        last_only: bool = True) -> tuple[Tensor, list[Tensor]]:
    """Left-padded prompts ``tokens`` (B, T) of ``lengths`` (B,) into logits and one batch's decoding state.

    The rows of each length go together without their padding through ``prefill(prompt) -> (logits,
    *state)`` (for two tokens or more), else token by token through ``step`` from ``state``'s rows (a
    callable ``state`` is called then, once); the groups' logits and states are gathered back into the
    batch's row order. Returns the logits, (B, 1, V) at each prompt's last token with ``last_only``
    (``prefill`` then returns only those), else (B, T, V) right-aligned with zeros at the padding, and
    the state (each tensor batch-first, contiguous).
    """
    B, T = tokens.shape
    logits, merged = None, None
    for length in sorted(set(lengths.tolist())):
        if callable(state) and (prefill is None or length == 1):
            state = state()
        rows = (lengths == length).nonzero().squeeze(1)
        prompt = tokens.index_select(0, rows)[:, T - length:].contiguous()
        if prefill is not None and length > 1:
            group_logits, *group_state = prefill(prompt)
        else:
            group_state, steps = [tensor.index_select(0, rows) for tensor in state], []
            for t in range(length):
                step_logits, *group_state = step(prompt[:, t].contiguous(), *group_state)
                steps.append(step_logits)
            group_logits = torch.stack(steps[-1:] if last_only else steps, dim=1)
        group_logits = group_logits[:, -1:] if last_only else group_logits
        if merged is None:
            merged = [tensor.new_empty((B, *tensor.shape[1:])) for tensor in group_state]
            logits = group_logits.new_zeros((B, 1 if last_only else T, group_logits.shape[-1]))
        for whole, part in zip(merged, group_state):
            whole.index_copy_(0, rows, part)
        logits[rows, logits.shape[1] - group_logits.shape[1]:] = group_logits
    return logits, merged


@torch.no_grad()
def decode(step: Step, state: InitialState, tokens: Tensor, max_new_tokens: int, *, temperature: float = 1.0,
           top_k: int | None = None, top_p: float | None = None, seed: int | None = None,
           eos: int | None = None, prefill: Callable[[Tensor], Sequence[Tensor]] | None = None,
           attention_mask: Tensor | None = None) -> Tensor:
    """Feed the prompts ``tokens`` (B, T) through ``step`` from ``state`` (or, given ``prefill(tokens)
    -> (logits (B, T, V), *state)``, in one pass; ``state`` may be a function making it, called only
    where a prompt is stepped), then append up to ``max_new_tokens`` tokens (fewer
    when every row has produced ``eos``; a finished row repeats it). Prompts of different lengths are
    left-padded with ``attention_mask`` (B, T) 0 on the padding (:func:`prompt_lengths`); each row
    then continues exactly as it would alone.

    Returns (B, T + n) int64 on the tokens' device (the padding kept as given). ``seed`` fixes the draws
    (a generator on that device).
    """
    check_sampling(temperature, top_k, top_p, seed, eos)
    if not isinstance(tokens, Tensor) or tokens.dim() != 2 or tokens.shape[0] < 1 or tokens.shape[1] < 1 \
            or tokens.dtype != torch.int64:
        raise ShapeError(f"prompts must be an int64 tensor (batch >= 1, length >= 1), left-padded to one length "
                         f"with an attention_mask where they differ, got "
                         f"{getattr(tokens, 'dtype', type(tokens).__name__)} {tuple(getattr(tokens, 'shape', ()))}")
    lengths = prompt_lengths(tokens, attention_mask)
    generator = None
    if seed is not None:
        generator = torch.Generator(device=tokens.device).manual_seed(seed)
    if lengths is not None:
        logits, state = prefill_left_padded(step, state, tokens, lengths, prefill)
        logits = logits[:, -1]
    elif prefill is not None:
        logits, *state = prefill(tokens)
        logits = logits[:, -1]
    else:
        state = list(state() if callable(state) else state)
        for t in range(tokens.shape[1]):
            # contiguous: an AOTInductor package reads its inputs with the strides it was traced with
            logits, *state = step(tokens[:, t].contiguous(), *state)
    out = [tokens]
    finished = torch.zeros(tokens.shape[0], dtype=torch.bool, device=tokens.device)
    for index in range(max_new_tokens):
        token = sample_next(logits, temperature=temperature, top_k=top_k, top_p=top_p, generator=generator)
        if eos is not None:
            token = torch.where(finished, torch.full_like(token, eos), token)
            finished = finished | (token == eos)
        out.append(token.unsqueeze(1))
        if (eos is not None and bool(finished.all())) or index == max_new_tokens - 1:
            break
        logits, *state = step(token, *state)
    return torch.cat(out, dim=1)


__all__ = ["check_sampling", "decode", "prefill_left_padded", "prompt_lengths", "sample_next"]
