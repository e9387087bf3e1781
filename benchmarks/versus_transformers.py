"""Generation side by side with transformers: the same released model (random tiny weights, built from its
config here; nothing is downloaded), imported into attnspec, generating 32 greedy tokens after a prompt.

    python benchmarks/versus_transformers.py                    # llama, mamba2, qwen3_next at 1 thread
    python benchmarks/versus_transformers.py --models llama --aot
    python benchmarks/versus_transformers.py --layers           # the layers' own steps, the delta chunk forward

Candidates, timed interleaved (median of --rounds): transformers' ``generate`` with its DynamicCache and
with ``cache_implementation="static"``; attnspec's eager ``model.generate``; the exported ``step.pt2``
(the prompt through the eager prefill, then the program's steps, the state sized to the generation as
eager's is); with ``--aot`` its AOTInductor package,
after the eager prefill and after the prefill's own package (the pair a build with ``--aot`` ships,
``prefill.aoti.pt2`` and ``step.aoti.pt2``).
Columns are seconds for transformers' DynamicCache and the ratio of every candidate to it (and to the
StaticCache): below 1.00 attnspec is faster. Before timing, each attnspec candidate's tokens are checked
equal to transformers' (greedy). Run at one intra-op thread by default (--threads): on these 2-core
machines two threads collapse when anything else holds a core.

With ``--layers``, the layers alone: one decoding step of Mamba2's mixer and of Qwen3-Next's Gated DeltaNet
(transformers' ``Mamba2Mixer`` / ``Qwen3NextGatedDeltaNet`` with its cache against the imported block's
mixer ``step``, after a prompt, outputs checked equal first), and the gated delta rule's chunked forward
without gradients at --delta-length (transformers' ``torch_chunk_gated_delta_rule`` against
``attnspec.ops.delta.delta_rule``, chunk 64, Qwen3-Next's widths).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from attnspec.compiler.export import export_prefill, export_step  # noqa: E402
from attnspec.interop.convert import convert_weights, spec_from_checkpoint  # noqa: E402
from attnspec.nn.generate import decode  # noqa: E402
from attnspec.nn.model import build_model_from_spec  # noqa: E402

NEW_TOKENS = 32
VOCAB = 8192


def _reference(name: str, max_len: int):
    """The transformers model ``name`` at the widths of the issue's measurements, weights drawn here."""
    import transformers as tf

    if name == "llama":
        config = tf.LlamaConfig(vocab_size=VOCAB, hidden_size=256, intermediate_size=688, num_hidden_layers=4,
                                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=max_len)
        return tf.LlamaForCausalLM(config)
    if name == "mamba2":
        config = tf.Mamba2Config(vocab_size=VOCAB, hidden_size=256, num_heads=8, head_dim=64, expand=2,
                                 state_size=64, n_groups=1, num_hidden_layers=4, chunk_size=64)
        return tf.Mamba2ForCausalLM(config)
    if name == "qwen3_next":  # Gated DeltaNet x3 then gated attention, dense MLPs
        config = tf.Qwen3NextConfig(vocab_size=VOCAB, hidden_size=256, intermediate_size=688, num_hidden_layers=4,
                                    num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                                    linear_num_value_heads=4, linear_num_key_heads=2, linear_key_head_dim=64,
                                    linear_value_head_dim=64, num_experts=0, max_position_embeddings=max_len)
        return tf.Qwen3NextForCausalLM(config)
    raise SystemExit(f"unknown model {name!r}: llama, mamba2 or qwen3_next")


def _perturbed(name: str, max_len: int):
    """:func:`_reference` in eval mode with its weights perturbed (seed 0): no zero-initialised part may
    hide a difference."""
    torch.manual_seed(0)
    reference = _reference(name, max_len).eval()
    with torch.no_grad():
        for parameter in reference.parameters():
            parameter.add_(0.02 * torch.randn_like(parameter))
    return reference


def _imported(reference, scratch: Path, max_len: int):
    """``reference`` saved and imported into attnspec (the path ``attnspec import-hf`` takes)."""
    reference.save_pretrained(scratch)
    spec = spec_from_checkpoint(scratch, max_len=max_len)[1]
    model = build_model_from_spec(spec)
    model.load_state_dict(convert_weights(spec, scratch, spec_from_checkpoint(scratch, max_len=max_len)[2]))
    return model.eval()


def _candidates(reference, model, scratch: Path, aot: bool) -> dict:
    """name -> generate(prompt (B, T)) -> (B, T + NEW_TOKENS) int64."""
    def transformers_generate(**options):
        return lambda prompt: reference.generate(prompt, attention_mask=torch.ones_like(prompt),
                                                 max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS,
                                                 do_sample=False, pad_token_id=0, **options)

    def program_generate(step, prefill=None):
        def run(prompt):  # the state sized to the generation, as eager generate sizes it (the programs take any)
            capacity = prompt.shape[1] + NEW_TOKENS
            state = lambda: model.init_state(prompt.shape[0], capacity)  # noqa: E731  (made if a prompt is stepped)
            into = (lambda tokens: prefill(tokens, *state())) if prefill else \
                (lambda tokens: model.prefill(tokens, last_only=True, capacity=capacity))
            return decode(step, state, prompt, NEW_TOKENS, temperature=0, prefill=into)
        return run

    candidates = {"transformers DynamicCache": transformers_generate(),
                  "transformers StaticCache": transformers_generate(cache_implementation="static"),
                  "attnspec eager": lambda prompt: model.generate(prompt, NEW_TOKENS, temperature=0)}
    program = export_step(model, scratch / "step.pt2")
    candidates["attnspec step.pt2"] = program_generate(program.module())
    if aot:
        from torch._inductor import aoti_compile_and_package, aoti_load_package

        step = aoti_load_package(aoti_compile_and_package(program, package_path=str(scratch / "step.aoti.pt2")))
        candidates["attnspec step.aoti.pt2"] = program_generate(step)
        prefill = aoti_compile_and_package(export_prefill(model, scratch / "prefill.pt2"),
                                           package_path=str(scratch / "prefill.aoti.pt2"))
        candidates["attnspec prefill + step .aoti.pt2"] = program_generate(step, aoti_load_package(prefill))
    return candidates


def _seconds(generate, prompt: torch.Tensor) -> tuple[float, torch.Tensor]:
    with torch.no_grad():
        start = time.perf_counter()
        out = generate(prompt)
        return time.perf_counter() - start, out


def _median_seconds(candidates: dict, rounds: int, repeats: int) -> dict:
    """name -> median over ``rounds`` (interleaved) of the seconds of ``repeats`` calls of candidates[name]()."""
    times = {name: [] for name in candidates}
    for _ in range(rounds):
        for name, call in candidates.items():
            start = time.perf_counter()
            for _ in range(repeats):
                call()
            times[name].append((time.perf_counter() - start) / repeats)
    return {name: statistics.median(values) for name, values in times.items()}


def _layer_steps(name: str, batch: int, prompt_length: int, rounds: int) -> dict:
    """Seconds per one-token step of layer 0's mixer: transformers' layer with its cache and attnspec's."""
    reference = _perturbed(name, prompt_length + 64)
    with torch.no_grad():
        with tempfile.TemporaryDirectory() as scratch:
            model = _imported(reference, Path(scratch), prompt_length + 64)
        prompt = torch.randint(0, VOCAB, (batch, prompt_length), generator=torch.Generator().manual_seed(1))
        cache = reference(prompt, use_cache=True).past_key_values
        layer = reference.backbone.layers[0].mixer if name == "mamba2" else reference.model.layers[0].linear_attn
        state = model.prefill(prompt, last_only=True)[1:]
        position, mixer_state = state[0], state[1:1 + model.state_layout()[0]]
        mixer = model.blocks[0].mixer
        x = torch.randn(batch, 1, 256, generator=torch.Generator().manual_seed(2))
        theirs = layer(x, cache=cache)
        ours = mixer.step(x[:, 0], mixer_state, position)[0]
        error = (ours - theirs[:, 0]).abs().max().item()
        if error > 1e-4:
            print(f"note: {name} layer step differs from transformers' by {error:.1e}")
        return _median_seconds({"transformers": lambda: layer(x, cache=cache),
                                "attnspec": lambda: mixer.step(x[:, 0], mixer_state, position)}, rounds, 50)


def _delta_chunk_forward(length: int, rounds: int) -> dict:
    """Seconds of the gated delta rule's chunked forward (no gradients), B 1, 4 heads of 64, chunk 64."""
    from transformers.models.qwen3_next.modeling_qwen3_next import torch_chunk_gated_delta_rule

    from attnspec.ops.delta import delta_rule

    g = torch.Generator().manual_seed(0)
    B, H, D = 1, 4, 64
    q, k = (F.normalize(torch.randn(B, H, length, D, generator=g), dim=-1) for _ in range(2))
    v = torch.randn(B, H, length, D, generator=g)
    beta = torch.rand(B, H, length, generator=g)
    log_a = -torch.rand(B, H, length, generator=g) * 0.1
    scale = D ** -0.5
    with torch.no_grad():
        theirs = torch_chunk_gated_delta_rule(*(t.transpose(1, 2) for t in (q, k, v, log_a, beta)), chunk_size=64)[0]
        ours = delta_rule(q, k, v, beta, log_a, mode="chunk", scale=scale, chunk_size=64)
        error = (ours - theirs.transpose(1, 2)).abs().max().item()
        if error > 1e-4:
            print(f"note: the delta chunk forward differs from transformers' by {error:.1e}")
        return _median_seconds({
            "transformers": lambda: torch_chunk_gated_delta_rule(*(t.transpose(1, 2) for t in (q, k, v, log_a, beta)),
                                                                 chunk_size=64),
            "attnspec": lambda: delta_rule(q, k, v, beta, log_a, mode="chunk", scale=scale, chunk_size=64)}, rounds, 1)


def layers_table(batches: list[int], prompt_length: int, delta_length: int, rounds: int) -> Table:
    """The layer-level rows: mixer steps of mamba2 and qwen3_next's Gated DeltaNet, and the delta chunk forward."""
    table = Table(title=f"layers: attnspec / transformers (torch {torch.__version__}, "
                        f"{torch.get_num_threads()} thread(s))")
    for column in ("layer", "shape", "transformers ms", "attnspec ms", "ratio"):
        table.add_column(column, justify="left" if column in ("layer", "shape") else "right")
    rows = [(f"{name} mixer step", f"B {batch}, after {prompt_length}", _layer_steps(name, batch, prompt_length, rounds))
            for name in ("mamba2", "qwen3_next") for batch in batches]
    rows.append(("gated delta rule chunk forward", f"B 1, H 4, L {delta_length}, D 64",
                 _delta_chunk_forward(delta_length, rounds)))
    for layer, shape, seconds in rows:
        table.add_row(layer, shape, f"{seconds['transformers'] * 1e3:.3f}", f"{seconds['attnspec'] * 1e3:.3f}",
                      f"{seconds['attnspec'] / seconds['transformers']:.2f}")
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="*", default=["llama", "mamba2", "qwen3_next"])
    parser.add_argument("--prompts", nargs="*", type=int, default=[256, 1536])
    parser.add_argument("--batches", nargs="*", type=int, default=[1, 16])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--aot", action="store_true", help="also the step's AOTInductor package (minutes to build)")
    parser.add_argument("--layers", action="store_true", help="the layers' own steps and the delta chunk forward")
    parser.add_argument("--delta-length", type=int, default=8192)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.layers:
        Console(width=160).print(layers_table(args.batches, min(args.prompts), args.delta_length, args.rounds))
        return
    max_len = max(args.prompts) + NEW_TOKENS
    table = Table(title=f"generate {NEW_TOKENS} greedy tokens: attnspec / transformers "
                        f"(torch {torch.__version__}, {torch.get_num_threads()} thread(s))")
    for column in ("model", "prompt", "batch", "candidate", "seconds", "/ Dynamic", "/ Static"):
        table.add_column(column, justify="left" if column in ("model", "candidate") else "right")
    for name in args.models:
        with tempfile.TemporaryDirectory() as scratch:
            reference = _perturbed(name, max_len)
            model = _imported(reference, Path(scratch), max_len)
            candidates = _candidates(reference, model, Path(scratch), args.aot)
            for prompt_length in args.prompts:
                for batch in args.batches:
                    prompt = torch.randint(0, VOCAB, (batch, prompt_length), generator=torch.Generator().manual_seed(1))
                    expected = _seconds(candidates["transformers DynamicCache"], prompt)[1]
                    for candidate, generate in candidates.items():  # warm-up, and the tokens checked
                        out = _seconds(generate, prompt)[1]
                        if not torch.equal(out, expected):
                            print(f"note: {name} {candidate}: tokens differ from transformers' at prompt "
                                  f"{prompt_length}, batch {batch}")
                    times = {candidate: [] for candidate in candidates}
                    for _ in range(args.rounds):  # interleaved
                        for candidate, generate in candidates.items():
                            times[candidate].append(_seconds(generate, prompt)[0])
                    median = {candidate: statistics.median(values) for candidate, values in times.items()}
                    dynamic, static = median["transformers DynamicCache"], median["transformers StaticCache"]
                    for candidate, seconds in median.items():
                        table.add_row(name, str(prompt_length), str(batch), candidate, f"{seconds:.3f}",
                                      f"{seconds / dynamic:.2f}", f"{seconds / static:.2f}")
    Console(width=160).print(table)


if __name__ == "__main__":
    main()
