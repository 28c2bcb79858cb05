"""Block-quantised kernel (engine/qgemm.py): packers round-trip, the kernel computes the product
of its quantised operands, rows never depend on each other, and a machine without the kernel
gets a reason, not a crash."""
import pytest
import torch

from specviz.engine import lowbit, qgemm

needs_kernel = pytest.mark.skipif("w4a8" not in lowbit.available(), reason="no AVX2 kernel here")


def _blockwise(x):
    g = x.reshape(x.shape[0], -1, qgemm.QK)
    d = g.abs().amax(-1, keepdim=True) / 127
    return ((g / d).round() * d).reshape(x.shape)


@pytest.mark.parametrize("bits", [4, 8])
def test_packers_round_trip_within_half_a_step(bits):
    torch.manual_seed(0)
    w = torch.randn(16, 96) * 0.1
    codes, d, m = (qgemm.pack_q4_1 if bits == 4 else qgemm.pack_q8_0)(w)
    assert codes.shape == (16, 48 if bits == 4 else 96) and codes.dtype == torch.uint8
    assert d.shape == (16, 3) and d.dtype == torch.float16 and (m is None) == (bits == 8)
    g = w.reshape(16, 3, 32)
    step = (g.amax(-1) - g.amin(-1)) / 15 if bits == 4 else g.abs().amax(-1) / 127
    err = (qgemm.unpack(codes, d, m) - w).abs().reshape(16, 3, 32).amax(-1)
    assert (err <= step * 0.5 + 2e-3 * g.abs().amax(-1)).all()  # + fp16 rounding of scale and min


@needs_kernel
@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("m", [1, 3, 4, 9])
def test_kernel_computes_the_quantised_product(bits, m):
    torch.manual_seed(m)
    w, b = torch.randn(40, 320) * 0.05, torch.randn(40)  # 10 blocks: 8 as vectors, 2 in the tail
    lin = qgemm.BlockLinear(w, b, bits)
    x = torch.randn(m, 320)
    ref = _blockwise(x) @ lin.dequantized().T + b
    assert (lin(x) - ref).abs().max() <= 1e-4 * ref.abs().max()


@needs_kernel
@pytest.mark.parametrize("bits", [4, 8])
def test_rows_are_bit_identical_alone_or_together(bits):
    torch.manual_seed(2)
    lin = qgemm.BlockLinear(torch.randn(72, 128), None, bits)
    x = torch.randn(11, 128)
    x[5] *= 1000  # another row's scale must not leak into its neighbours
    together = lin(x)
    assert all(torch.equal(lin(x[i:i + 1]), together[i:i + 1]) for i in range(11))
    assert lin(x.reshape(1, 11, 128)).shape == (1, 11, 72)


@needs_kernel
def test_w4a8_model_keeps_a_q8_output_layer():
    from specviz.models.tiny import tiny_model
    model = lowbit.to_lowbit(tiny_model(64, seed=0, layers=1, hidden=64), "w4a8")
    out = model.get_output_embeddings()
    assert isinstance(out, qgemm.BlockLinear) and out.bits == 8
    assert lowbit.lowbit_format(model) == "w4a8"


def test_unavailable_kernel_is_a_reason(monkeypatch):
    monkeypatch.setattr(qgemm, "_cpu_ok", lambda: "needs an x86 CPU with AVX2 (Linux)")
    qgemm.library.cache_clear()
    try:
        with pytest.raises(RuntimeError, match="AVX2"):
            qgemm.BlockLinear(torch.zeros(8, 32), None)
    finally:
        qgemm.library.cache_clear()
