"""The CLI through its real entry point: exit codes, messages, and never a traceback."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import ROOT, SPECS, table_text


def attnspec(*args: str, cwd=ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", "from attnspec.cli import main; main()", *args],
                          capture_output=True, text=True, cwd=cwd, timeout=120)


def test_check_all_shipped_specs():
    result = attnspec("check", *map(str, SPECS))
    assert result.returncode == 0, result.stderr
    assert len(result.stdout.strip().splitlines()) == len(SPECS)
    assert "gateloop: 4 blocks (4 linear)" in result.stdout


@pytest.mark.parametrize("content", [
    "name: [unclosed\n",
    "layers:\n  - mixer: {kind: linear, feature_map: rleu}\n",
    "\x00\x01binary",
    "",
])
def test_check_bad_input_exits_2_without_traceback(tmp_path, content):
    file = tmp_path / "bad.yaml"
    file.write_text(content)
    result = attnspec("check", str(file))
    assert result.returncode == 2
    assert "Traceback" not in result.stderr + result.stdout
    assert f"{file}:" in result.stderr


def test_check_non_utf8_directory_and_missing(tmp_path):
    (tmp_path / "latin.yaml").write_bytes(b"name: caf\xe9\n")
    (tmp_path / "dir.yaml").mkdir()
    result = attnspec("check", str(tmp_path / "latin.yaml"), str(tmp_path / "dir.yaml"), str(tmp_path / "none.attn"))
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "UTF-8" in result.stderr and "directory" in result.stderr and "no such file" in result.stderr


def test_check_with_set_reports_suggestion():
    result = attnspec("check", "specs/gateloop.yaml", "--set", "layers[0].layers[0].mixer.feture_map=relu")
    assert result.returncode == 2 and "did you mean 'feature_map'" in result.stderr


def test_usage_errors_exit_2():
    for args in ([], ["check"], ["frobnicate"], ["fmt", "specs/gateloop.yaml", "--to", "xml"]):
        result = attnspec(*args)
        assert result.returncode == 2, args
        assert "Traceback" not in result.stderr


def test_schema_command_prints_draft07():
    result = attnspec("schema")
    assert result.returncode == 0
    assert json.loads(result.stdout)["$schema"].startswith("http://json-schema.org/draft-07")


def test_fmt_converts_both_ways(tmp_path):
    attn = tmp_path / "gateloop.attn"
    result = attnspec("fmt", "specs/gateloop.yaml", "--to", "attn", "-o", str(attn))
    assert result.returncode == 0, result.stderr
    assert "transition=data" in attn.read_text()
    back = attnspec("fmt", str(attn), "--to", "yaml")
    assert back.returncode == 0 and "transition: data" in back.stdout


def test_every_command_has_help():
    for command in ("check", "schema", "fmt", "explain", "build", "verify", "run"):
        result = attnspec(command, "--help")
        assert result.returncode == 0 and "Usage" in result.stdout, command


def test_explain_prints_the_plan():
    result = attnspec("explain", "specs/hybrid.yaml", "--length", "4096")
    assert result.returncode == 0, result.stderr
    assert "chunk" in result.stdout and "quadratic" in result.stdout and "recurrent" in result.stdout


def test_explain_shows_every_part_and_each_block_s_size():
    """Qwen3-Next-style: the attention blocks' QK-norm, partial RoPE, sigmoid output gate and kv heads, the
    delta blocks' short convolutions; per block its parameters (counted on the meta device, summing to
    the model's less the embedding, final norm and head) and one sequence's decoding state."""
    from attnspec.compiler.sizes import count_parameters, layer_sizes
    from attnspec.spec import load_spec
    from attnspec.spec.walk import iter_blocks

    result = attnspec("explain", "specs/qwen3-next-style.yaml")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert max(map(len, lines)) <= 100  # piped: it fits a 100-column window
    shown = table_text(lines)
    for part in ("qk_norm: rmsnorm", "output_gate: sigmoid", "kv_heads: 2", "conv: short (activation silu)",
                 "blocks[3] (layers[0]#0.layers[1])", "on 4 heads", "blocks[0-2] x3", "blocks[4-6] x3",
                 "mlp: glu (expansion 2)"):
        assert "".join(part.split()) in shown, part
    spec = load_spec("specs/qwen3-next-style.yaml")
    attention = [block.mixer for _, block in iter_blocks(spec, expand=True)][3]
    assert ("position", "rope (rotary_fraction 0.25)") in attention.parts() and "rotary_fraction" in shown
    sizes = layer_sizes(spec)
    assert f"parameters{sizes[3].parameters:,}" in shown
    assert sum(size.parameters for size in sizes) < count_parameters(spec)
    # float32 keys and values of 2 kv heads (d 32) at max_len 1024, and one number per head and position
    # (ops.softmax.empty_cache's third tensor): 528 KiB
    assert sizes[3].decode_state_bytes == 2 * 2 * spec.max_len * 32 * 4 + 4 * spec.max_len * 4
    assert "decodingstate528.0KiBpersequence" in shown


def test_verify_a_spec_prints_the_table_and_succeeds():
    result = attnspec("verify", "specs/cosformer.yaml", "--set", "d_model=16", "--set", "layers[0].repeat=1")
    assert result.returncode == 0, result.stderr
    assert "quadratic" in result.stdout and "yes" in result.stdout and "NO" not in result.stdout


@pytest.mark.slow
def test_build_and_run_errors_are_clean(tmp_path):
    result = attnspec("run", str(tmp_path), "--tokens", "1 2")
    assert result.returncode == 2 and "not a build directory" in result.stderr and "Traceback" not in result.stderr
    result = attnspec("build", "specs/gateloop.yaml", "-o", str(tmp_path / "x"), "--set",
                      "layers[0].layers[0].mixer.mode=recurrent")
    assert result.returncode == 2 and "dynamic sequence length" in result.stderr
    assert not (tmp_path / "x").exists() and list(tmp_path.iterdir()) == []


def test_build_and_import_hf_write_no_programs_by_default_and_say_so(tmp_path):
    """The loop's commands read no exported program: build and import-hf write none unless asked, both --helps
    say so (a released model's 30 blocks cost minutes of tracing and a copy of the weights per program)."""
    for command in ("build", "import-hf"):
        shown = " ".join(attnspec(command, "--help").stdout.replace("│", " ").split())
        assert "Default: none (build and import-hf alike" in shown, shown
    built = attnspec("build", "specs/retnet.yaml", "-o", str(tmp_path / "b"), "--no-compile", "--no-calibrate",
                     "--set", "d_model=16", "--set", "layers[0].repeat=1")
    assert built.returncode == 0, built.stderr
    assert not list((tmp_path / "b").glob("*.pt2")) and (tmp_path / "b" / "model.safetensors").is_file()


def test_every_command_and_flag_the_docs_show_exists():
    """CLI truth: each `attnspec COMMAND ... --flag` written in the README and docs is a real command and flag."""
    import re

    from typer.testing import CliRunner

    from attnspec.cli import app

    runner = CliRunner()
    commands = {"check", "schema", "fmt", "explain", "build", "verify", "run", "train", "ablate", "report", "diagnose"}
    text = "\n".join(path.read_text() for path in [ROOT / "README.md", *(ROOT / "docs").glob("*.md")])
    shown: dict[tuple[str, ...], set[str]] = {}
    for match in re.finditer(r"attnspec((?: --plugin \S+)*) ([a-z-]+)(?: ([a-z-]+))?([^\n`|]*)", text):
        command, sub, rest = match.group(2), match.group(3), match.group(4)
        if command not in commands:
            continue  # prose: "attnspec never ..."
        key = (command, sub) if command == "diagnose" and sub else (command,)
        shown.setdefault(key, set()).update(re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", rest))
    assert len(shown) >= 10
    missing = []
    for key, flags in shown.items():
        result = runner.invoke(app, [*key, "--help"], terminal_width=200)
        if result.exit_code != 0:
            missing.append(f"attnspec {' '.join(key)}: no such command")
            continue
        options = set(re.findall(r"--[a-z][a-z0-9-]*", result.output))
        missing += [f"attnspec {' '.join(key)} {flag}" for flag in sorted(flags - options)]
    assert not missing, missing


def test_the_command_line_lets_idle_openmp_threads_sleep_unless_told_otherwise(tmp_path):
    """OMP_WAIT_POLICY=PASSIVE by default (benchmarks/threads.py: spinning threads collapse under load);
    a user's own setting is kept."""
    import os

    probe = ("import os, sys; sys.argv = ['attnspec', '--help']\nfrom attnspec.cli import main\n"
             "try:\n    main()\nexcept SystemExit:\n    pass\nprint('POLICY', os.environ.get('OMP_WAIT_POLICY'))")
    for given, expected in ((None, "PASSIVE"), ("ACTIVE", "ACTIVE")):
        env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"} | ({"OMP_WAIT_POLICY": given}
                                                                                if given else {})
        out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, cwd=tmp_path)
        assert f"POLICY {expected}" in out.stdout, out.stderr


def test_the_command_line_collects_garbage_less_often(tmp_path):
    """Young collections every 50,000 allocations in the command line (benchmarks/main_job.py: 0.3-0.6 s of
    the first token went to full collections of torch's objects); a plain ``import attnspec`` leaves the
    collector alone."""
    probe = ("import gc, sys; sys.argv = ['attnspec', '--help']\nimport attnspec\n"
             "print('LIBRARY', gc.get_threshold()[0])\nfrom attnspec.cli import main\n"
             "try:\n    main()\nexcept SystemExit:\n    pass\nprint('CLI', gc.get_threshold()[0])")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=tmp_path)
    assert "LIBRARY 700" in out.stdout and "CLI 50000" in out.stdout, out.stdout + out.stderr


@pytest.mark.parametrize("args, words", [
    (["eval", "nowhere", "--text", "t.txt", "--batch-size", "-1"], "--batch-size must be a whole number from 1"),
    (["eval", "nowhere", "--text", "t.txt", "--batch-size", "0"], "--batch-size must be"),
    (["eval", "nowhere", "--task", "t.jsonl", "--batch-size", str(10 ** 30)], "--batch-size must be"),
    (["eval", "nowhere", "--text", "t.txt", "--stride", "0"], "--stride must be a whole number from 1"),
    (["explain", "specs/gateloop.yaml", "--length", "0"], "--length must be a whole number from 1 to 1,048,576"),
    (["explain", "specs/gateloop.yaml", "--length", str(2 ** 21)], "--length must be"),
    (["explain", "specs/gateloop.yaml", "--batch", str(10 ** 30)], "--batch must be"),
    (["train", "specs/gateloop.yaml", "-o", "run", "--task", "mqar", "--nproc", "0"], "--nproc must be"),
    (["train", "specs/gateloop.yaml", "-o", "run", "--task", "mqar", "--nproc", str(10 ** 30)], "--nproc must be"),
])
def test_a_numeric_option_out_of_range_is_named_before_any_work(tmp_path, monkeypatch, args, words):
    """Each is checked before a model loads or a process starts (the directory "nowhere" is never read);
    `eval --text --batch-size -1` reported perplexity 1.0 with exit 0, `--nproc 10**30` started torchrun."""
    from typer.testing import CliRunner

    from attnspec.cli import app
    from attnspec.errors import AttnSpecError

    monkeypatch.chdir(ROOT)
    result = CliRunner().invoke(app, args)
    assert isinstance(result.exception, AttnSpecError) and words in str(result.exception), result.output
    assert not (ROOT / "run").exists()


def test_a_sweep_s_workers_and_threads_are_bounded():
    from attnspec.ablation.runners import sizing
    from attnspec.errors import AttnSpecError

    for workers, threads in [(0, None), (10 ** 30, None), (None, 0), (None, 10 ** 6), (True, None)]:
        with pytest.raises(AttnSpecError, match="--workers|--threads"):
            sizing(4, workers, threads)
    assert sizing(4, 2, 1) == (2, 1)


def test_a_build_summary_shows_a_run_of_alike_blocks_as_one_row():
    from attnspec.cli.display import runs_of_alike_blocks

    rows = [(f"blocks[{i}] (layers[0]#{i}.layers[0])", "delta: chunk" if i == 3 else "softmax: quadratic")
            for i in range(31)]
    assert runs_of_alike_blocks(rows) == [("blocks[0-2] x3", "softmax: quadratic"),
                                          ("blocks[3] (layers[0]#3.layers[0])", "delta: chunk"),
                                          ("blocks[4-30] x27", "softmax: quadratic")]
    assert runs_of_alike_blocks(rows[:1]) == rows[:1]


def test_a_build_reports_each_stage_as_it_goes_when_its_output_is_a_pipe(tmp_path):
    """Off a terminal (a pipe, a log file) each stage is a plain line the moment it starts or ends, not a
    display drawn at the end: the first line arrives while the build is still running."""
    small = ["d_model=16", "layers[0].repeat=1", "max_len=32", "input.vocab_size=32"]
    command = [sys.executable, "-m", "attnspec", "build", str(SPECS[0].parent / "retnet.yaml"), "-o",
               str(tmp_path / "build"), *[part for value in small for part in ("--set", value)]]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    first = process.stdout.readline()
    still_running = process.poll() is None
    rest, errors = process.communicate(timeout=600)
    assert process.returncode == 0, errors
    assert first.strip() == "parse..." and still_running
    lines = [first.strip(), *rest.splitlines()]
    assert "compile..." in lines and any(line.startswith("verify (") for line in lines)
    assert "traced by Dynamo + AOTAutograd, without Inductor" in rest  # the default level; --inductor deepens it
    refused = attnspec("build", str(SPECS[0]), "-o", str(tmp_path / "no"), "--no-compile", "--inductor")
    assert refused.returncode == 2 and "--no-compile" in refused.stderr and not (tmp_path / "no").exists()
