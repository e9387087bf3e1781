"""Token generation through a one-token decoding step: greedy, temperature, top-k and top-p sampling.

One loop serves the eager model (``Model.generate``) and an exported ``step.pt2`` program
(``attnspec run --generate --programs``): both are a ``step(token (B,), *state) -> (logits (B, V),
*state)``. The prompt goes through the model's ``prefill`` (each mixer in its planned mode) where there
is one, else position by position through the same step.
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch
from torch import Tensor

from attnspec.errors import ShapeError, shorten

Step = Callable[..., Sequence[Tensor]]


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


@torch.no_grad()
def decode(step: Step, state: Sequence[Tensor], tokens: Tensor, max_new_tokens: int, *, temperature: float = 1.0,
           top_k: int | None = None, top_p: float | None = None, seed: int | None = None,
           eos: int | None = None, prefill: Callable[[Tensor], Sequence[Tensor]] | None = None) -> Tensor:
    """Feed the prompts ``tokens`` (B, T) through ``step`` from ``state`` (or, given ``prefill(tokens)
    -> (logits (B, T, V), *state)``, in one pass), then append up to ``max_new_tokens`` tokens (fewer
    when every row has produced ``eos``; a finished row repeats it).

    Returns (B, T + n) int64 on the tokens' device. ``seed`` fixes the draws (a generator on that device).
    """
    check_sampling(temperature, top_k, top_p, seed, eos)
    if not isinstance(tokens, Tensor) or tokens.dim() != 2 or tokens.shape[0] < 1 or tokens.shape[1] < 1 \
            or tokens.dtype != torch.int64:
        raise ShapeError(f"prompts must be an int64 tensor (batch >= 1, length >= 1) of equal-length rows, got "
                         f"{getattr(tokens, 'dtype', type(tokens).__name__)} {tuple(getattr(tokens, 'shape', ()))}")
    generator = None
    if seed is not None:
        generator = torch.Generator(device=tokens.device).manual_seed(seed)
    state = list(state)
    if prefill is not None:
        logits, *state = prefill(tokens)
        logits = logits[:, -1]
    else:
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


__all__ = ["check_sampling", "decode", "sample_next"]
