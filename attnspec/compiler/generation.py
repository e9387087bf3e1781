"""A model's decoding defaults as transformers records them: ``generation_config.json``.

A released checkpoint says how it is meant to be decoded: its end-of-sequence ids, whether it samples, at
what temperature, top-k and top-p. ``import-hf`` carries those fields into the build directory (hashed in
its manifest like every file) and ``export-hf`` writes them back beside the weights, so ``generate`` under
transformers follows the release's GenerationConfig for the exported model as it does for the original
(``AttnspecForCausalLM`` included: transformers reads the file for every type). attnspec's own ``generate``
and ``attnspec run`` stay greedy unless asked to sample, whatever the file says.

The file is untrusted data: only :data:`FIELDS` are carried, each checked for its type and range (a token
id within the vocabulary); any other field of the release's file is left behind.
"""

from __future__ import annotations

import json
from pathlib import Path

from attnspec.errors import RunError, shorten
from attnspec.io import read_json, write_atomic

GENERATION_FILE = "generation_config.json"
MAX_GENERATION_BYTES = 1 << 16
MAX_EOS_IDS = 64

FIELDS = ("bos_token_id", "eos_token_id", "pad_token_id", "do_sample", "temperature", "top_k", "top_p",
          "repetition_penalty", "max_length", "max_new_tokens")
"""What is carried: the ids that begin, end and pad a sequence, and the sampling defaults."""


def _token_id(value, vocab_size: int, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < vocab_size:
        raise RunError(f"{where}: {shorten(repr(value), 80)} is not a token id below the vocabulary's {vocab_size:,}")
    return value


def checked_generation_config(data, vocab_size: int, source: str) -> dict:
    """:data:`FIELDS` of ``data`` (a ``generation_config.json``'s object), each checked; the rest dropped.

    Raises:
        RunError: naming ``source`` and the field that is not what transformers writes there.
    """
    if not isinstance(data, dict):
        raise RunError(f"{source}: a generation config is a JSON object")
    kept = {}
    for name in FIELDS:
        value = data.get(name)
        where = f"{source}: {name}"
        if value is None:
            continue
        if name == "eos_token_id" and isinstance(value, list):
            if not 0 < len(value) <= MAX_EOS_IDS:
                raise RunError(f"{where}: 1 to {MAX_EOS_IDS} ids")
            kept[name] = [_token_id(each, vocab_size, where) for each in value]
        elif name.endswith("_token_id"):
            kept[name] = _token_id(value, vocab_size, where)
        elif name == "do_sample":
            if not isinstance(value, bool):
                raise RunError(f"{where}: true or false")
            kept[name] = value
        elif name in ("top_k", "max_length", "max_new_tokens"):
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 1 << 31:
                raise RunError(f"{where}: a whole number from 0 to 2^31")
            kept[name] = value
        else:  # temperature, top_p, repetition_penalty
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 100 \
                    or (name == "top_p" and value > 1):
                raise RunError(f"{where}: a number above 0 and at most {1 if name == 'top_p' else 100}")
            kept[name] = float(value)
    return kept


def read_generation_config(path: Path | str, vocab_size: int, *, follow_links: bool = False) -> dict:
    """The carried fields of the ``generation_config.json`` at ``path`` (:func:`checked_generation_config`).

    Raises:
        RunError: the file is not a bounded strict JSON object, or a field is not what it should be.
    """
    path = Path(path)
    return checked_generation_config(read_json(path, MAX_GENERATION_BYTES, follow_links=follow_links), vocab_size,
                                     str(path))


def write_generation_config(folder: Path | str, fields: dict) -> None:
    """``folder/generation_config.json`` holding ``fields`` (already checked)."""
    write_atomic(Path(folder) / GENERATION_FILE, json.dumps(fields, indent=2) + "\n")


__all__ = ["FIELDS", "GENERATION_FILE", "checked_generation_config", "read_generation_config",
           "write_generation_config"]
