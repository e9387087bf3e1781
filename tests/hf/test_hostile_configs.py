"""Every config number of every imported type reaches arithmetic only after a range check.

For each registered type (and multimodal release) the base is transformers' own default config of the type
(``CONFIG_MAPPING[type]()``; a handful adjusted so that the base itself imports), and every numeric field of
it, nested ones included (``rope_parameters``, ``text_config``, the first 4 items of lists), is replaced in
turn by each extreme: 1e308, 1e-300, NaN, infinity, minus infinity, -1 and 0. Each ``config.json`` is handed
to ``spec_from_checkpoint`` (what ``import-hf`` reads first). Every outcome is classified:

- accepted (the field is one attnspec does not read, or the value is within what it allows), or a located
  error (an ``InteropError`` naming the config file): fine;
- a crash (any other exception: an overflow to NaN in a count, a ValueError of int(), a ZeroDivisionError)
  or a hang: never.

The counts are printed (``pytest -s``) and asserted.
"""

from __future__ import annotations

import json
import logging
import math
import signal
import warnings
from collections import Counter
from pathlib import Path

import pytest

from attnspec.errors import InteropError
from tests.test_hostile_directories import json_paths, set_path

pytestmark = pytest.mark.slow  # about 21,000 configs, under a minute

EXTREMES = (1e308, 1e-300, math.nan, math.inf, -math.inf, -1, 0)
BASE_CHANGES = {  # defaults attnspec refuses as they are (each refusal is tested elsewhere)
    "dbrx": {("attn_config", "clip_qkv"): 8.0}, "dots1": {("n_routed_experts",): 8},
    "gemma4_text": {("hidden_size_per_layer_input",): 0}, "glm4_moe": {("num_attention_heads",): 32},
    "gemma4": {("text_config", "hidden_size_per_layer_input"): 0}}
HANG_SECONDS = 30


def _numeric_paths(config: dict) -> list[tuple]:
    """The paths (``json_paths``: nested tables, the first items of lists) of the config's numbers."""
    def at(path):
        value = config
        for key in path:
            value = value[key]
        return value

    return [path for path in json_paths(config) if isinstance(at(path), (int, float)) and not isinstance(at(path), bool)]


class _Hang(Exception):
    pass


def _alarm(signum, frame):
    raise _Hang()


def test_extreme_numbers_in_every_field_of_every_type_are_accepted_or_located_errors(tmp_path, capsys):
    import transformers

    from attnspec.interop.convert import spec_from_checkpoint
    from attnspec.interop.registry import architectures, wrappers

    logging.disable(logging.WARNING)  # transformers warns about out-of-range token ids in its own defaults
    counts, findings, types = Counter(), [], sorted(architectures()) + sorted(wrappers())
    config_path = tmp_path / "config.json"
    signal.signal(signal.SIGALRM, _alarm)
    try:
        for model_type in types:
            base = transformers.CONFIG_MAPPING[model_type]().to_dict()
            for path, value in BASE_CHANGES.get(model_type, {}).items():
                base = set_path(base, path, value)
            config_path.write_text(json.dumps(base))
            spec_from_checkpoint(tmp_path)  # the base imports
            for path in _numeric_paths(base):
                for extreme in EXTREMES:
                    config_path.write_text(json.dumps(set_path(base, path, extreme)))
                    counts["inputs"] += 1
                    signal.alarm(HANG_SECONDS)
                    try:
                        with warnings.catch_warnings():
                            warnings.simplefilter("ignore")
                            spec_from_checkpoint(tmp_path)
                        counts["accepted"] += 1
                    except InteropError as error:
                        located = str(error).startswith(str(config_path))
                        counts["located error" if located else "unlocated error"] += 1
                        if not located:
                            findings.append(f"unlocated: {model_type} {path} = {extreme}: {str(error)[:200]}")
                    except _Hang:
                        counts["hang"] += 1
                        findings.append(f"hang: {model_type} {path} = {extreme}")
                    except Exception as error:  # noqa: BLE001 - exactly what the sweep looks for
                        counts["crash"] += 1
                        findings.append(f"crash: {model_type} {path} = {extreme}: {type(error).__name__}: "
                                        f"{str(error)[:200]}")
                    finally:
                        signal.alarm(0)
    finally:
        logging.disable(logging.NOTSET)
    with capsys.disabled():
        print(f"\nhostile config numbers over {len(types)} types:", dict(sorted(counts.items())))
    assert not findings, f"{len(findings)} findings:\n" + "\n".join(findings[:40])
    assert counts["located error"] > counts["inputs"] // 4
