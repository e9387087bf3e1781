"""The model: input embedding, blocks (norm, mixer, residual, MLP), final norm, head.

Built from a resolved :class:`~attnspec.spec.ir.Spec` by :func:`build_model_from_spec`.
Readable top to bottom: ``Model.forward`` is the whole computation.
"""

from __future__ import annotations

import contextlib
import functools
import fnmatch
import importlib
import importlib.util
import math
import sys
import types
from typing import Iterator

import torch
from torch import Tensor, nn

import attnspec.nn.channel  # noqa: F401  (registers the norms and MLPs)
import attnspec.nn.convs  # noqa: F401  (registers the short convolutions)
import attnspec.nn.features  # noqa: F401  (registers the feature maps)
import attnspec.nn.mixers  # noqa: F401  (registers the mixers)
import attnspec.nn.reweightings  # noqa: F401  (registers the re-weightings)
import attnspec.nn.supports  # noqa: F401  (registers the sparse supports)
import attnspec.nn.transitions  # noqa: F401  (registers the transitions)
from attnspec.errors import Problem, ShapeError, SpecError, shorten
from attnspec.spec import limits
from attnspec.nn.channel import Mlp  # noqa: F401  (part of the nn API)
from attnspec.nn.features import PerformerFeatures
from attnspec.nn.mixers.base import holding
from attnspec.nn.positions import Position, build_position
from attnspec.nn.registry import build
from attnspec.nn.shared import SharedUse
from attnspec.ops.documents import Documents
from attnspec.ops.documents import check as check_documents
from attnspec.ops.per_step import one_step
from attnspec.spec.walk import iter_blocks, kv_sources

DTYPES = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16, "float16": torch.float16}
HALF = (torch.bfloat16, torch.float16)


class Block(nn.Module):
    """``pre``: x + f(norm(x)); ``post``: norm(x + f(x)); ``sandwich``: x + post_norm(f(norm(x)));
    ``output``: x + norm(f(x)); ``normed_residual``: norm(x) + f(norm(x)); each sub-layer's skip and output
    times its own α and β (``skip_scale``, ``residual_scale``: α x + β f(x)); a sub-layer without its
    residual drops the ``α x +``; ``mixer: none`` drops the mixer's sub-layer and its norm; ``parallel``:
    x + f(norm(x)) + g(norm(x)) (or g(norm2(x))), the mixer and the MLP side by side. A block that
    calls a shared block (``shared_use``) adds its output to the mixer's input: x + f(norm(x + P S(..))); with
    ``output_scale``, the block's output times a learnt scalar (Gemma 4)."""

    def __init__(self, node, *, d_model: int, max_len: int, seed: int, d_in: int | None = None,
                 shared_use: SharedUse | None = None, depth: int = 0):
        super().__init__()
        # d_in: the mixer's input width where a shared block reads [hidden, embeddings] (its mixer projects it)
        wide = {"d_in": d_in} if d_in not in (None, d_model) else {}
        if node.mixer.reads_depth:  # a part whose initial value follows depth (differential attention's λ_init)
            wide["depth"] = depth
        self.shared_use = shared_use
        self.mixer = build("mixer", node.mixer, d_model=d_model, max_len=max_len, seed=seed, **wide)
        self.mlp = None if node.mlp.is_identity else build("mlp", node.mlp, d_model=d_model)
        self.norm1 = None if node.mixer.is_identity else build("norm", node.norm, dim=d_in or d_model)  # `mixer: none`
        # a parallel block with one norm (`shared_norm`) feeds the MLP the mixer's normalised input
        self.parallel = node.parallel != "none"
        self.norm2 = build("norm", node.norm, dim=d_model) if self.mlp is not None and node.parallel != "shared_norm" \
            else None
        self.pre = node.norm_placement in ("pre", "sandwich", "normed_residual")
        self.normed_skip = node.norm_placement == "normed_residual"  # the skip carries norm(x), not x
        self.output_norm = node.norm_placement == "output"  # x + norm(f(x)): the one norm is on the output
        sandwich = node.norm_placement == "sandwich"  # a norm of each sub-layer's output, before the residual
        self.post_norm1 = build("norm", node.norm, dim=d_model) if sandwich and self.norm1 is not None else None
        self.post_norm2 = build("norm", node.norm, dim=d_model) if sandwich and self.mlp is not None else None
        self.mixer_residual, self.mlp_residual = node.residuals()
        self.mixer_scales, self.mlp_scales = node.scales()
        # a learnt scalar on the block's output (Gemma 4's layer_scalar); (1,), as a 0-d parameter is a number to
        # torch.compile's guards
        self.output_scale = nn.Parameter(torch.ones(1)) if node.output_scale else None

    def _scaled(self, x: Tensor) -> Tensor:
        return x if self.output_scale is None else x * self.output_scale.to(x.dtype)

    def _sublayer(self, x: Tensor, f, norm: nn.Module, residual: bool, post_norm: nn.Module | None,
                  scales: tuple[float, float], feed: Tensor | None = None) -> Tensor:
        if self.normed_skip:
            x = norm(x)
            y = f(x)
        elif feed is not None:  # a shared block's output joins the mixer's input, not the skip (`pre` only)
            y = f(norm(x + feed))
        else:
            y = f(norm(x)) if self.pre else norm(f(x)) if self.output_norm else f(x)
        if post_norm is not None:
            y = post_norm(y)
        skip_scale, out_scale = scales
        if out_scale != 1.0:
            y = y * out_scale
        after = not (self.pre or self.output_norm)  # `post`: the norm comes after the residual sum
        if not residual:
            return norm(y) if after else y
        if skip_scale != 1.0:
            x = x * skip_scale
        return norm(x + y) if after else x + y

    def mixer_input(self, x: Tensor) -> Tensor:
        """What the mixer reads of the block's input x (B, L, d): norm1(x) where the norm comes first (`pre`,
        `sandwich`, `normed_residual`; parallel blocks are `pre`), x itself where it comes after (`post`, `output`)."""
        return self.norm1(x) if self.pre else x

    def _parallel(self, x: Tensor, mix) -> Tensor:
        """``parallel``: x + mix(norm1(x)) + mlp(norm1(x)), or mlp(norm2(x)) with its own norm."""
        h = self.norm1(x)
        return x + mix(h) + self.mlp(h if self.norm2 is None else self.norm2(x))

    def forward(self, x: Tensor, mode: str | None = None, embeddings: Tensor | None = None,
                documents: Documents | None = None, kv: tuple[Tensor, Tensor] | None = None,
                lend: bool = False) -> Tensor | tuple[Tensor, tuple[Tensor, Tensor]]:
        """x (B, L, d_in) -> (B, L, d_model); ``embeddings`` (B, L, d_model): the model's first hidden state,
        which a shared block reading [hidden, embeddings] takes beside x; ``documents``: packed documents,
        each computed as if alone (only mixers that take them are handed them). Cross-layer key/value
        sharing: ``kv``, the keys and values an earlier block lent, for an attention with ``kv_from``;
        ``lend``: also return this block's attention's own (``lends_kv``), (x, (keys, values))."""
        feed = None if self.shared_use is None else self.shared_use(x, embeddings, documents)
        extra = ({} if documents is None else {"documents": documents}) | ({} if kv is None else {"kv": kv})
        lent = {}

        def mix(h: Tensor) -> Tensor:
            if not lend:
                return self.mixer(h, mode, **extra)
            y, lent["kv"] = self.mixer(h, mode, lend=True, **extra)
            return y

        x = self._around(x, mix, feed)
        return (x, lent["kv"]) if lend else x

    def _around(self, x: Tensor, mix, feed: Tensor | None = None) -> Tensor:
        """The block around its mixer's call ``mix`` (h -> y): the two side by side (parallel), or the mixer's
        sub-layer then the MLP's; then the output scale."""
        if self.parallel:
            x = self._parallel(x, mix)
        else:
            if self.norm1 is not None:
                x = self._sublayer(x, mix, self.norm1, self.mixer_residual, self.post_norm1, self.mixer_scales, feed)
            if self.mlp is not None:
                x = self._sublayer(x, self.mlp, self.norm2, self.mlp_residual, self.post_norm2, self.mlp_scales)
        return self._scaled(x)

    @property
    def has_step(self) -> bool:
        """Its mixer decodes one token at a time, and so does the shared block it calls."""
        return self.mixer.has_step and (self.shared_use is None or self.shared_use.tied_view.has_step)

    @property
    def decode_limit(self) -> int | None:
        """The positions its decoding state holds (the mixer's, or the shared block's when fewer); None: unbounded."""
        limits = [self.mixer.decode_limit] + ([] if self.shared_use is None else [self.shared_use.tied_view.decode_limit])
        bounded = [limit for limit in limits if limit is not None]
        return min(bounded) if bounded else None

    def init_state(self, batch: int, dtype: torch.dtype, device, capacity: int | None = None) -> tuple[Tensor, ...]:
        """The decoding state: the mixer's tensors, then those of the shared block this block calls (its own
        cache: each call reads its own input). ``capacity``: the positions a generation reaches, which
        full caches are sized to (None: ``max_len``)."""
        state = tuple(self.mixer.init_state(batch, dtype, device, **holding(self.mixer, capacity)))
        if self.shared_use is None:
            return state
        return state + self.shared_use.tied_view.init_state(batch, dtype, device, capacity)

    def state_size(self, length: int) -> int:
        """Numbers one sequence carries from its past at ``length`` (the mixer's, and its shared call's)."""
        own = self.mixer.state_size(length)
        return own if self.shared_use is None else own + self.shared_use.tied_view.state_size(length)

    def step(self, x: Tensor, state: tuple[Tensor, ...], position: Tensor, embeddings: Tensor | None = None,
             kv: tuple[Tensor, Tensor] | None = None) -> tuple[Tensor, tuple[Tensor, ...]]:
        """One position: x (B, d_in) and the block's state -> (B, d_model) and its new state. ``kv``: the cache
        (keys, values) of the block that lends them, after its step, for an attention with ``kv_from``."""
        feed, shared_state = None, ()
        if self.shared_use is not None:
            count = len(state) - self.shared_use.state_count
            state, (feed, shared_state) = state[:count], self.shared_use.step(x, embeddings, state[count:], position)
        sharing = {} if kv is None else {"kv": kv}
        x, state, _ = self._stateful(x, lambda h: self.mixer.step(h, state, position, **sharing), feed)
        return x, state + shared_state

    def prefill(self, x: Tensor, embeddings: Tensor | None = None, capacity: int | None = None,
                kv: tuple[Tensor, Tensor] | None = None, lend: bool = False) -> tuple:
        """A whole prompt: x (B, L, d_in) -> (B, L, d_model) and the block's state after it (full caches of
        ``capacity`` positions if given, else ``max_len``); ``kv`` and ``lend`` as :meth:`forward`'s (with
        ``lend``, the attention's keys and values over the prompt come third)."""
        feed, shared_state = None, ()
        if self.shared_use is not None:
            feed, shared_state = self.shared_use.prefill(x, embeddings, capacity)
        sharing = ({} if kv is None else {"kv": kv}) | ({"lend": True} if lend else {})
        x, state, lent = self._stateful(
            x, lambda h: self.mixer.prefill(h, **holding(self.mixer, capacity), **sharing), feed)
        return (x, state + shared_state, lent) if lend else (x, state + shared_state)

    def _stateful(self, x: Tensor, mixer_call, feed: Tensor | None = None
                  ) -> tuple[Tensor, tuple[Tensor, ...], tuple[Tensor, Tensor] | None]:
        """The block around ``mixer_call`` (h -> (y, state) or (y, state, lent keys and values)): its output,
        the mixer's state and what it lent."""
        box = {}

        def mix(h: Tensor) -> Tensor:
            y, box["state"], *lent = mixer_call(h)
            box["lent"] = lent[0] if lent else None
            return y

        return self._around(x, mix, feed), tuple(box.get("state", ())), box.get("lent")


class Model(nn.Module):
    """A spec's model. ``forward(inputs)``: tokens (B, L) int64 or features (B, L, dim) -> head output.

    Head outputs: ``lm`` logits (B, L, vocab); ``classifier`` logits (B, classes); ``none`` the
    final hidden states (B, L, d_model).
    """

    def __init__(self, spec):
        super().__init__()
        self.spec = spec
        d = spec.d_model
        self.token_input = spec.input.kind == "tokens"
        self.embed = nn.Embedding(spec.input.vocab_size, d) if self.token_input else nn.Linear(spec.input.dim, d)
        # learned/sinusoidal positions join the embeddings; rope/alibi live in the mixers (resolved there)
        self.position = (build_position(spec.position, d_model=d, max_len=spec.max_len)
                         if spec.position.acts_on == "embedding" else Position())
        # shared blocks first: their tensors' names are the ones the state dict keeps (each use's view aliases them)
        shared = {node.name: node for node in spec.shared}
        self.shared_blocks = nn.ModuleDict({
            node.name: Block(node.block, d_model=d, max_len=spec.max_len, seed=spec.seed + 7919 * (limits.MAX_BLOCKS + j),
                             d_in=2 * d if node.reads == "hidden_and_embeddings" else d)
            for j, node in enumerate(spec.shared)})
        blocks = []
        for i, (_, node) in enumerate(iter_blocks(spec, expand=True)):
            use = node.shared
            call = None if use is None else SharedUse(use, shared[use.name], self.shared_blocks[use.name], d_model=d)
            blocks.append(Block(node, d_model=d, max_len=spec.max_len, seed=spec.seed + 7919 * i, shared_use=call,
                                depth=i))
        self.blocks = nn.ModuleList(blocks)
        # cross-layer key/value sharing: the block each block's attention reads keys and values from, and the
        # blocks read so (their forward and prefill hand over their attention's keys and values too)
        self.kv_sources = kv_sources(spec)
        self.kv_lenders = frozenset(source for source in self.kv_sources if source is not None)
        self.final_norm = build("norm", spec.final_norm, dim=d)
        head = spec.head
        self.head_kind = head.kind
        self.pooling = getattr(head, "pooling", None)
        self.head_bias = None
        if head.kind == "lm":
            self.head = None if head.tied else nn.Linear(d, spec.input.vocab_size, bias=head.bias)
            # a tied head's own bias (CTRL's): the embedding table it reads has none
            self.head_bias = nn.Parameter(torch.zeros(spec.input.vocab_size)) if head.tied and head.bias else None
        elif head.kind == "classifier":
            self.head = nn.Linear(d, head.classes)
        else:
            self.head = None
        self.head_scale = (head.scale or head.default_scale(d, spec.version)) if head.kind == "lm" else 1.0
        self.softcap = head.softcap if head.kind == "lm" else None
        self.embedding_scale = spec.input.scale if self.token_input else 1.0
        input_norm = spec.input.norm if self.token_input else None
        self.embed_norm = None if input_norm is None or input_norm.is_identity else build("norm", input_norm, dim=d)
        self._state_layout: list[int] | None = None
        self._capacity_axes: list[int | None] | None = None
        initialise(self, spec.init)

    @property
    def has_step(self) -> bool:
        """True for a token LM whose mixers all decode one token at a time: with a recurrent state, a
        key/value cache or their inputs so far (every causal mixer does)."""
        return self.token_input and self.head_kind == "lm" and all(block.has_step for block in self.blocks)

    @property
    def prefills_in_one_pass(self) -> bool:
        """True for a model that decodes and whose every mixer computes its prompt in one full-sequence
        pass (a plugin family without its own prefill steps through the prompt): the condition for an
        exported ``prefill.pt2`` that takes prompts of any length."""
        blocks = [*self.blocks, *self.shared_blocks.values()]
        return self.has_step and all(block.mixer.prefills_in_one_pass for block in blocks)

    @property
    def decode_limit(self) -> int | None:
        """The most positions one sequence can reach by decoding: ``max_len`` where a full key/value
        cache, a mixer's cached inputs or a learned position table hold them, else None (unbounded:
        recurrent states, sliding windows and computed positions)."""
        bounded = self.spec.position.bounded or any(block.decode_limit is not None for block in self.blocks)
        return self.spec.max_len if bounded else None

    def generate(self, tokens: Tensor, max_new_tokens: int, *, temperature: float = 0.0, top_k: int | None = None,
                 top_p: float | None = None, seed: int | None = None, eos: int | None = None,
                 attention_mask: Tensor | None = None) -> Tensor:
        """Continue the prompts ``tokens`` (B, T) int64 by up to ``max_new_tokens`` tokens: :meth:`prefill`
        over the prompts, then one decoding step per token; greedy by default (``temperature=0``, as
        transformers' ``generate`` and ``attnspec run``), sampled at a positive ``temperature`` (with ``top_k``,
        ``top_p``) from a generator seeded with ``seed`` if given; rows stop at ``eos`` (and
        repeat it). Prompts of different lengths are left-padded, with ``attention_mask`` (B, T) 0 on the
        padding as transformers' ``generate`` takes them; each row continues as it would alone
        (:func:`attnspec.nn.generate.decode`).

        Returns (B, T + n) int64. Raises ShapeError for a model without a decoding step or a total
        length past :attr:`decode_limit` (the message names ``max_len``).
        """
        from attnspec.nn.generate import check_sampling, decode

        if not self.has_step:
            raise ShapeError("this model has no decoding step: generation needs a causal token model with an lm head")
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 0:
            raise ShapeError(f"max_new_tokens must be a non-negative integer, got {shorten(max_new_tokens)}")
        check_sampling(temperature, top_k, top_p, seed, eos, self.spec.input.vocab_size)
        self.check_inputs(tokens)
        limit = self.decode_limit
        if limit is not None and tokens.shape[1] + max_new_tokens > limit:
            raise ShapeError(f"{tokens.shape[1]} prompt tokens + {max_new_tokens} new ones exceed max_len = {limit}, "
                             "the positions this model's cache (or position table) holds; raise max_len or "
                             "generate fewer")
        capacity = tokens.shape[1] + max_new_tokens  # caches sized to this generation, not to max_len
        return decode(self.step, lambda: self.init_state(tokens.shape[0], capacity), tokens, max_new_tokens,
                      temperature=temperature, top_k=top_k, top_p=top_p, seed=seed, eos=eos,
                      prefill=lambda prompt: self.prefill(prompt, last_only=True, capacity=capacity),
                      attention_mask=attention_mask)

    def check_inputs(self, inputs: Tensor, per_position: bool = True) -> None:
        """Refuse inputs the model cannot take, naming the limit (eager calls only: traced code has
        its shapes fixed by export's dynamic dimensions, and a value check there would break the graph).

        ``per_position``: ``inputs`` is a sequence (B, L[, dim]); False for one decoding step (B[, dim]).
        """
        if torch.compiler.is_compiling() or torch.compiler.is_exporting():
            return
        spec = self.spec
        rank = 2 if per_position else 1
        if not isinstance(inputs, Tensor):
            raise ShapeError(f"the model takes a tensor, got {type(inputs).__name__}")
        if self.token_input:
            if inputs.dim() != rank or inputs.dtype not in (torch.int64, torch.int32):
                shape = "(batch, length)" if per_position else "(batch,)"
                raise ShapeError(f"token input must be an int64 tensor {shape}, got {inputs.dtype} "
                                 f"{tuple(inputs.shape)}")
            if inputs.numel() and (int(inputs.min()) < 0 or int(inputs.max()) >= spec.input.vocab_size):
                raise ShapeError(f"token ids must be in [0, {spec.input.vocab_size}) (vocab_size), got ids from "
                                 f"{int(inputs.min())} to {int(inputs.max())}")
        else:
            dtype = self.embed.weight.dtype
            if inputs.dim() != rank + 1 or inputs.shape[-1] != spec.input.dim or inputs.dtype != dtype:
                shape = f"(batch, length, {spec.input.dim})" if per_position else f"(batch, {spec.input.dim})"
                raise ShapeError(f"feature input must be a {dtype} tensor {shape}, got {inputs.dtype} "
                                 f"{tuple(inputs.shape)}")
        if per_position and inputs.shape[1] > spec.max_len:
            raise ShapeError(f"the sequence has {inputs.shape[1]} positions, more than max_len = {spec.max_len}")

    def forward(self, inputs: Tensor, mode: str | None = None, hidden_states: bool = False,
                documents: Documents | None = None) -> Tensor | tuple[Tensor, tuple[Tensor, ...]]:
        """The head's output for ``inputs``; with ``hidden_states``, also every block's output (B, L, d_model) in
        order (distillation matches them; a plain return keeps the graph free of hooks, so it compiles).

        ``documents``: packed documents (:mod:`attnspec.ops.documents`: ``from_ids``, ``from_cu_seqlens``,
        ``from_attention_mask``), several sequences per row, each computed exactly as it would be alone
        (positions restart, recurrent states reset, attention stays inside each). A classifier head
        pools over the whole row, so it takes none."""
        x, outputs = self._blocks(inputs, mode, documents, keep=hidden_states)
        out = self._head(self.final_norm(x))
        return (out, outputs) if hidden_states else out

    def head_input(self, inputs: Tensor, documents: Documents | None = None) -> Tensor:
        """What the head reads for ``inputs``: the final norm of the last block's output (B, L, d_model).
        :meth:`head_logits` of it is :meth:`forward`'s output; an evaluation takes the logits a few positions
        at a time from it, never holding (L, vocab) at once."""
        x, _ = self._blocks(inputs, None, documents)
        return self.final_norm(x)

    def head_logits(self, hidden: Tensor) -> Tensor:
        """The head's output (..., vocab) for :meth:`head_input`'s (..., d_model) (an lm head's logits)."""
        return self._head(hidden)

    def _blocks(self, inputs: Tensor, mode: str | None, documents: Documents | None, keep: bool = False
                ) -> tuple[Tensor, tuple[Tensor, ...]]:
        """The last block's output (B, L, d_model), and with ``keep`` every block's in order (else none:
        without autograd holding them, each block's output is freed once the next has read it)."""
        self.check_inputs(inputs)
        if documents is not None:
            self.check_documents(documents, inputs)
        x = embeddings = self.embedded(inputs, documents)
        outputs = []
        packed = {} if documents is None else {"documents": documents}  # blocks wrapped by the compile check too
        lent: dict[int, tuple[Tensor, Tensor]] = {}  # block index -> the keys and values it lends
        for index, (block, source) in enumerate(zip(self.blocks, self.kv_sources)):
            sharing = {} if source is None else {"kv": lent[source]}
            if index in self.kv_lenders:
                x, lent[index] = block(x, mode, embeddings, **packed, **sharing, lend=True)
            else:
                x = block(x, mode, embeddings, **packed, **sharing)
            if keep:
                outputs.append(x)
        return x, tuple(outputs)

    @property
    def takes_documents(self) -> bool:
        """Whether every mixer takes packed documents (padding is one): :meth:`forward`'s ``documents``."""
        return all(block.mixer.takes_documents for block in [*self.blocks, *self.shared_blocks.values()])

    def check_documents(self, documents: Documents, inputs: Tensor) -> None:
        """Refuse packed documents this model cannot honour, or that do not fit ``inputs`` (eager calls)."""
        if torch.compiler.is_compiling() or torch.compiler.is_exporting():
            return
        check_documents(documents, inputs.shape[0], inputs.shape[1], inputs.device)
        if self.head_kind == "classifier":
            raise ShapeError("a classifier head pools over the whole row: give one sequence per row, not packed "
                             "documents")
        refusing = sorted({block.mixer.kind for block in [*self.blocks, *self.shared_blocks.values()]
                           if not block.mixer.takes_documents})
        if refusing:
            raise ShapeError(f"the {', '.join(refusing)} mixer(s) do not take packed documents (their family does not "
                             "set `takes_documents`); give one sequence per row")

    def embedded(self, inputs: Tensor, documents: Documents | None = None) -> Tensor:
        """The first block's input: ``inputs``' embeddings (B, L, d_model), with learned or sinusoidal positions
        where the spec adds them (restarting at each packed document)."""
        return self.position.embed(self._embedded(inputs), 0 if documents is None else documents.positions)

    def _embedded(self, inputs: Tensor) -> Tensor:
        """Token embeddings times the input's ``scale``, through its ``norm`` (feature inputs: their projection)."""
        x = self.embed(inputs)
        x = x if self.embedding_scale == 1.0 else x * self.embedding_scale
        return x if self.embed_norm is None else self.embed_norm(x)

    def _head(self, x: Tensor) -> Tensor:
        if self.head_kind == "lm":
            logits = x @ self.embed.weight.T if self.head is None else self.head(x)
            logits = logits if self.head_bias is None else logits + self.head_bias
            logits = logits if self.head_scale == 1.0 else logits * self.head_scale
            return logits if self.softcap is None else self.softcap * torch.tanh(logits / self.softcap)
        if self.head_kind == "classifier":
            pooled = x.mean(dim=1) if self.pooling == "mean" else x[:, -1]
            return self.head(pooled)
        return x

    def init_state(self, batch: int, capacity: int | None = None) -> tuple[Tensor, ...]:
        """The decoding state: (position (B,) int64, then every mixer's state tensors in order).

        ``capacity``: the positions this generation will reach (prompt and new tokens); full key/value
        caches (and kept inputs) are sized to it rather than to ``max_len``, so nothing longer is
        allocated or read. Windows and recurrent states have their one size. Raises ShapeError, before
        allocating, where it would exceed ``MAX_DECODE_STATE_BYTES``."""
        self.check_decode_state(batch)
        self.state_layout()  # counted here, eagerly: a compiled step would otherwise count it once and recompile
        return self._init_state(batch, self.embed.weight.device, self._checked_capacity(capacity, 0))

    @property
    def state_dtype(self) -> torch.dtype:
        """The decoding state's dtype: the parameters', but float32 in a bfloat16 or float16 model (recurrent
        states sum over every step and the kernels read caches in float32: FLA keeps its states so too)."""
        dtype = self.embed.weight.dtype
        return torch.float32 if dtype in HALF else dtype

    def _init_state(self, batch: int, device, capacity: int | None = None) -> tuple[Tensor, ...]:
        dtype = self.state_dtype
        tensors = [torch.zeros(batch, dtype=torch.long, device=device)]
        for block in self.blocks:
            tensors.extend(block.init_state(batch, dtype, device, capacity))
        return tuple(tensors)

    def _checked_capacity(self, capacity: int | None, length: int) -> int | None:
        """``capacity`` refused unless None or an integer of at least ``length`` and 1 (eager calls)."""
        if capacity is None or torch.compiler.is_compiling() or torch.compiler.is_exporting():
            return capacity
        if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < max(length, 1):
            raise ShapeError(f"capacity must be an integer of at least the prompt's length ({max(length, 1)}): the "
                             f"positions the generation reaches; got {shorten(capacity)}")
        return capacity

    def state_signature(self) -> list[tuple[tuple[int, ...], torch.dtype]]:
        """(shape without the batch, dtype) of every tensor of :meth:`init_state`, found on the meta
        device: nothing is allocated. Empty for a model without a decoding step."""
        if not self.has_step:
            return []
        return [(tuple(t.shape[1:]), t.dtype) for t in self._init_state(1, torch.device("meta"))]

    def capacity_axes(self) -> list[int | None]:
        """For every tensor of :meth:`state_signature`, the axis of its shape (batch excluded) sized to a
        generation's capacity (full key/value caches, kept inputs: :meth:`init_state`'s ``capacity``), or
        None for a tensor of one size (positions, windows, recurrent states). Found by making the state on
        the meta device at two capacities and comparing, once: the structure fixes them (and found while
        tracing, the meta tensors would stay in the program). An exported program takes these axes as dynamic."""
        if self._capacity_axes is None:
            signature = self.state_signature()
            axes = [None] * len(signature)
            if self.decode_limit is not None and self.spec.max_len >= 3:
                capacity = self.spec.max_len - 1
                smaller = self._init_state(1, torch.device("meta"), capacity)
                for index, ((shape, _), tensor) in enumerate(zip(signature, smaller)):
                    differing = [axis for axis, (n, m) in enumerate(zip(shape, tensor.shape[1:])) if n != m]
                    if len(differing) > 1 or any(tensor.shape[1 + axis] != capacity for axis in differing):
                        raise AssertionError(f"a decoding state tensor {shape} does not hold the capacity on one axis")
                    axes[index] = differing[0] if differing else None
            self._capacity_axes = axes
        return self._capacity_axes

    def capacity_of(self, state: tuple[Tensor, ...]) -> int | None:
        """The capacity the decoding ``state`` was made with (the positions its full caches hold), or None for
        a state of one size whatever the generation (no full cache)."""
        for tensor, axis in zip(state, self.capacity_axes()):
            if axis is not None:
                return tensor.shape[1 + axis]
        return None

    def decode_state_bytes(self) -> int:
        """Bytes of one sequence's decoding state at its capacity (key/value caches of ``max_len`` or
        the window, recurrent states)."""
        return sum(math.prod(shape) * torch.empty((), dtype=dtype).element_size()
                   for shape, dtype in self.state_signature())

    def check_decode_state(self, batch: int) -> None:
        """Refuse a decoding state of ``batch`` rows over ``limits.MAX_DECODE_STATE_BYTES``, naming what
        to lower (eager calls only: a traced program's state is its caller's)."""
        if torch.compiler.is_compiling() or torch.compiler.is_exporting():
            return
        if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
            raise ShapeError(f"the batch must be a positive integer, got {batch!r}")
        per_row = self.decode_state_bytes()
        if batch * per_row > limits.MAX_DECODE_STATE_BYTES:
            raise ShapeError(f"the decoding state of {batch} sequence(s) is {batch * per_row / 2 ** 30:,.1f} GiB "
                             f"({per_row / 2 ** 30:,.2f} GiB each: caches of max_len = {self.spec.max_len} or the "
                             f"window, and recurrent states), over the limit of "
                             f"{limits.MAX_DECODE_STATE_BYTES / 2 ** 30:,.0f} GiB; lower max_len or the batch")

    def state_size(self, length: int) -> int:
        """Numbers one sequence carries from its past at ``length``, over every block (Zoology's
        "state size": a recurrent state, or a key-value cache that grows with the length)."""
        return sum(block.state_size(length) for block in self.blocks)

    def state_layout(self) -> list[int]:
        """How many tensors each block's state has (the flat state splits by these counts). Counted once, on
        the meta device, and kept: the structure fixes it, and every decoding step reads it."""
        if self._state_layout is None:
            meta = torch.device("meta")
            self._state_layout = [len(block.init_state(1, self.state_dtype, meta)) for block in self.blocks]
        return self._state_layout

    def prefill(self, tokens: Tensor, last_only: bool = False, capacity: int | None = None,
                into: tuple[Tensor, ...] | None = None) -> tuple[Tensor, ...]:
        """A prompt in one pass: ``tokens`` (B, L) -> (logits (B, L, vocab), *state after position L - 1);
        with ``last_only`` the logits of the last position alone, (B, 1, vocab) (what generation reads: the
        head over every prompt position would cost L times as much). ``capacity`` (>= L): the positions
        the generation reaches; full caches are sized to it (:meth:`init_state`), else to ``max_len``.
        ``into``: a state of B rows from :meth:`init_state` to write the state into, in place, and return
        (its full caches give the capacity): how an exported prefill takes the generation's capacity, from
        the state its caller allocated once for the generation.

        Each mixer runs its planned full-sequence mode and hands over the state its decoding step
        continues from (recurrent states from the op's final state, caches filled from the keys and
        values); equal to stepping through the prompt (tests check it).
        """
        if not self.has_step:
            raise ShapeError("this model has no decoding step: prefill needs a causal token model with an lm head")
        self.check_inputs(tokens)
        self.check_decode_state(tokens.shape[0])
        if into is not None:
            if capacity is not None:
                raise ShapeError("give prefill a capacity or a state to write into (which has one), not both")
            into = tuple(into)
            self._check_into(into, tokens.shape[0])
            capacity = self.capacity_of(into)
        x = embeddings = self.position.embed(self._embedded(tokens))
        state: list[Tensor] = [torch.full((tokens.shape[0],), tokens.shape[1], dtype=torch.long, device=tokens.device)]
        tracing = torch.compiler.is_compiling() or torch.compiler.is_exporting()
        capacity = self._checked_capacity(capacity, tokens.shape[1])
        if torch.compiler.is_exporting() and capacity is not None:  # the capacity is the caller's: checked on data
            torch._assert_async((state[0] <= capacity).all(), "the prompt is longer than the decoding state's "
                                "capacity (the positions its caches hold); allocate the state for the prompt and "
                                "the tokens to generate")
        lent: dict[int, tuple[Tensor, Tensor]] = {}  # block index -> the keys and values it lends (forward's)
        for index, (block, source) in enumerate(zip(self.blocks, self.kv_sources)):
            sharing = {} if source is None else {"kv": lent[source]}
            if index in self.kv_lenders:
                x, block_state, lent[index] = block.prefill(x, embeddings, capacity, lend=True, **sharing)
            else:
                x, block_state = block.prefill(x, embeddings, capacity, **sharing)
            # contiguous (conv windows are slices, recurrent states transposes): a compiled step package
            # reads its state with the strides it was traced with. Traced, a copy: .contiguous() would
            # guard on the batch (a size-1 batch is contiguous either way). Written into a given state, its
            # layout is the given one's
            state.extend(t if into is not None else t.clone(memory_format=torch.contiguous_format) if tracing
                         else t.contiguous() for t in block_state)
        if into is not None:
            for given, computed in zip(into, state):
                given.copy_(computed)
            state = list(into)
        return (self._head(self.final_norm(x[:, -1:] if last_only else x)), *state)

    def _check_into(self, into: tuple[Tensor, ...], batch: int) -> None:
        """Refuse a state to write into that is not :meth:`init_state`'s for ``batch`` rows at some capacity:
        count, shapes, dtypes, device (eager calls: ``copy_`` would broadcast a row into many, or convert
        silently)."""
        if torch.compiler.is_compiling() or torch.compiler.is_exporting():
            return
        signature = self.state_signature()
        if len(into) != len(signature) or not all(isinstance(t, Tensor) for t in into):
            raise ShapeError(f"the state to write into must be this model's {len(signature)} tensors (init_state), "
                             f"got {len(into)} {'tensors' if all(isinstance(t, Tensor) for t in into) else 'values'}")
        device = self.embed.weight.device
        expected = self._init_state(batch, torch.device("meta"), self.capacity_of(into))
        for index, (given, want) in enumerate(zip(into, expected)):
            if (given.shape, given.dtype, given.device) != (want.shape, want.dtype, device):
                raise ShapeError(f"state tensor {index} to write into is {given.dtype} {tuple(given.shape)} on "
                                 f"{given.device}; the prompts need {want.dtype} {tuple(want.shape)} on {device} "
                                 "(init_state(batch, capacity))")

    def step(self, token: Tensor, *state: Tensor) -> tuple[Tensor, ...]:
        """One decoding step: ``token`` (B,) int64 and the flat state -> (logits (B, vocab), *state).

        The state is updated in place and returned as the same tensors (key/value caches are written
        where they are, a block's new recurrent state is copied into its old one), so decoding allocates
        nothing the size of a cache per token. Equals ``forward`` on the whole prefix at the last
        position (tests check it).
        """
        self.check_inputs(token, per_position=False)
        position, rest = state[0], list(state[1:])
        self._check_position(position)
        if torch.compiler.is_exporting():  # every capacity axis is one size (export_step gives them one Dim):
            capacity = self.capacity_of(state)  # said first, a trace derives a capacity's values once (per_step)
            for tensor, axis in zip(state, self.capacity_axes()):
                if axis is not None:
                    torch._check(tensor.shape[1 + axis] == capacity)
        x = embeddings = self.position.embed(self._embedded(token).unsqueeze(1), position).squeeze(1)
        lent: dict[int, tuple[Tensor, Tensor]] = {}  # block index -> its key/value cache, for the blocks that read it
        with one_step():  # what every block derives alike from the position, derived once (ops.per_step)
            for index, (block, count, source) in enumerate(zip(self.blocks, self.state_layout(), self.kv_sources)):
                block_state, rest = tuple(rest[:count]), rest[count:]
                sharing = {} if source is None else {"kv": lent[source]}
                x, new_state = block.step(x, block_state, position, embeddings, **sharing)
                for old, new in zip(block_state, new_state):
                    if new is not old:  # a state the block computed afresh (recurrent states, convolution windows)
                        old.copy_(new)
                if index in self.kv_lenders:  # its attention's cache comes first, written in place this step
                    lent[index] = block_state[:2]
        position.add_(1)
        return (self._head(self.final_norm(x)), *state)

    def _check_position(self, position: Tensor) -> None:
        """Refuse a step at a position past :attr:`decode_limit` (a full cache would wrap into a silent
        sliding window, a position table would be read out of range): a ShapeError in eager code, and
        in an exported step a data-dependent assertion that raises when the program runs."""
        limit = self.decode_limit
        if limit is None:
            return
        message = (f"decoding past max_len = {limit}: this model's key/value caches (or position table) hold "
                   f"{limit} positions; raise max_len, or give attention a window")
        if torch.compiler.is_exporting():
            torch._assert_async((position < limit).all(), message)
        elif not torch.compiler.is_compiling() and position.numel() and int(position.max()) >= limit:
            raise ShapeError(f"{message} (position {int(position.max())})")

    def regularization_loss(self) -> Tensor:
        """Sum of the orthogonality regularisers of the trainable kernels (add it to the training loss)."""
        blocks = [*self.blocks, *self.shared_blocks.values()]
        terms = [t for block in blocks if (t := block.mixer.regularization_loss()) is not None]
        if not terms:
            return torch.zeros((), dtype=self.embed.weight.dtype, device=self.embed.weight.device)
        return torch.stack(terms).sum()

    def moe_aux_loss(self) -> Tensor | None:
        """The mean load-balancing loss of the mixture-of-experts MLPs over their last call
        (:class:`attnspec.nn.channel.MoeMlp`), or None when the model has none."""
        runs = [*self.blocks, *(block.shared_use.tied_view for block in self.blocks if block.shared_use is not None)]
        mlps = [block.mlp for block in runs if block.mlp is not None]
        terms = [mlp.aux_loss for mlp in mlps if mlp.aux_loss is not None]
        return torch.stack(terms).mean() if terms else None

    def set_modes(self, modes: list[str]) -> None:
        """Set each block's full-sequence mode (the compiler's plan). The kernel that runs it is chosen
        at each call by the kernels' predicates (:mod:`attnspec.ops.kernels`), the ones the plan asked."""
        for block, mode in zip(self.blocks, modes):
            block.mixer.mode = mode


def initialise(model: Model, init) -> None:
    """Redraw the initial weights the spec's ``init`` asks for (:class:`~attnspec.spec.ir.Init`); at its
    defaults nothing is drawn again, so PyTorch's own initialisation stands."""
    if model.token_input and (init.embedding_std != 1.0 or init.distribution != "normal"):
        _draw(model.embed.weight, init.embedding_std, init.distribution)
    for block in [*model.shared_blocks.values(), *model.blocks]:  # a shared block's weights once (its uses tie them)
        if init.projection_std is not None:
            for projections, init_scale in block.mixer.projection_groups():
                _draw_projections(projections, init.projection_std * init_scale, init.distribution)
            _draw_projections(block.mlp.projections() if block.mlp is not None else [], init.projection_std,
                              init.distribution)
            if block.shared_use is not None and block.shared_use.proj is not None:
                _draw_projections([block.shared_use.proj], init.projection_std, init.distribution)
        if init.residual_scaling:  # GPT-2: the residual stream's variance stays O(1) over 2 * blocks sums
            writers = block.mixer.residual_writers() if block.norm1 is not None else []  # `mixer: none`: nothing
            writers += block.mlp.residual_writers() if block.mlp is not None else []
            with torch.no_grad():
                for weight in writers:
                    weight.mul_(1.0 / math.sqrt(2 * len(model.blocks)))


def _draw(weight: torch.Tensor, std: float, distribution: str) -> None:
    """Fill ``weight`` from ``distribution`` at ``std`` (the parameter of the normal ones, the exact std
    of the uniform one)."""
    if distribution == "normal":
        nn.init.normal_(weight, 0.0, std)
    elif distribution == "truncated_normal":
        nn.init.trunc_normal_(weight, 0.0, std, -3.0 * std, 3.0 * std)
    else:
        bound = math.sqrt(3.0) * std
        nn.init.uniform_(weight, -bound, bound)


def _draw_projections(projections: list[nn.Linear], std: float, distribution: str) -> None:
    for projection in projections:
        _draw(projection.weight, std, distribution)
        if projection.bias is not None:
            nn.init.zeros_(projection.bias)


def redraw_random_features(model: nn.Module, step: int) -> int:
    """Redraw Performer projections whose spec says ``redraw: interval`` when ``step`` is a multiple of it.

    Call it from the training loop once per optimiser step. Returns how many were redrawn.
    """
    count = 0
    for module in model.modules():
        if isinstance(module, PerformerFeatures) and module.redraw_interval and step % module.redraw_interval == 0:
            module.redraw(step)
            count += 1
    return count


def build_model_from_spec(spec, *, empty: bool = False) -> Model:
    """Instantiate the model of a resolved spec, deterministically from ``spec.seed``.

    ``empty``: parameters on the meta device (no memory, no initialisation: a model whose every parameter
    comes from a weights file, which :func:`attnspec.compiler.load.load_weights` then assigns); buffers
    (fixed tables, random projections) are made as usual, and the file's persistent ones replace them."""
    state = torch.random.get_rng_state()
    torch.manual_seed(spec.seed)
    try:
        with parameters_on_meta() if empty else contextlib.nullcontext():
            model = Model(spec)
    finally:
        torch.random.set_rng_state(state)
    return cast_parameters(model, spec)


@contextlib.contextmanager
def parameters_on_meta() -> Iterator[None]:
    """Modules made inside put each parameter on the meta device as it is registered (as accelerate's
    ``init_empty_weights``): a 7B model takes no memory and no initialisation time until its weights are
    assigned (a parameter a module draws itself before registering it, a few per block, is drawn and
    dropped). Only parameters: buffers are computed as usual (they are small, and some are not in any
    weights file). The initialisers then run on meta parameters, and do nothing (:func:`meta_values_skipped`).
    It patches ``nn.Module.register_parameter`` for its duration: one thread at a time."""
    register = nn.Module.register_parameter

    def on_meta(module: nn.Module, name: str, parameter) -> None:
        if parameter is not None and parameter.device.type != "meta":
            parameter = nn.Parameter(parameter.detach().to("meta"), requires_grad=parameter.requires_grad)
        register(module, name, parameter)

    nn.Module.register_parameter = on_meta
    try:
        with meta_values_skipped():
            yield
    finally:
        nn.Module.register_parameter = register


@contextlib.contextmanager
def meta_values_skipped() -> Iterator[None]:
    """Inside, a meta tensor's in-place value methods (``normal_``, ``uniform_``, ``fill_``, ``copy_``, ...)
    return it unchanged (a meta tensor holds no values), and the meta arithmetic of initialisers
    (``1 - a``, ``arange``, ``randn(...) / s``) runs without importing torch's compiler.

    Why: torch computes many ops on meta tensors with its Python reference kernels, each wrapped to be
    skipped by Dynamo, and the wrapper imports ``torch._dynamo`` on its first call (2-4 s of a ``load``,
    ``run`` or size check that compiles nothing) to ask it for the skipped version, which it caches on the
    kernel. Outside a compilation that version is the kernel itself, so while ``torch._dynamo`` is not
    imported yet, :class:`_DynamoStandIn` answers instead, and its answers are taken back on exit (a later
    compilation then wraps those kernels as torch does). Other tensors' methods are untouched. It patches
    ``torch.Tensor`` methods and ``sys.modules`` for its duration: one thread at a time, nothing compiling."""
    def skipped_on_meta(method):
        @functools.wraps(method)
        def in_place(self, *args, **kwargs):
            return self if self.is_meta else method(self, *args, **kwargs)
        return in_place

    methods = {name: getattr(torch.Tensor, name) for name in _IN_PLACE_METHODS}
    for name, method in methods.items():
        setattr(torch.Tensor, name, skipped_on_meta(method))
    stand_in = None if "torch._dynamo" in sys.modules else _DynamoStandIn()
    if stand_in is not None:
        sys.modules["torch._dynamo"] = stand_in
    try:
        yield
    finally:
        if stand_in is not None:
            stand_in.take_back()
        for name, method in methods.items():
            setattr(torch.Tensor, name, method)


class _DynamoStandIn(types.ModuleType):
    """``torch._dynamo`` as torch's reference kernels ask it while :func:`meta_values_skipped` holds: its
    ``disable(fn)`` is ``fn`` (what Dynamo's is outside a compilation), noted so that :meth:`take_back`
    removes what torch cached from it (``fn.__dynamo_disable``, torch/_compile.py) and the stand-in itself.
    Anything else asked of it (an attribute, or a submodule: it is a package to the import system, and the
    finder of its submodules while it holds) takes it back and gives the real module's."""

    def __init__(self):
        super().__init__("torch._dynamo")
        self.answered: list = []
        self.__path__: list[str] = []  # a package: ``import torch._dynamo.x`` asks :meth:`find_spec` below
        sys.meta_path.insert(0, self)

    def disable(self, fn, recursive=True, wrapping=True):
        self.answered.append(fn)
        return fn

    def __getattr__(self, name: str):
        """Anything else of ``torch._dynamo`` asked inside: the real module, imported now (slower, never wrong)."""
        if name.startswith("__"):
            raise AttributeError(name)
        self.take_back()
        return getattr(importlib.import_module("torch._dynamo"), name)

    def find_spec(self, name: str, path=None, target=None):
        """A submodule of ``torch._dynamo`` imported inside: the real one, under the real package."""
        if not name.startswith("torch._dynamo."):
            return None
        self.take_back()
        return importlib.util.spec_from_loader(name, _Imported(importlib.import_module(name)))

    def take_back(self) -> None:
        for fn in self.answered:
            if getattr(fn, "__dynamo_disable", None) is fn:
                delattr(fn, "__dynamo_disable")
        if self in sys.meta_path:
            sys.meta_path.remove(self)
        if sys.modules.get("torch._dynamo") is self:
            del sys.modules["torch._dynamo"]
        if torch.__dict__.get("_dynamo") is self:
            del torch._dynamo


class _Imported:
    """A loader of a module imported already (the import system then keeps that module)."""

    def __init__(self, module: types.ModuleType):
        self.module = module

    def create_module(self, spec) -> types.ModuleType:
        return self.module

    def exec_module(self, module) -> None:
        pass


_IN_PLACE_METHODS = tuple(name for name in dir(torch.Tensor) if name.endswith("_") and not name.startswith("_")
                          and name not in ("resize_", "resize_as_", "set_", "as_strided_", "requires_grad_",
                                           "share_memory_", "retain_grad_"))
"""``torch.Tensor``'s in-place value methods (``normal_``, ``copy_``, ``mul_``, ...): those that change a
tensor's values, not its shape, storage or autograd flags."""


def float32_names(model: nn.Module, spec) -> set[str]:
    """The parameters a bfloat16 or float16 ``model`` keeps in float32: those its modules declare
    (``float32_parameters``: the families' decays) and those ``spec.keep_float32`` names (shell patterns
    of parameter names). Empty for a float32 or float64 spec."""
    if spec.dtype not in ("bfloat16", "float16"):
        return set()
    kept = set()
    for prefix, module in model.named_modules():
        for name in getattr(module, "float32_parameters", ()):
            if isinstance(getattr(module, name, None), nn.Parameter):
                kept.add(f"{prefix}.{name}" if prefix else name)
    patterns = spec.keep_float32
    for prefix, module in model.named_modules():
        for name, _ in module.named_parameters(prefix=prefix, recurse=False):
            if not any(fnmatch.fnmatchcase(name, pattern) for pattern in patterns):
                continue
            if isinstance(module, (nn.Linear, nn.Embedding)):  # its product would mix a float32 weight in
                raise SpecError(Problem(f"{shorten(name)} is a {type(module).__name__}'s parameter, which a "
                                        f"{spec.dtype} model multiplies in {spec.dtype}; name norms' weights and the "
                                        "families' elementwise parameters only", path="keep_float32"))
            kept.add(name)
    return kept


def cast_parameters(model: nn.Module, spec) -> nn.Module:
    """``model`` with its floating parameters in ``spec.dtype``, but :func:`float32_names` in float32 (each
    converted once from its float32 initialisation); buffers (random projections, hashes, fixed tables)
    stay float32 in a half-precision model, where the parts that read them compute. Returns ``model``."""
    dtype = DTYPES[spec.dtype]
    if dtype not in HALF:
        return model.to(dtype)
    kept = float32_names(model, spec)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if parameter.is_floating_point():
                parameter.data = parameter.data.to(torch.float32 if name in kept else dtype)
    return model
