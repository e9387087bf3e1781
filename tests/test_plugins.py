"""Components from the user's own code: the example plugins (examples/plugins) end to end.

Nothing is installed: each test runs attnspec in a fresh interpreter with examples/plugins on
PYTHONPATH (a plugin registers kinds process-wide, so it must not leak into other tests). A spec
using Based's Taylor features and Hedgehog's trainable features goes through check, explain, build,
verify and run like any built-in; the components also compute what their papers define.

A spec's ``plugins:`` list is a request: attnspec imports a module only with the user's consent
(``attnspec --plugin MODULE``, ``$ATTNSPEC_PLUGINS``, or an installed entry point), so the tests
give it explicitly, and the last tests check that nothing is imported without it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.conftest import ROOT, table_text

PLUGINS = ROOT / "examples" / "plugins"
SPEC = """\
name: plugins-demo
plugins: [based_taylor, hedgehog]
input: {kind: tokens, vocab_size: 64}
d_model: 32
max_len: 128
layers:
  - mixer: {kind: linear, heads: 4, d_qk: 4, feature_map: taylor}
  - mixer: {kind: linear, heads: 2, feature_map: {kind: hedgehog, feature_dim: 8}}
"""


ALLOWED = "based_taylor,hedgehog"


def _environment(extra_path: str, allowed: str | None) -> dict:
    env = {key: value for key, value in os.environ.items() if key != "ATTNSPEC_PLUGINS"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(PLUGINS), extra_path, str(ROOT)]))
    if allowed is not None:
        env["ATTNSPEC_PLUGINS"] = allowed
    return env


def attnspec(*args: str, cwd: Path = ROOT, extra_path: str = "", allowed: str | None = ALLOWED
             ) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "attnspec", *args], capture_output=True, text=True, cwd=cwd,
                          env=_environment(extra_path, allowed), timeout=600)


def python(code: str, extra_path: str = "", allowed: str | None = ALLOWED) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, cwd=ROOT,
                          env=_environment(extra_path, allowed), timeout=600)


@pytest.mark.slow
def test_plugin_components_go_through_check_explain_build_verify_run(tmp_path):
    spec = tmp_path / "spec.yaml"
    spec.write_text(SPEC)
    checked = attnspec("check", str(spec))
    assert checked.returncode == 0 and "2 blocks" in checked.stdout, checked.stderr
    explained = attnspec("explain", str(spec), "--length", "64")
    shown = table_text(explained.stdout.splitlines())  # piped, explain's table is 100 columns: cells wrap
    assert explained.returncode == 0 and "linear[taylor]" in shown and "linear[hedgehog]" in shown
    # consent by flag alone: the compile check's child process inherits it
    built = attnspec("--plugin", "based_taylor", "--plugin", "hedgehog", "build", str(spec), "-o",
                     str(tmp_path / "build"), allowed=None)
    assert built.returncode == 0, built.stderr[-3000:]
    verified = attnspec("verify", str(tmp_path / "build"))
    assert verified.returncode == 0 and verified.stdout.count(" yes ") == 6, verified.stdout  # 3 modes x 2 blocks
    ran = attnspec("run", str(tmp_path / "build"), "--tokens", "1 2 3", "--generate", "4")
    assert ran.returncode == 0 and "generated:" in ran.stdout, ran.stderr
    decoded = python(f"""
        import attnspec, torch
        model = attnspec.load({str(tmp_path / 'build')!r})
        tokens = torch.tensor([[1, 2, 3, 4, 5]])
        with torch.no_grad():
            full, state = model(tokens), model.init_state(1)
            for t in range(5):
                logits, *state = model.step(tokens[:, t], *state)
        print(torch.allclose(logits, full[:, -1], atol=1e-5))
    """)
    assert decoded.stdout.strip() == "True", decoded.stderr


def test_plugin_kinds_are_validated_like_built_ins(tmp_path):
    spec = tmp_path / "spec.yaml"
    spec.write_text(SPEC.replace("feature_map: taylor", "feature_map: taylr"))
    result = attnspec("check", str(spec))
    assert result.returncode == 2 and "did you mean 'taylor'" in result.stderr and "spec.yaml:7:" in result.stderr
    spec.write_text(SPEC.replace("feature_dim: 8", "feature_dim: -3"))
    result = attnspec("check", str(spec))
    assert result.returncode == 2 and "feature_dim" in result.stderr and "spec.yaml:8:" in result.stderr
    spec.write_text(SPEC.replace("based_taylor", "not_a_module"))
    result = attnspec("check", str(spec), allowed=ALLOWED + ",not_a_module")
    assert result.returncode == 2 and "spec.yaml:2:" in result.stderr and "cannot import plugin" in result.stderr
    assert "Traceback" not in result.stderr
    schema = attnspec("schema", "--plugin", "hedgehog", "--plugin", "based_taylor")
    assert '"taylor"' in schema.stdout and '"hedgehog"' in schema.stdout and "feature_dim" in schema.stdout


def test_checking_a_plugin_spec_imports_no_torch(tmp_path):
    spec = tmp_path / "spec.yaml"
    spec.write_text(SPEC)
    result = python(f"""
        import sys
        from attnspec.spec import load_spec
        load_spec({str(spec)!r})
        print("torch" in sys.modules)
    """)
    assert result.stdout.strip() == "False", result.stderr


def test_the_plugins_compute_what_their_papers_define():
    result = python("""
        import math, torch, based_taylor, hedgehog
        x, y = torch.randn(2, 3, 5, 4, dtype=torch.float64), torch.randn(2, 3, 5, 4, dtype=torch.float64)
        taylor = based_taylor.build_taylor(based_taylor.TaylorFeatures(kind="taylor"), scale=0.25)
        fx, fy = taylor(x, True)[0], taylor(y, False)[0]
        dot = 0.25 * (x * y).sum(-1)  # the temperature applies inside: 1 + s + s^2/2 with s = scale q.k
        assert fx.shape[-1] == 1 + 4 + 16
        assert torch.allclose((fx * fy).sum(-1), 1 + dot + dot ** 2 / 2)
        hog = hedgehog.build_hedgehog(hedgehog.HedgehogFeatures(kind="hedgehog"), dim=4, heads=3).double()
        features = hog(x, True)[0]  # at initialisation W = I: [softmax(x), softmax(-x)]
        assert torch.allclose(features, torch.cat([torch.softmax(x, -1), torch.softmax(-x, -1)], -1))
        print("ok")
    """)
    assert result.stdout.strip() == "ok", result.stderr


def test_installed_plugins_register_through_entry_points(tmp_path):
    site = tmp_path / "site"
    info = site / "fake_attnspec_plugin-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: fake-attnspec-plugin\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[attnspec.components]\ntaylor = based_taylor\n")
    spec = tmp_path / "spec.yaml"
    spec.write_text(SPEC.replace("plugins: [based_taylor, hedgehog]\n", "").replace(
        "feature_map: {kind: hedgehog, feature_dim: 8}", "feature_map: taylor"))
    result = attnspec("check", str(spec), extra_path=str(site))
    assert result.returncode == 0, result.stderr


def test_a_build_directory_never_supplies_plugin_code(tmp_path):
    import json

    from attnspec.compiler.build import build_directory

    directory = tmp_path / "build"
    build_directory(ROOT / "specs" / "linear-elu.yaml", directory, compile_check=False,
                    overrides=["d_model=16", "layers[0].repeat=1", "max_len=64"])
    marker = tmp_path / "PWNED"
    (directory / "evil_plugin.py").write_text(f"open({str(marker)!r}, 'w')\n")
    manifest = json.loads((directory / "manifest.json").read_text())
    manifest["spec"]["plugins"] = ["evil_plugin"]
    (directory / "manifest.json").write_text(json.dumps(manifest))
    # `python -m` puts the working directory on sys.path: never searched for plugins, even consented ones
    result = attnspec("verify", ".", cwd=directory, allowed=ALLOWED + ",evil_plugin")
    assert result.returncode == 2 and "never from where it happens to run" in result.stderr, result.stderr
    # the directory on an absolute PYTHONPATH entry, the plugin consented: a build directory's own file still never runs
    result = attnspec("verify", str(directory), extra_path=str(directory), allowed=ALLOWED + ",evil_plugin")
    assert result.returncode == 2 and "never supplies code" in result.stderr, result.stderr
    assert not marker.exists()


# --------------------------------------------------------------------------- consent


@pytest.mark.parametrize("module, effect", [("this", "Zen of Python"), ("antigravity", "")])
def test_a_spec_imports_no_module_the_user_did_not_allow(tmp_path, module, effect):
    """`plugins: [this]` printed the Zen of Python on `check`; `antigravity` ran $BROWSER."""
    spec = tmp_path / "spec.yaml"
    spec.write_text(SPEC.replace("plugins: [based_taylor, hedgehog]", f"plugins: [{module}]").replace(
        "feature_map: taylor", "feature_map: relu").replace("feature_map: {kind: hedgehog, feature_dim: 8}",
                                                            "feature_map: relu"))
    marker = tmp_path / "BROWSER-RAN"
    env_browser = f"touch {marker}"
    for command in (["check", str(spec)], ["fmt", str(spec), "--to", "attn"], ["explain", str(spec)]):
        result = subprocess.run([sys.executable, "-m", "attnspec", *command], capture_output=True, text=True,
                                cwd=tmp_path, env={**_environment("", None), "BROWSER": env_browser}, timeout=120)
        assert result.returncode == 2, (command, result.stdout, result.stderr)
        assert f"plugin module {module!r}" in result.stderr and "--plugin" in result.stderr
        assert "spec.yaml:2:" in result.stderr and "Traceback" not in result.stderr
        assert "Beautiful is better than ugly" not in result.stdout + result.stderr
    assert not marker.exists()


@pytest.mark.parametrize("route", ["readme-recipe", "empty-entry", "working-directory"])
def test_consent_binds_to_a_file_not_a_name(tmp_path, route):
    """Consent to `based_taylor` let a received folder's own based_taylor.py run, through the README's
    relative `PYTHONPATH=examples/plugins`, an empty PYTHONPATH entry, or `python -m attnspec` in a
    folder holding the module. A consented name is now imported only from a place the user chose."""
    received = tmp_path / "received"
    folder = received / "examples" / "plugins" if route == "readme-recipe" else received
    folder.mkdir(parents=True)
    marker = tmp_path / "RAN"
    (folder / "based_taylor.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    (received / "spec.yaml").write_text(SPEC.replace("[based_taylor, hedgehog]", "[based_taylor]"))
    path = {"readme-recipe": "examples/plugins", "empty-entry": os.pathsep + str(ROOT),
            "working-directory": str(ROOT)}[route]
    env = {**_environment("", "based_taylor"), "PYTHONPATH": path}
    result = subprocess.run([sys.executable, "-m", "attnspec", "check", "spec.yaml"], capture_output=True, text=True,
                            cwd=received, env=env, timeout=120)
    assert result.returncode == 2 and "spec.yaml:2:" in result.stderr, result.stderr
    assert "never from where it happens to run" in result.stderr and "Traceback" not in result.stderr
    assert not marker.exists()


def test_a_child_process_imports_only_the_file_its_parent_approved(tmp_path):
    """The compile check and sweep workers inherit consent; they refuse a plugin whose file or
    content differs from what the parent imported (a file swapped in between)."""
    import hashlib

    spec = tmp_path / "spec.yaml"
    spec.write_text(SPEC)
    origin = PLUGINS / "based_taylor.py"
    good = json.dumps({"based_taylor": [str(origin.resolve()), hashlib.sha256(origin.read_bytes()).hexdigest()]})
    env = {**_environment("", ALLOWED), "ATTNSPEC_PLUGIN_FILES": good}
    ok = subprocess.run([sys.executable, "-m", "attnspec", "check", str(spec)], capture_output=True, text=True,
                        cwd=ROOT, env=env, timeout=120)
    assert ok.returncode == 0, ok.stderr
    env["ATTNSPEC_PLUGIN_FILES"] = json.dumps({"based_taylor": [str(origin.resolve()), "0" * 64]})
    changed = subprocess.run([sys.executable, "-m", "attnspec", "check", str(spec)], capture_output=True, text=True,
                             cwd=ROOT, env=env, timeout=120)
    assert changed.returncode == 2 and "parent process approved" in changed.stderr, changed.stderr


def test_consent_by_flag_and_by_environment(tmp_path):
    spec = tmp_path / "spec.yaml"
    spec.write_text(SPEC)
    assert attnspec("check", str(spec), allowed=None).returncode == 2
    assert attnspec("--plugin", "based_taylor", "--plugin", "hedgehog", "check", str(spec), allowed=None).returncode == 0
    assert attnspec("check", str(spec), allowed="hedgehog, based_taylor").returncode == 0
    partial = attnspec("--plugin", "based_taylor", "check", str(spec), allowed=None)
    assert partial.returncode == 2 and "'hedgehog'" in partial.stderr and "'based_taylor'" not in partial.stderr
    bad = attnspec("--plugin", "os; rm", "check", str(spec), allowed=None)
    assert bad.returncode == 2 and "not a Python module name" in bad.stderr


FAMILY_SPEC = """\
name: ema-family
plugins: [ema]
input: {kind: tokens, vocab_size: 64}
d_model: 32
max_len: 64
layers:
  - mixer: {kind: ema, heads: 2}
  - mixer: {kind: linear, heads: 2}
"""


@pytest.mark.slow
def test_a_plugin_family_is_planned_verified_exported_and_decodes_like_a_built_in(tmp_path):
    spec = tmp_path / "spec.yaml"
    spec.write_text(FAMILY_SPEC)
    explained = attnspec("explain", str(spec), allowed="ema")
    shown = table_text(explained.stdout.splitlines())  # piped, explain's table is 100 columns: cells wrap
    assert explained.returncode == 0 and "emaon2heads" in shown, explained.stderr
    assert "quadratic" in shown and "graph" in shown
    built = attnspec("build", str(spec), "-o", str(tmp_path / "build"), "--programs", "all", allowed="ema")
    assert built.returncode == 0, built.stderr[-3000:]
    assert (tmp_path / "build" / "step.pt2").is_file() and (tmp_path / "build" / "model.pt2").is_file()
    verified = attnspec("verify", str(tmp_path / "build"), allowed="ema")
    assert verified.returncode == 0 and "blocks[0]" in verified.stdout, verified.stdout  # quadratic vs the recurrence
    ran = attnspec("run", str(tmp_path / "build"), "--tokens", "1 2 3", "--generate", "4", allowed="ema")
    assert ran.returncode == 0 and "generated:" in ran.stdout, ran.stderr


def test_a_plugin_family_computes_its_reference_and_states_its_facts():
    result = python("""
        import torch, ema
        from attnspec.compiler.calibration import Calibration
        from attnspec.compiler.plan import plan_spec
        from attnspec.spec import load_spec
        node = ema.EmaMixer(kind="ema", heads=2, d_qk=8, d_v=8)
        mixer = ema.EmaModule(node, d_model=16, max_len=64, seed=0).double()
        x = torch.randn(3, 37, 16, dtype=torch.float64)
        reference = mixer.out_proj(torch.sigmoid(mixer.ema_gate(x)) * ema.ema_reference(mixer.v_proj(x),
                                   torch.sigmoid(mixer.rate_logit)))
        for mode in ("quadratic", "recurrent"):
            assert (mixer(x, mode) - reference).abs().max() < 1e-12, mode
        state, steps = mixer.init_state(3, torch.float64), []
        for t in range(37):
            y, state = mixer.step(x[:, t], state, torch.full((3,), t))
            steps.append(y)
        assert (torch.stack(steps, 1) - reference).abs().max() < 1e-12
        spec = load_spec({"name": "e", "plugins": ["ema"], "input": {"kind": "tokens", "vocab_size": 8},
                          "d_model": 16, "max_len": 4096, "layers": [{"mixer": {"kind": "ema"}}]})
        plan = plan_spec(spec, calibration=Calibration.empty())
        layer = plan.layers[0]
        assert layer.full_mode == "quadratic" and layer.backend == "graph" and layer.decode_mode == "recurrent"
        assert set(layer.candidates) == {"quadratic", "recurrent"}  # both costed; the loop cannot be exported
        assert "recurrent cannot be exported" in layer.reason
        print("ok")
    """, allowed="ema")
    assert result.stdout.strip() == "ok", result.stderr


def test_a_family_must_state_its_costs():
    result = python("""
        from typing import Literal
        from attnspec.errors import SpecError
        from attnspec.spec.components import register
        from attnspec.spec.ir import MixerComponent

        class Costless(MixerComponent):
            kind: Literal["costless"]
            def modes(self):
                return ("quadratic",)
        try:
            register("mixer", Costless)
        except SpecError as error:
            print("refused:", error)
    """)
    assert "refused:" in result.stdout and "mode_costs" in result.stdout, result.stderr
