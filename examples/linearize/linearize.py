"""Linearizing a softmax language model trained here: how much of its quality comes back, against the same students
trained from scratch on as many tokens.

The corpus and tokenizer are examples/text/packed_lm.py's (the Python documentation's topics, a byte-level BPE of
1,024 ids). The script

1. trains the teacher: softmax attention (RoPE) with GLU MLPs, 4 blocks at d 64, 4 heads, length 128;
2. linearizes it into each student, every seed: the teacher's weights where they fit (q/k/v/o of the swapped
   attention too), then one staged run (:mod:`attnspec.training`'s `stages`): attention transfer of the new mixers
   (all else frozen), then a low-rank fine-tune on the text (LoRA of rank 8 on the new mixers' q/k/v/o, as LoLCATs;
   their other parts, gates and feature maps, trained too; everything else frozen);
3. trains each student from scratch (random weights, every parameter, the task's loss) for as many steps;
4. writes OUT/results.md: held-out perplexity per seed, the teacher's, tokens and wall time.

The students: LoLCATs' sliding window + linear attention (`scatterbrain`, a local support, learnt window factors),
Gated DeltaNet, Mamba2 (as Mamba-in-the-Llama maps attention: C, B, x from q, k, v), each in every block, and a hybrid
keeping the last block's attention (one in four) with Gated DeltaNet in the others.

    python examples/linearize/linearize.py OUT                    # the table in OUT/results.md
    python examples/linearize/linearize.py OUT --steps 20 --seeds 1 --teacher-steps 20    # a smoke run
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

ATTENTION = {"kind": "softmax", "heads": 4, "position": {"kind": "rope"}}
STUDENTS = {
    "lolcats": {"kind": "scatterbrain", "heads": 4, "position": {"kind": "rope"},
                "lowrank": {"kind": "linear", "feature_map": "softplus", "scaled_inputs": False},
                "sparse": {"kind": "local", "window": 16}, "sparse_weight": True, "sparse_scale": "row_max"},
    "gated-deltanet": {"kind": "delta", "heads": 4, "feature_map": "l2norm", "transition": {"kind": "mamba",
                       "per": "head"}, "beta": "sigmoid", "group_norm": True, "shared_norm_weight": True,
                       "output_gate": "swish"},
    "mamba2": {"kind": "linear", "heads": 4, "feature_map": "identity", "normalize": False, "scale": 1.0,
               "transition": {"kind": "mamba", "per": "head", "scale_input": True}, "skip": True, "group_norm": True,
               "output_gate": "swish", "gate_before_norm": True, "norm_eps": 1.0e-5},
}
"""Each student's mixer; `hybrid` is Gated DeltaNet with the last block's attention kept."""
BLOCKS = 4


def _packed_lm():
    """examples/text/packed_lm.py, for its corpus and tokenizer."""
    source = importlib.util.spec_from_file_location("packed_lm", ROOT / "examples" / "text" / "packed_lm.py")
    module = importlib.util.module_from_spec(source)
    source.loader.exec_module(module)
    return module


def model_spec(mixers: list[dict], *, vocab_size: int, d_model: int, seq_len: int, seed: int = 0) -> dict:
    """Pre-norm blocks of ``mixers`` with GLU MLPs and RMSNorms."""
    return {"name": "linearize", "input": {"kind": "tokens", "vocab_size": vocab_size}, "d_model": d_model,
            "max_len": seq_len, "seed": seed,
            "layers": [{"mixer": mixer, "mlp": {"kind": "glu", "expansion": 2}, "norm": "rmsnorm"} for mixer in mixers]}


def student_mixers(name: str) -> tuple[list[dict], list[int]]:
    """The student's mixers, block by block, and the blocks it swaps."""
    if name == "hybrid":
        return [STUDENTS["gated-deltanet"]] * (BLOCKS - 1) + [ATTENTION], list(range(BLOCKS - 1))
    return [STUDENTS[name]] * BLOCKS, list(range(BLOCKS))


def linearize(teacher: Path, spec: dict, swapped: list[int], task: dict, *, transfer_steps: int, tune_steps: int,
              seed: int, output: Path):
    """One staged run: transfer, then a low-rank fine-tune; the kept blocks' mixers frozen throughout."""
    import attnspec

    kept = [f"blocks.{i}.mixer.*" for i in range(BLOCKS) if i not in swapped]
    frozen = ["embed.*", "head.*", "final_norm.*", "blocks.*.norm*", "blocks.*.mlp.*", *kept]
    adapted = [f"blocks.{i}.mixer.{name}" for i in swapped for name in ("q_proj", "k_proj", "v_proj", "out_proj")]
    return attnspec.train(spec, {"task": task, "seed": seed, "batch_size": 16, "eval_every": 0, "test_examples": 64,
                                 "init_weights": str(teacher), "transfer": {"teacher": str(teacher)},
                                 "stages": [{"objective": "transfer", "steps": transfer_steps, "lr": 0.01,
                                             "freeze": frozen},
                                            {"objective": "lm", "steps": tune_steps, "lr": 0.003, "freeze": frozen,
                                             "lora": {"targets": adapted, "rank": 8, "alpha": 16.0}}]},
                          output=output)


def main(argv: list[str] | None = None) -> Path:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--teacher-steps", type=int, default=600)
    parser.add_argument("--steps", type=int, default=300, help="each student's steps: a third transfer, the rest "
                        "fine-tuning; the scratch students train as many")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--d-model", type=int, default=64)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--vocab-size", type=int, default=1024)
    parser.add_argument("--students", nargs="+", default=[*STUDENTS, "hybrid"])
    args = parser.parse_args(argv)

    import attnspec

    text = _packed_lm()
    corpus = text.write_corpus(args.out / "corpus")
    tokenizer = text.train_tokenizer(corpus, args.out / "tokenizer.json", args.vocab_size)
    task = {"kind": "text", "path": str(corpus), "tokenizer": str(tokenizer), "seq_len": args.seq_len,
            "packing": "pack"}
    sizes = {"vocab_size": args.vocab_size, "d_model": args.d_model, "seq_len": args.seq_len}
    started = time.perf_counter()
    teacher_dir = args.out / "runs" / "teacher"
    teacher = attnspec.train(model_spec([ATTENTION] * BLOCKS, **sizes),
                             {"task": task, "steps": args.teacher_steps, "batch_size": 16, "lr": 0.02,
                              "eval_every": 0, "test_examples": 64}, output=teacher_dir)
    rows = [{"student": "teacher (softmax)", "how": f"trained {args.teacher_steps} steps",
             "perplexity": [teacher.metrics["perplexity"]], "seconds": time.perf_counter() - started,
             "tokens": args.teacher_steps * 16 * args.seq_len}]
    transfer_steps = max(1, args.steps // 3)
    for name in args.students:
        mixers, swapped = student_mixers(name)
        for how in ("linearized", "scratch"):
            perplexities, seconds = [], 0.0
            for seed in range(args.seeds):
                spec = model_spec(mixers, **sizes, seed=seed)
                output = args.out / "runs" / f"{name}-{how}-{seed}"
                start = time.perf_counter()
                if how == "linearized":
                    run = linearize(teacher_dir, spec, swapped, task, transfer_steps=transfer_steps,
                                    tune_steps=args.steps - transfer_steps, seed=seed, output=output)
                else:
                    run = attnspec.train(spec, {"task": task, "steps": args.steps, "batch_size": 16, "lr": 0.02,
                                                "seed": seed, "eval_every": 0, "test_examples": 64}, output=output)
                seconds += time.perf_counter() - start
                perplexities.append(run.metrics["perplexity"])
            rows.append({"student": name, "how": how, "perplexity": perplexities, "seconds": seconds / args.seeds,
                         "tokens": args.steps * 16 * args.seq_len})
    (args.out / "results.json").write_text(json.dumps(rows, indent=2))
    lines = ["| student | how | held-out perplexity: mean (per seed) | tokens | seconds per run |", "|---|---|---|---|---|"]
    for row in rows:
        values = row["perplexity"]
        mean = sum(values) / len(values)
        lines.append(f"| {row['student']} | {row['how']} | {mean:.1f} ({', '.join(f'{v:.1f}' for v in values)}) | "
                     f"{row['tokens']:,} | {row['seconds']:.0f} |")
    report = args.out / "results.md"
    report.write_text("\n".join(lines) + "\n")
    print(report.read_text())
    return report


if __name__ == "__main__":
    main()
