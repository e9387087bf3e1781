"""``attnspec run``: run an exported model, and generate greedily with the exported decoding step.

Only the exported programs (``model.pt2``, ``step.pt2``) and the manifest are used, as a user
without attnspec would, loaded through :func:`~attnspec.compiler.programs.load_program` (no pickle).
"""

from __future__ import annotations

from pathlib import Path

import torch

from attnspec.compiler.manifest import read_manifest
from attnspec.compiler.programs import load_program
from attnspec.errors import AttnSpecError, BuildError, shorten

MAX_TOKEN_TEXT = 1 << 20
MAX_GENERATE = 1 << 16


def parse_tokens(text: str, vocab_size: int | None = None, max_len: int | None = None) -> list[int]:
    """``"1 2 3"`` (spaces or commas) -> [1, 2, 3], checked against the vocabulary and ``max_len``."""
    if len(text) > MAX_TOKEN_TEXT:
        raise AttnSpecError(f"--tokens is {len(text):,} characters; the limit is {MAX_TOKEN_TEXT:,}")
    parts = text.replace(",", " ").split()
    if not parts:
        raise AttnSpecError("--tokens is empty; give at least one token id")
    if max_len is not None and len(parts) > max_len:
        raise AttnSpecError(f"{len(parts)} tokens exceed the model's max_len = {max_len}")
    tokens = []
    for part in parts:
        if not (part.isascii() and part.isdigit()):
            raise AttnSpecError(f"--tokens must be non-negative integers separated by spaces, e.g. \"1 2 3\"; got "
                                f"{shorten(part)}")
        if len(part) > 12 or (vocab_size is not None and int(part) >= vocab_size):
            raise AttnSpecError(f"token ids must be in [0, {vocab_size}); got {shorten(part)}")
        tokens.append(int(part))
    return tokens


def greedy_generate(step_program, state_signature: list, prompt: list[int], count: int) -> list[int]:
    """Feed ``prompt`` through the exported step, then append ``count`` argmax tokens."""
    state = [torch.zeros(1, *entry.shape, dtype=getattr(torch, entry.dtype)) for entry in state_signature]
    step = step_program.module()
    logits = None
    with torch.no_grad():
        for token in prompt:
            logits, *state = step(torch.tensor([token]), *state)
        generated = []
        for _ in range(count):
            token = int(logits[0].argmax())
            generated.append(token)
            logits, *state = step(torch.tensor([token]), *state)
    return generated


def run_directory(directory: Path | str, tokens: str, generate: int = 0) -> str:
    """Run ``model.pt2`` on ``tokens`` and report the next-token prediction; with ``generate``, decode
    greedily with ``step.pt2``. Returns the text to print.

    ``model.pt2`` takes sequences of 2 or more positions (a dynamic length of 1 would need guards
    torch cannot drop); a one-token prompt runs as that token followed by token 0, and position 0 is
    read, which is exact because every mixer of a runnable model is causal (position 0 sees only
    itself). Non-causal models refuse one-token prompts.
    """
    directory = Path(directory)
    manifest = read_manifest(directory)
    if manifest.input != "tokens":
        raise BuildError(f"{directory} takes real-valued features, not tokens; load model.pt2 with "
                         "torch.export.load and call it on a (batch, length, dim) tensor")
    if not 0 <= generate <= MAX_GENERATE:
        raise AttnSpecError(f"--generate must be between 0 and {MAX_GENERATE}, got {generate}")
    prompt = parse_tokens(tokens, manifest.vocab_size, manifest.max_len)
    per_position = manifest.head != "classifier"
    if len(prompt) == 1 and not (manifest.causal and per_position):
        raise AttnSpecError(f"{directory} holds a non-causal or classifier model, whose exported program takes at "
                            "least 2 tokens; give a longer prompt")
    program = load_program(directory / "model.pt2")
    inputs = prompt if len(prompt) > 1 else prompt + [0]
    with torch.no_grad():
        try:
            output = program.module()(torch.tensor([inputs]))
        except Exception as error:  # noqa: BLE001 - a program that fails on valid input is a damaged build
            raise BuildError(f"{directory}/model.pt2 failed on the tokens ({type(error).__name__}: "
                             f"{shorten(str(error), 160)}); rebuild the directory") from None
    last = len(prompt) - 1
    lines = [f"input: {' '.join(map(str, prompt))}"]
    if manifest.head == "lm":
        lines.append(f"next token (argmax): {int(output[0, last].argmax())}")
    elif manifest.head == "classifier":
        lines.append(f"output: {output[0].tolist()}")
    else:
        lines.append(f"output: hidden states {tuple(output[0, : last + 1].shape)}")
    if generate:
        if not manifest.has_step or manifest.export.step is None:
            raise BuildError(f"{directory} has no step.pt2 (a mixer without a recurrent form, or not a token LM); "
                             "generation needs the constant-size decoding state")
        step = load_program(directory / "step.pt2")
        try:
            generated = greedy_generate(step, manifest.export.step.state, prompt, generate)
        except Exception as error:  # noqa: BLE001 - a step program that fails on its own state is damaged
            raise BuildError(f"{directory}/step.pt2 failed to decode ({type(error).__name__}: "
                             f"{shorten(str(error), 160)}); rebuild the directory") from None
        lines.append(f"generated: {' '.join(map(str, generated))}")
    return "\n".join(lines)
