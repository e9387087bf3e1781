"""``attnspec run``: predict the next token of a prompt, and generate with the decoding step.

By default the model is rebuilt from the directory's spec and weights (:func:`attnspec.compiler.load.load_model`,
the path ``attnspec.load`` takes): it starts in about two seconds, where loading ``model.pt2``
(a graph dynamic in the length) takes from one to over ten. ``--programs`` runs the exported programs
instead (``model.pt2``, ``step.pt2``), as a user without attnspec would, loaded through
:func:`~attnspec.compiler.archive.load_program` (no pickle). The build checked that both compute
the same function.
"""

from __future__ import annotations

from pathlib import Path

import torch

from attnspec.compiler.manifest import Manifest, read_manifest
from attnspec.compiler.archive import load_program
from attnspec.errors import AttnSpecError, BuildError, shorten
from attnspec.nn.generate import check_sampling

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


def _generate(directory: Path, name: str, step, state, prompt: list[int], count: int, sampling: dict,
              prefill=None, device=None) -> list[int]:
    """Feed ``prompt`` through ``prefill(tokens (1, T)) -> (logits, *state)`` where given (and the prompt
    has the 2 or more tokens a prefill program takes), else token by token through ``step(token (1,),
    *state) -> (logits (1, vocab), *state)`` from ``state`` (or the state a function of no arguments makes), and
    generate ``count`` tokens (:func:`attnspec.nn.generate.decode`, on ``device``)."""
    from attnspec.nn.generate import decode

    tokens = torch.tensor([prompt], device=device)
    try:
        out = decode(step, state, tokens, count, **sampling, prefill=prefill if len(prompt) > 1 else None)
    except AttnSpecError:
        raise
    except Exception as error:  # noqa: BLE001 - a step that fails on its own state is a damaged build
        raise BuildError(f"{directory}/{name} failed to decode ({type(error).__name__}: "
                         f"{shorten(str(error), 160)}); rebuild the directory") from None
    return out[0, len(prompt):].tolist()


StateFacts = list[tuple[tuple[int, ...], str, int | None]]
"""A step's state: (shape without the batch, dtype, capacity axis or None) per tensor."""


def decoding_facts(directory: Path, manifest: Manifest, model=None) -> tuple[int | None, StateFacts]:
    """(decode limit, the step's state as (shape without the batch, dtype, capacity axis) per tensor
    (:func:`~attnspec.compiler.load.decoding_state`)) derived from the spec the manifest carries (``model``:
    the model :func:`~attnspec.compiler.load.load_model` built of it, else one built here on the meta device,
    nothing allocated), never trusted from the manifest's own fields: a manifest whose ``decode_limit`` or
    state signature disagrees with its spec is refused, and so is a spec whose decoding state of one
    sequence is over ``MAX_DECODE_STATE_BYTES``."""
    from attnspec.compiler.load import check_decoding_fields, check_plugins, decoding_state
    from attnspec.nn.model import Model, meta_values_skipped
    from attnspec.spec.validate import validate_data

    if model is None:
        check_plugins(directory, manifest.spec.get("plugins"))
        try:
            spec = validate_data(manifest.spec)
        except AttnSpecError as error:
            raise BuildError(f"{directory}/manifest.json: its spec is not valid ({shorten(str(error), 600)}); "
                             "rebuild the directory") from None
        with torch.device("meta"), meta_values_skipped():
            model = Model(spec)
    model.check_decode_state(1)
    limit = model.decode_limit if model.has_step else None
    check_decoding_fields(directory, manifest, model)
    return limit, decoding_state(manifest, model)


class _Runner:
    """The model of a build directory as two calls: the full sequence and the one-token step."""

    def __init__(self, directory: Path, manifest: Manifest, state: StateFacts, model=None):
        """``model``: the model rebuilt from the directory's spec and weights, or None to run its programs."""
        programs = model is None
        self.directory, self.manifest, self.programs, self.state = directory, manifest, programs, state
        # the exported programs run on the device they were built for; the rebuilt model on the CPU
        self.device = torch.device("cpu")
        if programs and manifest.device != "cpu":
            from attnspec.compiler.device import resolve_device

            try:
                self.device = resolve_device(manifest.device)
            except BuildError as error:
                raise BuildError(f"{directory} was built for {manifest.device}, where its exported programs run: "
                                 f"{error}. Run it without --programs (the model rebuilt from its weights runs on "
                                 "the CPU)") from None
            import attnspec.ops.linear.backends.triton  # noqa: F401  registers the op a program built on a GPU may hold
        self.model = model

    def _program(self, name: str):
        """The exported program ``name`` of the directory, its module; refused by name where it was not written
        (the prompt's output needs model.pt2, generating step.pt2 too)."""
        if name not in self.manifest.files:
            raise BuildError(f"{self.directory} holds no {name}: it was built without it (import-hf writes no "
                             f"programs unless asked). Write it with `attnspec export {self.directory} --programs "
                             f"{name.removesuffix('.pt2')}`, or run without --programs (the model rebuilt from "
                             "its weights)")
        return load_program(self.directory / name).module()

    def sequence(self, prompt: list[int]) -> torch.Tensor:
        """The output on the prompt: (1, L, ...) per position, or (1, classes)."""
        inputs = prompt if len(prompt) > 1 or self.model is not None else prompt + [0]
        with torch.no_grad():
            if self.model is not None:
                return self.model(torch.tensor([inputs]))
            program = self._program("model.pt2")
            try:
                return program(torch.tensor([inputs], device=self.device)).cpu()
            except Exception as error:  # noqa: BLE001 - a program that fails on valid input is a damaged build
                raise BuildError(f"{self.directory}/model.pt2 failed on the tokens ({type(error).__name__}: "
                                 f"{shorten(str(error), 160)}); rebuild the directory") from None

    def generate(self, prompt: list[int], count: int, sampling: dict) -> list[int]:
        capacity = len(prompt) + count  # caches sized to this generation
        if self.manifest.decode_limit is not None:
            capacity = min(capacity, self.manifest.decode_limit)  # past it, the step's own error names max_len
        if self.model is not None:
            model = self.model
            return _generate(self.directory, "model.safetensors", model.step, lambda: model.init_state(1, capacity),
                             prompt, count, sampling,
                             prefill=lambda tokens: model.prefill(tokens, last_only=True, capacity=capacity))
        capacity = max(capacity, 2)  # the programs' least capacity

        def state(batch: int = 1) -> list[torch.Tensor]:  # what the programs take: zeros, at this capacity
            return [torch.zeros(batch, *(capacity if index == axis else n for index, n in enumerate(shape)),
                                dtype=getattr(torch, dtype), device=self.device) for shape, dtype, axis in self.state]

        step = self._program("step.pt2")
        prefill, name = None, "step.pt2"
        if "prefill.pt2" in self.manifest.files:  # builds before prefill programs step through the prompt
            program, name = self._program("prefill.pt2"), "prefill.pt2 and step.pt2"
            prefill = program  # builds before it return a state of max_len positions
            if self.manifest.export.prefill is not None and self.manifest.export.prefill.takes_state:
                prefill = lambda tokens: program(tokens, *state(tokens.shape[0]))  # noqa: E731
        return _generate(self.directory, name, step, state, prompt, count, sampling, prefill=prefill,
                         device=self.device)


def _text_prompt(directory: Path, manifest: Manifest, text: str):
    """(the build's tokenizer, the ids of ``text``): a build without a tokenizer is refused by name."""
    from attnspec.compiler.load import tokenizer_of

    if len(text) > MAX_TOKEN_TEXT:
        raise AttnSpecError(f"--text is {len(text):,} characters; the limit is {MAX_TOKEN_TEXT:,}")
    tokenizer = tokenizer_of(directory)
    if tokenizer is None:
        raise AttnSpecError(f"{directory} carries no tokenizer, so it takes token ids (--tokens); build it with "
                            "--tokenizer, or from a run of a text task")
    prompt = tokenizer.encode(text, special=True)  # as transformers' tokenizer(text): Gemma's BOS first
    if not prompt:
        raise AttnSpecError("--text gives no tokens; give some text")
    if len(prompt) > manifest.max_len:
        raise AttnSpecError(f"--text is {len(prompt)} tokens, over the model's max_len = {manifest.max_len}")
    return tokenizer, prompt


def run_directory(directory: Path | str, tokens: str | None, generate: int = 0, *, programs: bool = False,
                  temperature: float = 0.0, top_k: int | None = None, top_p: float | None = None,
                  seed: int | None = None, text: str | None = None) -> str:
    """Run the model of ``directory`` on ``tokens`` (ids as text, "1 2 3") or on ``text`` (through the
    tokenizer the build carries), and report its next-token prediction (or output);
    with ``generate``, decode that many tokens with the one-token step, greedily (``temperature`` 0)
    or by sampling (``top_k``, ``top_p``, ``seed``). Returns the text to print.

    ``programs``: use the exported programs rather than the model rebuilt from spec and weights
    (module docstring). ``model.pt2`` takes sequences of 2 or more positions (a dynamic length of 1
    would need guards torch cannot drop); a one-token prompt runs as that token followed by token 0,
    and position 0 is read, which is exact because the model is causal. Non-causal and classifier
    models refuse one-token prompts there.
    """
    directory = Path(directory)
    manifest = read_manifest(directory)
    if manifest.input != "tokens":
        raise BuildError(f"{directory} takes real-valued features, not tokens; load it with attnspec.load (or "
                         "model.pt2 with torch.export.load) and call it on a (batch, length, dim) tensor")
    if not 0 <= generate <= MAX_GENERATE:
        raise AttnSpecError(f"--generate must be between 0 and {MAX_GENERATE}, got {generate}")
    if (tokens is None) == (text is None):
        raise AttnSpecError("give the prompt as token ids (--tokens) or as text (--text), one of them")
    tokenizer = None
    if text is not None:
        tokenizer, prompt = _text_prompt(directory, manifest, text)
    else:
        prompt = parse_tokens(tokens, manifest.vocab_size, manifest.max_len)
    sampling = {"temperature": temperature, "top_k": top_k, "top_p": top_p, "seed": seed}
    check_sampling(temperature, top_k, top_p, seed)
    if generate and not manifest.has_step:
        raise BuildError(f"{directory} has no decoding step (a non-causal mixer, or not a token LM with an lm head)")
    model = None
    if not programs:  # the model rebuilt from spec and weights: built once, its decoding facts read off it
        from attnspec.compiler.load import load_model

        model = load_model(directory, manifest)
    limit, state = decoding_facts(directory, manifest, model)
    if generate and limit is not None and len(prompt) + generate > limit:
        raise AttnSpecError(f"{len(prompt)} prompt tokens + {generate} generated exceed max_len = {limit}, the "
                            "positions this model's key/value caches (or position table) hold; generate fewer")
    per_position = manifest.head != "classifier"
    if programs and len(prompt) == 1 and not (manifest.causal and per_position):
        raise AttnSpecError(f"{directory} holds a non-causal or classifier model, whose exported program takes at "
                            "least 2 tokens; give a longer prompt")
    runner = _Runner(directory, manifest, state, model)
    output = runner.sequence(prompt)
    last = len(prompt) - 1
    lines = [f"input: {' '.join(map(str, prompt))}"]
    if manifest.head == "lm":
        best = int(output[0, last].argmax())
        lines.append(f"next token (argmax): {best}" + (f" {tokenizer.decode([best])!r}" if tokenizer else ""))
    elif manifest.head == "classifier":
        lines.append(f"output: {output[0].tolist()}")
    else:
        lines.append(f"output: hidden states {tuple(output[0, : last + 1].shape)}")
    if generate:
        generated = runner.generate(prompt, generate, sampling)
        lines.append(f"generated: {' '.join(map(str, generated))}")
        if tokenizer is not None:
            lines.append(f"text: {text}{tokenizer.decode(generated)}")
    return "\n".join(lines)
