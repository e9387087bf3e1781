"""An import checked against transformers: both models on one short prompt, as ``import-hf`` shows it.

The truth for an imported checkpoint is what transformers computes from it. After ``import-hf`` builds a
directory, :func:`check_import` loads the checkpoint with transformers (when it is installed; safetensors
only, no remote code, nothing downloaded) in the build's dtype, runs both models on the same prompt of
:data:`PROMPT_TOKENS` tokens, and reports the largest logit difference (absolute, and relative to the
largest logit) and whether :data:`NEW_TOKENS` greedy tokens agree. It costs one transformers load and a
short generation: seconds at 135M parameters, and it is the whole model at its real size, where
attnspec's own float64 verification is per distinct block. ``import-hf`` runs attnspec's side
(:func:`our_side`) and transformers' import while its compile check runs, and transformers' model
(:func:`compare`) once the build's model is dropped: the two models are never held at once.
"""

from __future__ import annotations

import os
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from attnspec.errors import shorten
from attnspec.interop.checkpoint import open_checkpoint

PROMPT_TOKENS = 8
NEW_TOKENS = 8


@dataclass
class ImportCheck:
    """What :func:`check_import` found. ``skipped``: why nothing was compared (None when it ran)."""

    skipped: str | None = None
    max_logit_diff: float | None = None
    relative_logit_diff: float | None = None
    tokens_agree: int | None = None
    """Of the :data:`NEW_TOKENS` greedy tokens, how many agree before the first that differs."""
    new_tokens: int = NEW_TOKENS
    dtype: str | None = None

    @property
    def agrees(self) -> bool:
        return self.skipped is None and self.tokens_agree == self.new_tokens

    def to_json(self) -> dict:
        return asdict(self)

    def summary(self) -> str:
        """One line: the logit difference and the greedy tokens, or why the check was skipped."""
        if self.skipped is not None:
            return f"not checked against transformers: {self.skipped}"
        tokens = "agree" if self.agrees else f"differ from token {self.tokens_agree + 1}"
        if not self.agrees and self.dtype in ("bfloat16", "float16"):  # each model rounds its own way there
            tokens += (f" (in {self.dtype} both models round, and near-equal top logits can swap: "
                       "`--dtype float32` compares them exactly)")
        return (f"checked against transformers ({self.dtype}, {PROMPT_TOKENS}-token prompt): largest logit difference "
                f"{self.max_logit_diff:.2e} ({self.relative_logit_diff:.2%} of the largest logit); {self.new_tokens} "
                f"greedy tokens {tokens}")


@dataclass
class Ours:
    """attnspec's side of the comparison: the prompt (1, PROMPT_TOKENS), its logits (1, PROMPT_TOKENS, vocab) in
    float32, the greedy tokens after it (NEW_TOKENS,), and the parameters' dtype."""

    prompt: torch.Tensor
    logits: torch.Tensor
    tokens: torch.Tensor
    dtype: torch.dtype


def our_side(model) -> Ours | ImportCheck:
    """Run the imported model (an attnspec model that decodes) on the check's prompt; an :class:`ImportCheck`
    saying why not where it cannot be compared. Its logits are float32 whatever the model's dtype."""
    if not model.has_step:
        return ImportCheck(skipped="the model does not decode")
    prompt = torch.randint(0, model.spec.input.vocab_size, (1, PROMPT_TOKENS),
                           generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        logits = model(prompt).float()
        tokens = model.generate(prompt, NEW_TOKENS, temperature=0.0)[0, PROMPT_TOKENS:]
    return Ours(prompt, logits, tokens, model.embed.weight.dtype)


def _source(checkpoint) -> tuple[str, dict]:
    """What transformers' ``from_pretrained`` takes for ``checkpoint`` (a path, or one opened by
    :func:`~attnspec.interop.checkpoint.open_checkpoint`): the directory, and ``gguf_file`` for a GGUF file
    (transformers reads and dequantises GGUF itself: the check is against its reading, not attnspec's)."""
    opened = open_checkpoint(checkpoint) if isinstance(checkpoint, (str, Path)) else checkpoint
    if opened.gguf:
        return str(opened.gguf.parent), {"gguf_file": opened.gguf.name}
    return str(opened.path), {"use_safetensors": True}


def import_transformers(checkpoint) -> str | None:
    """Import transformers and the modelling module of ``checkpoint``'s type (seconds of Python, which
    ``import-hf`` spends while its compile check runs); why not, where it cannot (not installed)."""
    try:
        import transformers
    except ImportError:
        return "transformers is not installed (the `hf` extra); `--no-check` says so quietly"
    try:  # the class's module is imported lazily by the mapping; its failure is from_pretrained's to report
        directory, options = _source(checkpoint)
        options.pop("use_safetensors", None)
        config = transformers.AutoConfig.from_pretrained(directory, local_files_only=True, trust_remote_code=False,
                                                         **options)
        transformers.AutoModelForCausalLM._model_mapping[type(config)]
    except Exception:  # noqa: BLE001 - transformers' own failure is reported by the comparison
        pass
    return None


def _return_freed_memory() -> None:
    """Collect garbage and hand glibc's freed heap back to the system (``malloc_trim``), so the check's peak is
    transformers' model on top of what attnspec still holds, not of what it held. Elsewhere a no-op."""
    import ctypes
    import gc

    gc.collect()
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL("libc.so.6").malloc_trim(0)
        except (OSError, AttributeError):  # another C library (musl): nothing to trim
            pass


def compare(checkpoint, ours: Ours | ImportCheck) -> ImportCheck:
    """transformers' model of ``checkpoint`` in ``ours``' dtype against ``ours`` (:func:`our_side`: attnspec's
    model need not be held while transformers' is). Never raises for transformers' sake: a checkpoint it
    cannot load (not installed, no causal-LM class for the type, its own error) is reported as skipped."""
    missing = import_transformers(checkpoint)
    if missing is not None:
        return ImportCheck(skipped=missing)
    if isinstance(ours, ImportCheck):
        return ours
    import transformers

    from attnspec.interop.registry import wrappers

    opened = open_checkpoint(checkpoint) if isinstance(checkpoint, (str, Path)) else checkpoint
    wrapper = wrappers().get(opened.config.get("model_type"))
    loader = getattr(transformers, wrapper.oracle) if wrapper is not None and wrapper.oracle else \
        transformers.AutoModelForCausalLM
    directory, options = _source(opened)
    _return_freed_memory()  # what attnspec's side freed goes back to the system before transformers' model comes
    quiet = os.environ.get("TQDM_DISABLE")
    os.environ["TQDM_DISABLE"] = "1"  # transformers' GGUF reader draws its own progress bar; import-hf draws stages
    try:
        theirs = loader.from_pretrained(directory, dtype=ours.dtype, local_files_only=True, trust_remote_code=False,
                                        **options)
    except Exception as error:  # noqa: BLE001 - transformers' own failure is a reason, not a crash
        return ImportCheck(skipped=f"transformers could not load it as a causal LM ({type(error).__name__}: "
                                   f"{shorten(str(error), 160)})")
    finally:
        if quiet is None:
            os.environ.pop("TQDM_DISABLE", None)
        else:
            os.environ["TQDM_DISABLE"] = quiet
    theirs.eval()
    prompt = ours.prompt
    try:
        with torch.no_grad():
            their_logits = theirs(prompt).logits.float()
            # an explicit mask: without one transformers masks every prompt token equal to the pad id
            their_tokens = theirs.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=NEW_TOKENS,
                                           do_sample=False, min_new_tokens=NEW_TOKENS, eos_token_id=None,
                                           pad_token_id=0)[0, PROMPT_TOKENS:]
    except Exception as error:  # noqa: BLE001 - transformers' model failing on a text prompt is its own (Llama 4's)
        return ImportCheck(skipped=f"transformers' {type(theirs).__name__} failed on a text prompt "
                                   f"({type(error).__name__}: {shorten(str(error), 160)})")
    difference = (ours.logits - their_logits[..., :ours.logits.shape[-1]]).abs().max().item()
    agree = next((i for i, (a, b) in enumerate(zip(ours.tokens.tolist(), their_tokens.tolist())) if a != b),
                 min(len(ours.tokens), len(their_tokens)))
    return ImportCheck(max_logit_diff=difference, tokens_agree=agree, dtype=str(ours.dtype).removeprefix("torch."),
                       relative_logit_diff=difference / max(their_logits.abs().max().item(), 1e-30))


def check_import(checkpoint, load_model) -> ImportCheck:
    """Compare the imported model (``load_model()`` makes it: an attnspec model of the build) with
    transformers' own model of ``checkpoint`` (module docstring). The two are never held at once: ours runs
    and is dropped before transformers loads (:func:`our_side`, then :func:`compare`)."""
    missing = import_transformers(checkpoint)
    if missing is not None:
        return ImportCheck(skipped=missing)
    return compare(checkpoint, our_side(load_model()))


__all__ = ["ImportCheck", "Ours", "check_import", "compare", "import_transformers", "our_side", "NEW_TOKENS",
           "PROMPT_TOKENS"]
