"""``attnspec run``: run an exported model, and generate greedily with the exported decoding step.

Only the exported programs (``model.pt2``, ``step.pt2``) and the manifest are used, as a user
without attnspec would.
"""

from __future__ import annotations

from pathlib import Path

import torch

from attnspec.compiler.load import read_manifest
from attnspec.errors import AttnSpecError, BuildError


def parse_tokens(text: str, vocab_size: int | None = None) -> list[int]:
    """``"1 2 3"`` (spaces or commas) -> [1, 2, 3], checked against the vocabulary."""
    try:
        tokens = [int(part) for part in text.replace(",", " ").split()]
    except ValueError:
        raise AttnSpecError(f"--tokens must be integers separated by spaces, e.g. \"1 2 3\"; got {text!r}") from None
    if not tokens:
        raise AttnSpecError("--tokens is empty; give at least one token id")
    bad = [t for t in tokens if t < 0 or (vocab_size is not None and t >= vocab_size)]
    if bad:
        raise AttnSpecError(f"token ids must be in [0, {vocab_size}); got {bad[:5]}")
    return tokens


def greedy_generate(step_program, state_signature: list[dict], prompt: list[int], count: int) -> list[int]:
    """Feed ``prompt`` through the exported step, then append ``count`` argmax tokens."""
    state = [torch.zeros(1, *entry["shape"], dtype=getattr(torch, entry["dtype"])) for entry in state_signature]
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
    greedily with ``step.pt2``. Returns the text to print."""
    directory = Path(directory)
    manifest = read_manifest(directory)
    if manifest["input"] != "tokens":
        raise BuildError(f"{directory} takes real-valued features, not tokens; load model.pt2 with "
                         "torch.export.load and call it on a (batch, length, dim) tensor")
    program = torch.export.load(str(directory / "model.pt2"))
    prompt = parse_tokens(tokens, None)
    if len(prompt) > manifest["max_len"]:
        raise AttnSpecError(f"{len(prompt)} tokens exceed the model's max_len = {manifest['max_len']}")
    with torch.no_grad():
        try:
            output = program.module()(torch.tensor([prompt if len(prompt) > 1 else prompt * 2]))
        except (RuntimeError, IndexError) as error:
            raise AttnSpecError(f"the model rejected the tokens (out of vocabulary?): {error}") from None
    lines = [f"input: {' '.join(map(str, prompt))}"]
    if manifest["head"] == "lm":
        lines.append(f"next token (argmax): {int(output[0, -1].argmax())}")
    else:
        lines.append(f"output: {output[0].tolist() if output.dim() == 2 else tuple(output.shape)}")
    if generate:
        if not manifest.get("has_step"):
            raise BuildError(f"{directory} has no step.pt2 (a mixer without a recurrent form, or not a token LM); "
                             "generation needs the constant-size decoding state")
        step = torch.export.load(str(directory / "step.pt2"))
        generated = greedy_generate(step, manifest["export"]["step.pt2"]["state"], prompt, generate)
        lines.append(f"generated: {' '.join(map(str, generated))}")
    return "\n".join(lines)
