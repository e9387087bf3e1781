"""The one registry of model types: complete, consistent, light, and what the guide and help show."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from attnspec.interop.registry import (_families, architectures, export_order, imported_types, rewrite_table,
                                       types_table, wrappers)
from tests.conftest import ROOT


def test_the_guides_table_of_types_is_generated_from_the_registry():
    guide = (ROOT / "docs" / "huggingface.md").read_text()
    assert rewrite_table(guide) == guide, "run `python -m attnspec.interop.registry docs/huggingface.md`"
    assert types_table() in guide


def test_every_type_has_one_row_one_class_and_one_place_in_the_export_order():
    rows = [t for family in _families() for row in family.rows for t in row.types]
    assert sorted(rows) == imported_types(), "each type (and multimodal release) in exactly one row"
    assert sorted(export_order()) == sorted(architectures()), "export-hf tries every native type once"
    for model_type, family in architectures().items():
        assert family.causal_lm.get(model_type, "").endswith(("ForCausalLM", "LMHeadModel")), model_type
    for release, wrapper in wrappers().items():
        assert wrapper.text_type in architectures(), release
        assert release not in architectures()


def test_the_registry_and_conversion_import_neither_torch_nor_transformers():
    # The CLI's help reads the registry; conversion needs torch but never transformers' modelling stack
    # (which `import attnspec.hf` costs: ~200 MB and seconds at every import-hf before the split).
    code = ("import sys, json\nfrom attnspec.interop.registry import imported_types\nimported_types()\n"
            "light = ['torch' in sys.modules, 'transformers' in sys.modules]\n"
            "import attnspec.interop.convert\n"
            "print(json.dumps(light + ['transformers' in sys.modules]))")
    found = json.loads(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                                      cwd=ROOT).stdout)
    assert found == [False, False, False]


def test_import_hf_and_export_hf_help_name_every_registered_type():
    from typer.testing import CliRunner

    from attnspec.cli.app import app

    imported = CliRunner().invoke(app, ["import-hf", "--help"], terminal_width=4000).stdout
    exported = CliRunner().invoke(app, ["export-hf", "--help"], terminal_width=4000).stdout
    words = lambda text: set(text.replace(",", " ").replace(".", " ").replace("(", " ").replace(")", " ").split())
    assert set(imported_types()) <= words(imported)
    assert set(architectures()) <= words(exported)


def test_every_registered_type_is_held_to_transformers_by_a_test():
    # The logit-equality tests are written per family (each turns on its own distinctive parts); every
    # type the registry names must be built by one of them (in test_interop.py, or a family's own module).
    tests = "".join(path.read_text() for path in sorted((ROOT / "tests" / "hf").glob("test_*.py"))
                    if path.name != "test_registry.py")
    untested = [t for t in imported_types() if f'"{t}"' not in tests]
    assert untested == []


def test_the_snapshot_of_transformers_causal_lm_types_is_the_installed_mapping():
    import transformers
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    from attnspec.interop.refused import CAUSAL_LM_TYPES, TRANSFORMERS_VERSION

    assert set(imported_types()) <= set(CAUSAL_LM_TYPES)
    if transformers.__version__.startswith(TRANSFORMERS_VERSION + "."):
        assert CAUSAL_LM_TYPES == tuple(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)
    else:  # another transformers: the snapshot is this project's measure, not a claim about it
        assert set(CAUSAL_LM_TYPES) & set(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)


@pytest.mark.parametrize("config, words", [
    ({"model_type": "bert"}, "`model_type`: bert is an encoder"),
    ({"model_type": "bart", "is_encoder_decoder": True}, "`model_type`: bart is the decoder of an encoder-decoder"),
    ({"model_type": "newdecoder", "is_encoder_decoder": True}, "is the decoder of an encoder-decoder"),
    ({"model_type": "phimoe"}, "`model_type`: phimoe needs the SparseMixer router"),
    ({"model_type": "doge"}, "`keep_window_size`: doge needs dynamic mask attention"),
    ({"model_type": "x" * 500}, "is not a causal language model type of transformers 5.24"),
    ({"model_type": ["llama"]}, "is not a causal language model type"),
])
def test_a_type_that_does_not_import_says_what_it_is_or_lacks_in_one_line(tmp_path, config, words):
    from attnspec.errors import InteropError
    from attnspec.interop.convert import spec_from_checkpoint

    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(InteropError) as refused:
        spec_from_checkpoint(tmp_path)
    message = str(refused.value)
    assert words in message and "\n" not in message and len(message) < 400
    assert message.startswith(f"{tmp_path}/config.json: ")


def test_every_decoder_only_type_imports_or_names_what_it_lacks(monkeypatch, tmp_path):
    """Each of transformers 5.24's causal-LM types imports, is an encoder or an encoder-decoder's decoder, or names
    the part it lacks; one without a reason (a newer transformers' type) would say that no family maps it yet."""
    from attnspec.errors import InteropError
    from attnspec.interop import refused
    from attnspec.interop.convert import spec_from_checkpoint

    unexplained = [t for t in refused.CAUSAL_LM_TYPES if t not in imported_types() and t not in refused.LACKS
                   and t not in refused.ENCODERS and t not in refused.DECODERS_OF_ENCODER_DECODERS]
    assert unexplained == []
    monkeypatch.delitem(refused.LACKS, "phimoe")
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "phimoe"}))
    with pytest.raises(InteropError, match="`model_type`: phimoe is a decoder-only type no attnspec family maps yet"):
        spec_from_checkpoint(tmp_path)
