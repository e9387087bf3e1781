"""The ops and model APIs at their edges: empty sequences and batches, bad dtypes and numbers, bad calls.

Every case either computes the obvious answer (an empty output, the state passed through) or
raises ShapeError naming the problem; none raises another exception or hangs.
"""

from __future__ import annotations

import pytest
import torch

import attnspec
from attnspec.errors import ShapeError
from attnspec.ops import MODES, linear_attention, scatterbrain_attention, softmax_attention
from attnspec.ops.linear.backends import native
from attnspec.ops.support import local_support
from tests.conftest import ROOT


def _inputs(B: int, L: int, decay: str | None, dtype=torch.float64):
    q, k = torch.rand(B, 2, L, 4, dtype=dtype), torch.rand(B, 2, L, 4, dtype=dtype)
    v = torch.randn(B, 2, L, 3, dtype=dtype)
    log_a = None
    if decay == "real":
        log_a = torch.log(torch.rand(B, 2, L, dtype=dtype))
    elif decay == "complex":
        log_a = torch.complex(torch.log(torch.rand(B, 2, L, dtype=dtype)), torch.randn(B, 2, L, dtype=dtype))
    return q, k, v, log_a


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("decay", [None, "real", "complex"])
@pytest.mark.parametrize("normalize", [False, True])
def test_empty_sequence_returns_empty_output_and_the_initial_state(mode, decay, normalize):
    q, k, v, log_a = _inputs(2, 0, decay)
    S0 = torch.randn(2, 2, 4, 3, dtype=torch.complex128 if decay == "complex" else torch.float64)
    initial = (S0, torch.rand(2, 2, 4, dtype=torch.float64)) if normalize else S0
    out, final = linear_attention(q, k, v, log_a, mode=mode, normalize=normalize, initial_state=initial,
                                  return_state=True)
    assert out.shape == (2, 2, 0, 3)
    if normalize:
        assert torch.equal(final[0], S0) and torch.equal(final[1], initial[1])
    else:
        assert torch.equal(final, S0)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("decay", [None, "real", "complex"])
@pytest.mark.parametrize("length", [1, 2, 3])
def test_the_final_state_of_a_short_sequence_is_the_recurrence_s_whatever_the_scan_depth(mode, decay, length):
    """At L 1-3 eager scans take 0-2 steps (the depth L needs, not max_length's): the state is still
    complex for a complex decay (a scan of no step has no phase part to carry; the decoding step
    expects one) and equals the recurrence's, with a max_length far above L or none."""
    q, k, v, log_a = _inputs(2, length, decay)
    reference = linear_attention(q, k, v, log_a, mode="recurrent", return_state=True)
    for max_length in (None, 1024):
        out, final = linear_attention(q, k, v, log_a, mode=mode, return_state=True, max_length=max_length)
        assert final.dtype == (torch.complex128 if decay == "complex" else torch.float64), (mode, max_length)
        torch.testing.assert_close(out, reference[0], rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(final, reference[1], rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("decay", [None, "real", "complex"])
def test_empty_batch(mode, decay):
    q, k, v, log_a = _inputs(0, 5, decay)
    assert linear_attention(q, k, v, log_a, mode=mode, normalize=True).shape == (0, 2, 5, 3)


def test_empty_softmax_and_scatterbrain():
    q, k, v, _ = _inputs(1, 0, None)
    assert softmax_attention(q, k, v).shape == (1, 2, 0, 3)
    support = local_support(0, 4, causal=True, batch=1, heads=2, device=q.device)
    assert scatterbrain_attention(q, k, v, q.abs(), k.abs(), support).shape == (1, 2, 0, 3)


@pytest.mark.parametrize("dtype", [torch.int64, torch.complex64, torch.float8_e4m3fn])
def test_unsupported_dtypes_are_shape_errors(dtype):
    q = torch.ones(1, 1, 3, 2).to(dtype)
    with pytest.raises(ShapeError, match="float32, float64, bfloat16 or float16"):
        linear_attention(q, q, q)
    with pytest.raises(ShapeError, match="float32, float64, bfloat16 or float16"):
        softmax_attention(q, q, q)


@pytest.mark.parametrize("name, value", [("scale", float("nan")), ("scale", float("inf")), ("eps", float("nan")),
                                         ("eps", float("-inf")), ("eps", 0.0), ("scale", "2")])
def test_non_finite_scale_and_eps_are_refused(name, value):
    q, k, v, _ = _inputs(1, 4, None)
    with pytest.raises(ShapeError, match=name):
        linear_attention(q, k, v, normalize=True, **{name: value})
    if name == "scale":
        with pytest.raises(ShapeError, match="scale"):
            softmax_attention(q, k, v, scale=value)


@pytest.mark.parametrize("chunk_size", [0, -1, 1.5, True])
def test_native_kernel_refuses_bad_chunk_sizes(chunk_size):
    q = torch.rand(1, 1, 8, 2)
    with pytest.raises(ShapeError, match="chunk_size"):  # chunk_size 0 used to loop forever in the kernel
        native.forward_into(q, q, q, None, None, None, None, 1.0, chunk_size, -1000.0, torch.empty(1, 1, 8, 2),
                            torch.empty(1, 1, 2, 2), torch.empty(1, 1, 2, 2))
    with pytest.raises(ShapeError, match="chunk_size"):
        linear_attention(q, q, q, mode="chunk", chunk_size=chunk_size)


@pytest.fixture(scope="module")
def models():
    small = ["d_model=16", "max_len=32"]
    return {name: attnspec.build(ROOT / "specs" / f"{name}.yaml", *small, *extra) for name, extra in {
        "linear-elu": ["layers[0].repeat=1"], "softmax-transformer": [], "scatterbrain": ["layers[0].repeat=1"],
    }.items()}


@pytest.mark.parametrize("name", ["linear-elu", "softmax-transformer", "scatterbrain"])
def test_unknown_mode_is_an_error_for_every_mixer_kind(models, name):
    with pytest.raises(ShapeError, match="not in mode 'foo'"):
        models[name](torch.zeros(1, 4, dtype=torch.long), "foo")
    with pytest.raises(ShapeError, match="not in mode"):
        models[name](torch.zeros(1, 4, dtype=torch.long), "sideways")


@pytest.mark.parametrize("inputs, words", [
    (torch.tensor([[1, 512]]), "vocab_size"),
    (torch.tensor([[-1, 2]]), "vocab_size"),
    (torch.zeros(1, 33, dtype=torch.long), "max_len = 32"),
    (torch.zeros(2, 3, 4, dtype=torch.long), "(batch, length)"),
    (torch.zeros(1, 3), "int64"),
])
def test_model_calls_name_the_limit(models, inputs, words):
    with pytest.raises(ShapeError, match=words.replace("(", r"\(").replace(")", r"\)")):
        models["linear-elu"](inputs)


def test_decoding_step_checks_its_token(models):
    model = models["linear-elu"]
    with pytest.raises(ShapeError, match="vocab_size"):
        model.step(torch.tensor([600]), *model.init_state(1))
