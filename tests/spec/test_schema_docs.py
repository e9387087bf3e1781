"""The committed JSON Schema and reference doc are current, draft-07 valid, and accept every shipped spec."""

from __future__ import annotations

import json

import jsonschema
import pytest
import yaml

from attnspec.spec.schema import json_schema_text, reference_markdown
from tests.conftest import ROOT, SPECS


def test_committed_schema_is_current():
    committed = (ROOT / "schema" / "attnspec.schema.json").read_text()
    assert committed == json_schema_text(), "run `attnspec schema -o schema/attnspec.schema.json`"


def test_reference_doc_is_current():
    committed = (ROOT / "docs" / "spec-reference.md").read_text()
    assert committed == reference_markdown(), "run `attnspec schema --markdown -o docs/spec-reference.md`"


def test_schema_is_draft07():
    schema = json.loads(json_schema_text())
    assert schema["$schema"] == "http://json-schema.org/draft-07/schema#"
    jsonschema.Draft7Validator.check_schema(schema)


@pytest.mark.parametrize("path", SPECS, ids=[p.stem for p in SPECS])
def test_schema_accepts_shipped_specs(path):
    validator = jsonschema.Draft7Validator(json.loads(json_schema_text()))
    assert list(validator.iter_errors(yaml.safe_load(path.read_text()))) == []


def test_schema_rejects_unknown_keys():
    validator = jsonschema.Draft7Validator(json.loads(json_schema_text()))
    spec = yaml.safe_load((ROOT / "specs" / "gateloop.yaml").read_text())
    spec["layers"][0]["layers"][0]["mixer"]["feture_map"] = "relu"
    assert list(validator.iter_errors(spec))


def test_the_trust_guide_lists_every_limit():
    from attnspec.spec import limits

    readme = (ROOT / "docs" / "trust.md").read_text()
    for what, unit, value in limits.TABLE:
        row = f"| {what} | {value:,}{' ' + unit if unit else ''} |"
        assert row in readme, f"docs/trust.md's Limits table lacks {row!r} (attnspec/spec/limits.py)"
