"""The chunk mode's CPU kernel (attnspec.ops.linear.backends.native) against the float64 reference, and when it is used.

Tolerance: float32 within 1e-4 relative RMS of the float64 reference, as for every float32 mode
(test_linear_attention.py): the kernel sums the same O(C + Dk) terms per entry in float32, with
in-chunk log-decays accumulated in float64 like the graph path (observed 1e-7 to 5e-7).
"""

from __future__ import annotations

import platform
import warnings

import pytest
import torch
import torch.nn.functional as F

from attnspec.errors import ShapeError
from attnspec.ops import Decay, linear_attention
from attnspec.ops.linear.backends import native
from attnspec.ops.linear import LOG_ZERO
from attnspec.ops.linear.backends.native import NativeBuildError, build, forward_into, load
from attnspec.ops.linear.naive import linear_attention_reference

TOLERANCE = 1e-4


def rel_rms(a, b):
    """Relative RMS error of ``a`` against ``b`` (complex tensors as pairs of real ones), in float64."""
    a, b = (torch.view_as_real(t.to(torch.complex128)) if t.is_complex() else t.double() for t in (a, b))
    return ((a - b).pow(2).mean().sqrt() / b.pow(2).mean().sqrt().clamp_min(1e-300)).item()


def strided_inputs(B, H, L, Dk, Dv, decay):
    """float32 q, k, v laid out (B, L, H, D) and viewed as (B, H, L, D), as a mixer's projections give them,
    and a per-head log-decay (B, H, L): None, real, or complex ("complex..."); "...resets" puts a = 0 at
    every 17th position."""
    q, k, v = (torch.randn(B, L, H, D).transpose(1, 2) for D in (Dk, Dk, Dv))
    log_a = None
    if decay != "none":
        log_a = F.logsigmoid(torch.randn(B, L, H) + 3).transpose(1, 2)
        if decay.endswith("resets"):
            log_a = log_a.clone()
            log_a[:, :, ::17] = float("-inf")
        if decay.startswith("complex"):
            log_a = torch.complex(log_a, torch.randn(B, L, H).transpose(1, 2))
    return q, k, v, log_a


def kernel(q, k, v, log_a=None, initial=None, scale=1.0, chunk_size=64):
    """The kernel writing into NaN-filled buffers (an element it forgets stays NaN): ``(out, final state)``,
    the final state complex for a complex ``log_a``. ``log_a`` and ``initial`` may be complex."""
    B, H, L, Dk = q.shape
    out = torch.full((B, H, L, v.shape[-1]), float("nan"))
    final, final_im = (torch.full((B, H, Dk, v.shape[-1]), float("nan")) for _ in range(2))
    log_mag = phase = initial_im = None
    if log_a is not None:
        log_mag, phase = (log_a.real, log_a.imag) if log_a.is_complex() else (log_a, None)
    if initial is not None and initial.is_complex():
        initial, initial_im = initial.real, initial.imag
    forward_into(q, k, v, log_mag, phase, initial, initial_im, scale, chunk_size, LOG_ZERO, out, final, final_im)
    if phase is None:
        assert torch.all(final_im == 0)
        return out, final
    return out, torch.complex(final, final_im)


@pytest.mark.parametrize("B, H, L, Dk, Dv, chunk_size", [
    (1, 1, 1, 5, 3, 64),  # one position
    (2, 3, 63, 60, 60, 64),  # a single short chunk; 2 x 3 heads shared by 2 threads
    (1, 2, 500, 60, 65, 64),  # a partial last chunk, Dv not a multiple of the vector width
    (1, 2, 300, 17, 31, 37),  # an odd chunk size; Dv one short of two 16-lane vectors
    (1, 1, 40, 8, 8, 1),  # chunks of one position: the recurrence itself
    (1, 1, 130, 60, 65, 64),  # one head, two threads: its value columns are split between them
])
@pytest.mark.parametrize("decay", ["none", "real", "real-resets", "complex", "complex-resets"])
@pytest.mark.parametrize("with_initial_state", [False, True])
def test_kernel_matches_the_float64_reference(B, H, L, Dk, Dv, chunk_size, decay, with_initial_state):
    q, k, v, log_a = strided_inputs(B, H, L, Dk, Dv, decay)
    S0 = None
    if with_initial_state:
        S0 = torch.randn(B, H, Dv, Dk).transpose(-1, -2)  # strided too
        if decay.startswith("complex"):
            S0 = torch.complex(S0, torch.randn(B, H, Dk, Dv))
    out, final = kernel(q, k, v, log_a, S0, scale=0.7, chunk_size=chunk_size)
    expected, expected_state, _ = linear_attention_reference(
        q.double(), k.double(), v.double(), None if log_a is None else log_a.to(torch.complex128), scale=0.7,
        S0=None if S0 is None else S0.to(torch.complex128))
    assert torch.isfinite(out).all() and torch.isfinite(final).all()
    assert rel_rms(out, expected) <= TOLERANCE
    assert rel_rms(final, expected_state if final.is_complex() else expected_state.real) <= TOLERANCE


def test_linear_attention_normalised_with_state_continuation_on_the_kernel(monkeypatch):
    calls = spy_on_kernel(monkeypatch)
    q, k, v, log_a = strided_inputs(2, 2, 150, 12, 7, "real")
    q, k = q.abs() + 0.1, k.abs() + 0.1
    S0, z0 = torch.rand(2, 2, 12, 7), torch.rand(2, 2, 12) + 0.5
    with torch.no_grad():
        whole, (S, z) = linear_attention(q, k, v, log_a, normalize=True, initial_state=(S0, z0), return_state=True,
                                         chunk_size=32)
        first, state = linear_attention(q[:, :, :70], k[:, :, :70], v[:, :, :70], log_a[:, :, :70], normalize=True,
                                        initial_state=(S0, z0), return_state=True, chunk_size=32)
        second = linear_attention(q[:, :, 70:], k[:, :, 70:], v[:, :, 70:], log_a[:, :, 70:], normalize=True,
                                  initial_state=state, chunk_size=32)
    assert calls == [True, True, True]
    expected, expected_S, expected_z = linear_attention_reference(
        q.double(), k.double(), v.double(), log_a.double(), normalize=True, S0=S0.double(), z0=z0.double())
    assert rel_rms(whole, expected) <= TOLERANCE
    assert rel_rms(S, expected_S.real) <= TOLERANCE and rel_rms(z, expected_z.real) <= TOLERANCE
    assert rel_rms(torch.cat([first, second], dim=2), expected) <= TOLERANCE


def spy_on_kernel(monkeypatch) -> list:
    """Record each use of the kernel by linear_attention (eager calls only: they call it directly)."""
    calls = []
    real = native._chunked

    def spy(*args):
        calls.append(True)
        return real(*args)
    monkeypatch.setattr(native, "_chunked", spy)
    return calls


@pytest.mark.parametrize("case, uses_kernel", [
    ("inference", True),
    ("no decay", True),
    ("gradient needed", False),
    ("float64", False),
    ("complex decay", True),
    ("per-channel decay", False),
    ("other mode", False),
    ("disabled", False),
])
def test_the_kernel_is_used_exactly_where_it_applies(monkeypatch, case, uses_kernel):
    calls = spy_on_kernel(monkeypatch)
    q, k, v, log_a = strided_inputs(1, 2, 70, 6, 5, "real")
    kwargs = {}
    if case == "no decay":
        log_a = None
    elif case == "gradient needed":
        q.requires_grad_(True)
    elif case == "float64":
        q, k, v, log_a = (t.double() for t in (q, k, v, log_a))
    elif case == "complex decay":
        log_a = torch.complex(log_a, torch.randn_like(log_a))
    elif case == "per-channel decay":
        log_a = log_a.unsqueeze(-1).expand(1, 2, 70, 6)
    elif case == "other mode":
        kwargs["mode"] = "quadratic"
    with torch.set_grad_enabled(case == "gradient needed"):
        if case == "disabled":
            with native.disabled():
                out = linear_attention(q, k, v, log_a, **kwargs)
        else:
            out = linear_attention(q, k, v, log_a, **kwargs)
    assert calls == ([True] if uses_kernel else [])
    expected, _, _ = linear_attention_reference(q.detach().double(), k.double(), v.double(),
                                                None if log_a is None else log_a.detach().to(torch.complex128))
    assert rel_rms(out.detach(), expected) <= TOLERANCE


def test_switched_off_by_environment(monkeypatch):
    monkeypatch.setenv("ATTNSPEC_NATIVE", "0")
    assert not native.available()
    monkeypatch.delenv("ATTNSPEC_NATIVE")
    assert native.available()


def test_kernel_is_causal():
    """Changing every input after position t leaves the outputs up to t bit for bit unchanged."""
    q, k, v, log_a = strided_inputs(1, 2, 200, 16, 16, "complex")
    out, _ = kernel(q, k, v, log_a)
    for t in (0, 63, 64, 130):
        changed = [x.clone() for x in (q, k, v, log_a)]
        for x in changed:
            x[:, :, t + 1:] = torch.randn_like(x[:, :, t + 1:]) if x.dim() == 4 else torch.complex(
                -torch.rand(x[:, :, t + 1:].shape), torch.randn(x[:, :, t + 1:].shape))
        again, _ = kernel(*changed)
        assert torch.equal(again[:, :, :t + 1], out[:, :, :t + 1])
        assert not torch.equal(again[:, :, t + 1:], out[:, :, t + 1:])


@pytest.mark.parametrize("magnitude", [(0.999, 0.99999), (1e-30, 1e-3)], ids=["near-1", "near-0"])
def test_kernel_is_finite_and_exact_at_length_65536(magnitude):
    L = 65536
    low, high = magnitude
    q, k, v, _ = strided_inputs(1, 2, L, 8, 8, "none")
    log_a = torch.log(torch.rand(1, 2, L) * (high - low) + low)
    out, final = kernel(q, k, v, log_a)
    assert torch.isfinite(out).all() and torch.isfinite(final).all()
    # The float64 graph chunk mode is exact to ~1e-15 (test_linear_attention.py).
    expected, expected_state = linear_attention(q.double(), k.double(), v.double(), log_a.double(), mode="chunk",
                                                return_state=True)
    assert rel_rms(out, expected) <= TOLERANCE and rel_rms(final, expected_state) <= TOLERANCE


def test_build_is_cached_and_leaves_nothing_on_failure(tmp_path):
    first = build(directory=tmp_path)
    assert build(directory=tmp_path) == first
    assert sorted(p.name for p in tmp_path.iterdir()) == [first.name]
    with pytest.raises(NativeBuildError, match="failed to compile"):
        build(flags=native.FLAGS + ("-no-such-flag",), directory=tmp_path / "bad")
    assert list((tmp_path / "bad").iterdir()) == []
    with pytest.raises(NativeBuildError, match="could not run the C\\+\\+ compiler"):
        build(compiler=str(tmp_path / "no-compiler"), directory=tmp_path / "bad")
    not_a_directory = tmp_path / "file"
    not_a_directory.write_text("")
    with pytest.raises(NativeBuildError, match="set ATTNSPEC_CACHE_DIR to a writable directory"):
        build(directory=not_a_directory / "cache")


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="-mno-avx512f is an x86 flag")
def test_the_8_lane_build_for_cpus_without_avx512(tmp_path):
    """The source picks 16-float vectors with AVX-512 and 8 otherwise; the narrow variant must be right too."""
    library = load(build(flags=native.FLAGS + ("-mno-avx512f",), directory=tmp_path))
    q, k, v, log_a = strided_inputs(1, 3, 300, 60, 65, "complex-resets")
    log_mag, phase = log_a.real.contiguous(), log_a.imag.contiguous()
    B, H, L, Dk = q.shape
    out = torch.full((B, H, L, 65), float("nan"))
    final, final_im = (torch.full((B, H, Dk, 65), float("nan")) for _ in range(2))
    strides = [*q.stride(), *k.stride(), *v.stride(), *log_mag.stride(), *phase.stride(), *[0] * 8]
    status = library.chunked_linear_attention_forward(
        q.data_ptr(), k.data_ptr(), v.data_ptr(), log_mag.data_ptr(), phase.data_ptr(), None, None,
        (native.ctypes.c_int64 * 26)(*strides), B, H, L, Dk, 65, 64, 1.0, LOG_ZERO, out.data_ptr(), final.data_ptr(),
        final_im.data_ptr(), 2)
    assert status == 0
    expected, expected_state, _ = linear_attention_reference(q.double(), k.double(), v.double(),
                                                             log_a.to(torch.complex128))
    assert rel_rms(out, expected) <= TOLERANCE
    assert rel_rms(torch.complex(final, final_im), expected_state) <= TOLERANCE


def test_without_a_compiler_the_graph_path_runs_after_one_warning(monkeypatch, tmp_path):
    monkeypatch.setenv("CXX", str(tmp_path / "no-compiler"))
    monkeypatch.setenv("ATTNSPEC_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(native, "_library", None)
    monkeypatch.setattr(native, "_failure", None)
    q, k, v, log_a = strided_inputs(1, 2, 70, 6, 5, "real")
    with pytest.warns(RuntimeWarning, match="graph path is used"):
        out = linear_attention(q, k, v, log_a)
    with native.disabled():
        expected = linear_attention(q, k, v, log_a)
    assert torch.equal(out, expected)
    assert not native.available()  # decided once per process: no second build attempt, no second warning


@pytest.mark.slow
def test_compiled_graph_keeps_the_kernel_and_does_not_recompile_across_lengths():
    seen = set()

    def recording_backend(graph_module, example_inputs):
        seen.update(node.target for node in graph_module.graph.nodes)
        from torch._inductor.compile_fx import compile_fx
        return compile_fx(graph_module, example_inputs)

    def attention(q, k, v, log_a):
        return linear_attention(q, k, v, log_a, chunk_size=64, max_length=4096)

    compiled = torch.compile(attention, fullgraph=True, dynamic=True, backend=recording_backend)
    with torch.no_grad():
        for i, L in enumerate((100, 37, 300, 1000, 63)):
            q, k, v, log_a = strided_inputs(2, 2, L, 16, 8, "complex-resets")
            inputs = (q, k, v, Decay(log_a.real.unsqueeze(-1), log_a.imag.unsqueeze(-1)))  # no complex in the graph
            if i == 0:
                got = compiled(*inputs)
            else:
                with torch.compiler.set_stance("fail_on_recompile"):
                    got = compiled(*inputs)
            assert torch.equal(got, attention(*inputs))
    assert torch.ops.attnspec.chunked_linear_attention.default in seen


def test_kernel_refuses_arguments_it_would_misread():
    q, k, v, log_a = strided_inputs(1, 2, 10, 4, 3, "real")
    out, final, final_im = torch.empty(1, 2, 10, 3), torch.empty(1, 2, 4, 3), torch.empty(1, 2, 4, 3)
    with pytest.raises(ShapeError, match="k must be a float32 CPU tensor of shape"):
        forward_into(q, k.double(), v, log_a, None, None, None, 1.0, 64, LOG_ZERO, out, final, final_im)
    with pytest.raises(ShapeError, match="log_mag must be"):
        forward_into(q, k, v, log_a[:, :, :5], None, None, None, 1.0, 64, LOG_ZERO, out, final, final_im)
    with pytest.raises(ShapeError, match="phase needs log_mag"):
        forward_into(q, k, v, None, log_a, None, None, 1.0, 64, LOG_ZERO, out, final, final_im)
    with pytest.raises(ShapeError, match="contiguous"):
        forward_into(q, k, v, log_a, None, None, None, 1.0, 64, LOG_ZERO, torch.empty(1, 2, 3, 10).transpose(-1, -2),
                     final, final_im)


def test_a_compiler_that_refuses_march_native_gets_the_portable_build(monkeypatch, tmp_path):
    wrapper = tmp_path / "picky-c++"
    wrapper.write_text('#!/bin/sh\nfor a in "$@"; do [ "$a" = "-march=native" ] && '
                       '{ echo "error: unsupported option -march=native" >&2; exit 1; }; done\n'
                       f'exec {native.find_compiler()} "$@"\n')
    wrapper.chmod(0o755)
    monkeypatch.setenv("CXX", str(wrapper))
    monkeypatch.setenv("ATTNSPEC_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(native, "_library", None)
    monkeypatch.setattr(native, "_failure", None)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # the fallback is silent: the kernel works
        assert native.available()
    assert [p.name.startswith("chunked_linear_attention-") for p in (tmp_path / "cache").iterdir()] == [True]
    q, k, v, log_a = strided_inputs(1, 2, 100, 12, 9, "complex")
    out, _ = kernel(q, k, v, log_a)
    expected, _, _ = linear_attention_reference(q.double(), k.double(), v.double(), log_a.to(torch.complex128))
    assert rel_rms(out, expected) <= TOLERANCE
