"""Training throughput: attnspec's models against a plain nanoGPT, in tokens per second.

    python benchmarks/train.py             # both tables (about 10 minutes on 2 cores)
    python benchmarks/train.py --quick     # L = 512 and 2048 only, fewer repeats

One training step is forward, cross-entropy, backward and an AdamW step, at 8192 tokens per step
(batch = 8192 / L), 2 layers, d_model 128, 4 heads, float32, on the CPU with every thread.

Table 1, at L = 512: attnspec's softmax spec (`specs/softmax-transformer.yaml`, learned positions)
and the plain nanoGPT of tests/training/reference.py (SDPA), each eager and compiled, and the spec
with its tied head unscaled (`head.scale: 1`, the behaviour before the default scale) eager
(torch.compile fullgraph, fixed shapes); the ratio is attnspec / reference tokens per second (target
>= 0.9), and the compile time is the first compiled step.

Table 2, eager, at L = 512, 2048, 8192: the linear specs (each mixer in the mode the planner chooses
for training at that batch and length) against the nanoGPT reference at the same length; ratio > 1
means faster than softmax attention (target from L = 2048).

Table 3, at L = 512 and 2048: each linear spec's training step compiled (as `attnspec train
--compile` does) against eager, and the compile time (first compiled step).

Table 4, at real sizes (``--tables 4``; minutes), ``benchmarks/scale.py``'s ``135m`` and ``hybrid-135m``: a SmolLM-135M-shaped Llama (30 blocks, width 576,
GQA 9/3, vocabulary 49,152) and a Qwen3-Next-shaped hybrid of ~120M (three Gated DeltaNet per gated
attention), each imported from a random transformers model (``attnspec import-hf``, float32) and
trained one step at a time beside that transformers model (plain PyTorch: transformers' own modules,
eager SDPA; the hybrid's Gated DeltaNet in transformers' torch chunked form), same weights, L = 256,
batch 2, float32, eager; the ratio is attnspec / transformers tokens per second (target >= 1.0).

Candidates are interleaved (A B A B ...) and the median of the repeats is reported, since these
machines are noisy.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import attnspec  # noqa: E402
from attnspec.compiler.plan import plan_spec  # noqa: E402
from attnspec.training.optim import make_optimizer, parameter_groups  # noqa: E402
from tests.training.reference import NanoGPT  # noqa: E402

TOKENS = 8192
VOCAB = 512
SHAPE = ["d_model=128", "layers[0].repeat=2", "input.vocab_size=512"]
LINEAR = ["linear-elu", "cosformer", "retnet", "gateloop"]


def attnspec_step(name: str, L: int, batch: int, extra=()):
    overrides = [*SHAPE, f"max_len={L}", *extra]
    if name == "gateloop":
        overrides[0] = "d_model=128"
    if name == "cosformer":
        overrides.append(f"layers[0].layers[0].mixer.reweighting.M={L}")
    model = attnspec.build(ROOT / "specs" / f"{name}.yaml", *overrides)
    plan = plan_spec(model.spec, L, batch=batch, training=True)
    model.set_modes(plan.full_modes)
    model.train()
    optimizer = make_optimizer(model, parameter_groups(model), lr=1e-4, weight_decay=0.1, betas=(0.9, 0.98))
    return model, optimizer, plan.full_modes[0]


def reference_step(L: int):
    model = NanoGPT(VOCAB, 128, 2, 4, L)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-4), "sdpa"


def make_step(model, optimizer, compiled: bool):
    loss_fn = lambda x, y: F.cross_entropy(model(x).flatten(0, 1), y.flatten())  # noqa: E731
    if compiled:
        loss_fn = torch.compile(loss_fn, fullgraph=True, dynamic=False)

    def step(x, y):
        optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(x, y)
        loss.backward()
        optimizer.step()
    return step


def measure(candidates: dict, L: int, batch: int, repeats: int, vocab: int = VOCAB) -> tuple[dict, dict]:
    """Interleaved timing: tokens/s (median) per candidate, and the first-call seconds (compile)."""
    x = torch.randint(0, vocab, (batch, L))
    y = torch.randint(0, vocab, (batch, L))
    first = {}
    for name, step in candidates.items():
        start = time.perf_counter()
        step(x, y)
        first[name] = time.perf_counter() - start
    times = {name: [] for name in candidates}
    for _ in range(repeats):
        for name, step in candidates.items():
            start = time.perf_counter()
            step(x, y)
            times[name].append(time.perf_counter() - start)
    return {name: batch * L / statistics.median(t) for name, t in times.items()}, first


def table_compiled(repeats: int) -> None:
    L, batch = 512, TOKENS // 512
    candidates = {}
    for compiled in (False, True):
        tag = "compiled" if compiled else "eager"
        model, optimizer, _ = attnspec_step("softmax-transformer", L, batch, ["position=learned"])
        candidates[f"attnspec softmax, {tag}"] = make_step(model, optimizer, compiled)
        model, optimizer, _ = reference_step(L)
        candidates[f"nanoGPT reference, {tag}"] = make_step(model, optimizer, compiled)
    # the tied head before initialisation was spec data (unscaled: logits of std ~11, whose cross-entropy
    # exponentiates through a slow path); the default scales it by 1/d_model (README "Initialisation")
    model, optimizer, _ = attnspec_step("softmax-transformer", L, batch, ["position=learned", "head.scale=1.0"])
    candidates["attnspec softmax head.scale 1, eager"] = make_step(model, optimizer, False)
    rates, first = measure(candidates, L, batch, repeats)
    print(f"\nTable 1: softmax spec vs nanoGPT, L = {L}, batch {batch}, {torch.get_num_threads()} threads")
    print(f"{'candidate':34} {'tokens/s':>10} {'ratio':>7} {'first step s':>13}")
    for name, rate in rates.items():
        tag = name.rsplit(", ", 1)[1]
        ratio = rate / rates[f"nanoGPT reference, {tag}"]
        print(f"{name:34} {rate:10.0f} {ratio:7.2f} {first[name]:13.1f}")


def table_lengths(lengths: list[int], repeats: int) -> None:
    print("\nTable 2: linear specs vs the nanoGPT reference, eager, 8192 tokens per step")
    print(f"{'L':>6} {'spec':22} {'mode':10} {'tokens/s':>10} {'vs reference':>13}")
    for L in lengths:
        batch = TOKENS // L
        candidates, modes = {}, {}
        model, optimizer, modes["nanoGPT reference"] = reference_step(L)
        candidates["nanoGPT reference"] = make_step(model, optimizer, False)
        for name in LINEAR:
            model, optimizer, modes[name] = attnspec_step(name, L, batch)
            candidates[name] = make_step(model, optimizer, False)
        rates, _ = measure(candidates, L, batch, repeats)
        for name, rate in rates.items():
            print(f"{L:6} {name:22} {modes[name]:10} {rate:10.0f} {rate / rates['nanoGPT reference']:13.2f}")


def table_compile_linear(lengths: list[int], repeats: int) -> None:
    """Compiled against eager training steps of the linear specs (the issue-14 target: >= 1.3x at
    L >= 512, compiled in <= 20 s), each in the mode the training plan chooses."""
    print("\nTable 3: linear specs, compiled / eager training step, 8192 tokens per step")
    print(f"{'L':>6} {'spec':14} {'mode':10} {'eager tok/s':>12} {'compiled tok/s':>15} {'ratio':>6} {'compile s':>10}")
    for L in lengths:
        batch = TOKENS // L
        for name in LINEAR:
            candidates, modes = {}, {}
            for compiled in (False, True):
                model, optimizer, modes[name] = attnspec_step(name, L, batch)
                candidates[compiled] = make_step(model, optimizer, compiled)
            rates, first = measure(candidates, L, batch, repeats)
            print(f"{L:6} {name:14} {modes[name]:10} {rates[False]:12.0f} {rates[True]:15.0f} "
                  f"{rates[True] / rates[False]:6.2f} {first[True]:10.1f}", flush=True)


REAL_SIZES = ("135m", "hybrid-135m")
"""Sizes of ``benchmarks/scale.py`` (its ``SIZES``: one definition of each shape) trained in table 4."""


def table_real_sizes(repeats: int) -> None:
    """attnspec's import of a transformers model against that model, one training step each (module doc)."""
    import tempfile

    import transformers as tf

    from attnspec.compiler.load import load_weights
    from attnspec.interop.convert import import_hf

    sys.path.insert(0, str(ROOT / "benchmarks"))
    from scale import SIZES

    L, batch = 256, 2
    print(f"\nTable 4: real sizes, attnspec / transformers training step, L = {L}, batch {batch}, float32, eager, "
          f"{torch.get_num_threads()} thread(s)")
    print(f"{'model':12} {'params':>8} {'transformers tok/s':>19} {'attnspec tok/s':>15} {'ratio':>6}")
    for name in REAL_SIZES:
        config_class, fields = SIZES[name]
        torch.manual_seed(0)
        reference = getattr(tf, config_class.replace("Config", "ForCausalLM"))(getattr(tf, config_class)(**fields))
        with tempfile.TemporaryDirectory(prefix="attnspec-train-bench-") as work:
            reference.save_pretrained(f"{work}/hf")
            import_hf(f"{work}/hf", f"{work}/ours", compile_check=False, calibrate=False, check=False,
                      dtype="float32")
            ours = attnspec.build(Path(work) / "ours" / "spec.yaml")
            load_weights(ours, Path(work) / "ours" / "model.safetensors")
        ours.set_modes(plan_spec(ours.spec, L, batch=batch, training=True).full_modes)
        reference.train()
        ours.train()
        steps = {}
        for tag, model, forward in (("transformers", reference, lambda m, x: m(x).logits),
                                    ("attnspec", ours, lambda m, x: m(x))):
            optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)

            def step(x, y, model=model, forward=forward, optimizer=optimizer):
                optimizer.zero_grad(set_to_none=True)
                F.cross_entropy(forward(model, x).flatten(0, 1).float(), y.flatten()).backward()
                optimizer.step()
            steps[tag] = step
        rates, _ = measure(steps, L, batch, repeats, vocab=fields["vocab_size"])
        parameters = sum(p.numel() for p in ours.parameters())
        print(f"{name:12} {parameters / 1e6:7.1f}M {rates['transformers']:19.0f} {rates['attnspec']:15.0f} "
              f"{rates['attnspec'] / rates['transformers']:6.2f}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--tables", default="123", help="which tables to print, e.g. 3 (4: real sizes, on request)")
    args = parser.parse_args()
    repeats = 3 if args.quick else 5
    print(f"torch {torch.__version__}")
    if "1" in args.tables:
        table_compiled(repeats)
    if "2" in args.tables:
        table_lengths([512, 2048] if args.quick else [512, 2048, 8192], repeats)
    if "3" in args.tables:
        table_compile_linear([512] if args.quick else [512, 2048], repeats)
    if "4" in args.tables:
        table_real_sizes(repeats)


if __name__ == "__main__":
    main()
