"""Packed documents: several sequences side by side in one row of a batch, each computed as if it ran
alone (flash-linear-attention's ``cu_seqlens``; the packed batches of language-model training).

A :class:`Documents` says, for every position of a (B, L) batch, which document it belongs to, its
position inside that document, and whether it starts one. The mixer families honour it through three
general mechanisms, so no kernel needs a second code path:

* **recurrences reset**: a transition ``a_t = 0`` (``log a_t = -inf``) at a document's first position
  forgets the state before it. Every mode of :func:`attnspec.ops.linear.linear_attention` and
  :func:`attnspec.ops.delta.delta_rule` (and their C++ and Triton kernels) already takes ``-inf``
  log-decays exactly (:func:`with_resets` adds them; a family without a transition gets one of zeros);
* **attention is masked**: softmax attention and Scatterbrain's sparse part pair positions of the same
  document only (:func:`same_document`);
* **positions restart**: rotary and learned positions, short convolutions (:func:`shifted`) and
  Griffin's first-position rule read ``positions``, which count from 0 in each document.

Padding is a document too: a left-padded row is the padding's document, then the sequence's, so the
sequence computes as it would unpadded (:func:`from_attention_mask`).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from attnspec.errors import ShapeError, shorten
from attnspec.spec.limits import MAX_LEN as MAX_LENGTH


class Documents(NamedTuple):
    """Where the documents of a packed batch begin; every field (B, L), one row per batch row.

    ``ids``: int64, the document of each position, counted 0, 1, .. from the row's start (a new
    document begins wherever the id changes); ``positions``: int64, the position inside its document
    (0 at its start); ``starts``: bool, True at a document's first position (always at position 0).
    """

    ids: Tensor
    positions: Tensor
    starts: Tensor


def from_starts(starts: Tensor) -> Documents:
    """The documents whose first positions are True in ``starts`` (B, L) bool (position 0 always starts
    one, marked or not)."""
    if not isinstance(starts, Tensor) or starts.dim() != 2 or starts.dtype != torch.bool:
        raise ShapeError(f"document starts must be a bool tensor (batch, length), got "
                         f"{getattr(starts, 'dtype', type(starts).__name__)} {tuple(getattr(starts, 'shape', ()))}")
    starts = starts.clone()
    starts[:, :1] = True
    ids = torch.cumsum(starts.to(torch.int64), dim=1) - 1
    index = torch.arange(starts.shape[1], device=starts.device).expand_as(ids)
    first = torch.cummax(torch.where(starts, index, torch.zeros_like(index)), dim=1).values  # each document's start
    return Documents(ids, index - first, starts)


def from_ids(ids: Tensor) -> Documents:
    """Documents from labels ``ids`` (B, L) of any integer dtype: a new document begins wherever the
    label changes from the position before (so ``[7, 7, 3, 3, 7]`` is three documents)."""
    if not isinstance(ids, Tensor) or ids.dim() != 2 or ids.dtype.is_floating_point or ids.dtype.is_complex \
            or ids.dtype == torch.bool:
        raise ShapeError(f"document ids must be an integer tensor (batch, length), got "
                         f"{getattr(ids, 'dtype', type(ids).__name__)} {tuple(getattr(ids, 'shape', ()))}")
    starts = torch.ones_like(ids, dtype=torch.bool)
    starts[:, 1:] = ids[:, 1:] != ids[:, :-1]
    return from_starts(starts)


def from_cu_seqlens(cu_seqlens: Tensor | list[int], length: int | None = None) -> Documents:
    """Documents of one packed row (B = 1) from cumulative lengths ``[0, n_0, n_0 + n_1, .., L]``, as
    flash-linear-attention and flash-attention's varlen calls take them (``length``: L, by default the
    last entry)."""
    # whole numbers only: as_tensor(dtype=int64) would cut 2.7 to 2 without a word
    if isinstance(cu_seqlens, Tensor):
        if cu_seqlens.is_floating_point() or cu_seqlens.is_complex() or cu_seqlens.dtype == torch.bool:
            raise ShapeError(f"cu_seqlens must hold integers, got a {cu_seqlens.dtype} tensor")
    elif not isinstance(cu_seqlens, (list, tuple)) or \
            not all(isinstance(n, int) and not isinstance(n, bool) for n in cu_seqlens):
        raise ShapeError(f"cu_seqlens must be a list of integers or an integer tensor, got {shorten(cu_seqlens)}")
    if length is not None and (isinstance(length, bool) or not isinstance(length, int)):
        raise ShapeError(f"length must be an integer, got {shorten(length)}")
    try:
        cu = torch.as_tensor(cu_seqlens, dtype=torch.int64).flatten()
    except (RuntimeError, OverflowError, ValueError):  # an integer past int64
        raise ShapeError(f"cu_seqlens must hold lengths up to {MAX_LENGTH:,}, got {shorten(cu_seqlens)}") from None
    length = int(cu[-1]) if length is None and cu.numel() else length
    if cu.numel() < 2 or int(cu[0]) != 0 or bool((cu[1:] <= cu[:-1]).any()) or int(cu[-1]) != length:
        raise ShapeError(f"cu_seqlens must rise strictly from 0 to the length {length}, got {cu.tolist()[:16]}")
    if length > MAX_LENGTH:  # before a (1, length) mask is allocated
        raise ShapeError(f"cu_seqlens reaches {length:,}, past the longest sequence attnspec takes ({MAX_LENGTH:,})")
    starts = torch.zeros(1, length, dtype=torch.bool, device=cu.device)
    starts[0, cu[:-1]] = True
    return from_starts(starts)


def from_attention_mask(mask: Tensor) -> Documents:
    """Padded rows as documents: ``mask`` (B, L), 1 on tokens and 0 on padding (transformers'
    ``attention_mask``). Each run of tokens and each run of padding is a document, so a left- or
    right-padded sequence computes exactly as it would alone (the padding's outputs are meaningless:
    give their targets no weight)."""
    if not isinstance(mask, Tensor) or mask.dim() != 2:
        raise ShapeError(f"attention_mask must be a (batch, length) tensor, got {tuple(getattr(mask, 'shape', ()))}")
    return from_ids(mask.to(torch.int64))


def check(documents: Documents, batch: int, length: int, device) -> None:
    """Refuse documents that do not fit a (batch, length) input (eager calls only)."""
    if not isinstance(documents, Documents):
        raise ShapeError(f"documents must be an attnspec.ops.documents.Documents (from_ids, from_cu_seqlens, "
                         f"from_attention_mask), got {type(documents).__name__}")
    for name, t in documents._asdict().items():
        if tuple(t.shape) != (batch, length) or t.device != torch.device(device):
            raise ShapeError(f"documents.{name} must be ({batch}, {length}) on {device} like the input, got "
                             f"{tuple(t.shape)} on {t.device}")


def check_starts(starts: Tensor | None, q: Tensor) -> None:
    """Refuse document ``starts`` that are not bool (B, L) for q (B, H, L, D) (eager calls only)."""
    if starts is None or torch.compiler.is_compiling() or torch.compiler.is_exporting():
        return
    if not isinstance(starts, Tensor) or starts.dtype != torch.bool or tuple(starts.shape) != (q.shape[0], q.shape[2]):
        raise ShapeError(f"starts must be a bool tensor (B, L) = ({q.shape[0]}, {q.shape[2]}), got "
                         f"{getattr(starts, 'dtype', type(starts).__name__)} {tuple(getattr(starts, 'shape', ()))}")


def ends(starts: Tensor) -> Tensor:
    """(B, L) bool: True at each document's last position (where the next one starts, and at L - 1)."""
    return torch.cat([starts[:, 1:], torch.ones_like(starts[:, :1])], dim=1)


def with_resets(log_mag: Tensor | None, starts: Tensor, like: Tensor) -> Tensor:
    """A real log-decay with ``-inf`` at every document start, so each recurrence forgets the state
    before it: ``log_mag`` (B, H, L, D) or None (no transition: zeros (B, H, L, 1) are made, in the
    accumulation dtype of ``like`` (B, H, L, ..)); ``starts`` (B, L) bool."""
    where = starts.view(starts.shape[0], 1, starts.shape[1], 1)
    if log_mag is None:
        dtype = torch.float32 if like.dtype in (torch.bfloat16, torch.float16) else like.dtype
        log_mag = torch.zeros(*like.shape[:3], 1, dtype=dtype, device=like.device)
    return log_mag.masked_fill(where, float("-inf"))


def same_document(ids: Tensor) -> Tensor:
    """(B, 1, L, L) bool: True where query i and key j are in the same document."""
    return (ids.unsqueeze(-1) == ids.unsqueeze(-2)).unsqueeze(1)


def shifted(x: Tensor, shift: int, positions: Tensor) -> Tensor:
    """``x`` (B, L, C) moved ``shift`` positions later, zero where that would cross a document start
    (``positions`` (B, L) < shift): what a causal convolution's tap ``shift`` reads."""
    if shift == 0:
        return x
    moved = torch.nn.functional.pad(x, (0, 0, shift, 0))[:, :x.shape[1]]
    return moved.masked_fill((positions < shift).unsqueeze(-1), 0.0)


def segment_cummax(x: Tensor, ids: Tensor, max_length: int) -> Tensor:
    """Running maximum of ``x`` (B, H, L) along L, restarting at every document (``ids`` (B, L)): a
    Hillis-Steele scan of ceil(log2 max_length) steps (a count fixed by ``max_length`` >= L, so compiled
    code does not specialise on L), each a shifted maximum where the shifted position is in the same
    document. Exact (maxima round nothing) and differentiable."""
    L = x.shape[-1]
    ids = ids.unsqueeze(1)  # (B, 1, L)
    shift = 1
    while shift < max_length:
        earlier = torch.nn.functional.pad(x, (shift, 0), value=float("-inf"))[..., :L]
        same = torch.nn.functional.pad(ids, (shift, 0), value=-1)[..., :L] == ids
        x = torch.where(same, torch.maximum(x, earlier), x)
        shift *= 2
    return x


__all__ = ["Documents", "check", "check_starts", "ends", "from_attention_mask", "from_cu_seqlens", "from_ids", "from_starts",
           "same_document", "segment_cummax", "shifted", "with_resets"]
