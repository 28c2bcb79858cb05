"""Block-quantised kernel (engine/cpu/qgemm.py): packers round-trip, the kernel computes the product
of its quantised operands, rows never depend on each other, and a machine without the kernel
gets a reason, not a crash."""
import pytest
import torch

from specviz.engine.cpu import lowbit, qgemm

needs_kernel = pytest.mark.skipif("w4a8" not in lowbit.available(), reason="no AVX2 kernel here")


@pytest.mark.parametrize("bits", [4, 8])
def test_packers_round_trip_within_a_step(bits):
    """Each weight comes back within one code step of its block (sub-scales are rounded up, so
    a block's step is at most one sub-scale unit coarser than its own range asks)."""
    torch.manual_seed(0)
    w = torch.randn(13, 320) * 0.1  # 10 blocks: a full super-block and a short one; 13 rows: a short group
    w[3, :32] *= 50  # one loud block beside quiet ones in the same super-block
    p = (qgemm.pack_q4 if bits == 4 else qgemm.pack_q8)(w)
    # one group of 16 rows, its bytes in one row: codes, sub-scales per block, scales per super-block
    assert p["codes"].shape == (1, 10 * (256 if bits == 4 else 512)) and p["codes"].dtype == torch.uint8
    assert p["sub"].shape == (1, 16 * 16) and p["wd"].shape == (1, 2 * 16) and (p["tmin"] is None) == (bits == 8)
    g = w.reshape(13, 10, 32)
    step = (g.amax(-1) - g.amin(-1)) / 15 if bits == 4 else g.abs().amax(-1) / 127
    wd = p["wd"].reshape(1, 2, 16).transpose(1, 2).reshape(16, 2)[:13]  # [group][super-block][row] -> [row][sb]
    unit = wd.repeat_interleave(8, 1)[:, :10]  # one sub-scale unit
    err = (qgemm.unpack(p, 13) - w).abs().reshape(13, 10, 32).amax(-1)
    assert (err <= step + unit * (16 if bits == 4 else 128)).all()


@needs_kernel
@pytest.mark.parametrize("bits", [4, 8])
def test_every_variant_this_cpu_runs_gives_the_same_bits(monkeypatch, bits):
    """SPECVIZ_KERNEL_ISA forces a variant: each one this CPU runs computes the quantised product,
    row by row, and all of them the same bits (the same integers, the same float steps)."""
    torch.manual_seed(bits)
    w, x = torch.randn(37, 352) * 0.05, torch.randn(20, 352)  # a short group, an odd block count
    outs = []
    try:
        for variant in qgemm.runnable():
            monkeypatch.setenv("SPECVIZ_KERNEL_ISA", variant)
            qgemm.cache_clear()
            assert qgemm.isa() == variant and qgemm.library().kernel_isa().decode() == variant
            lin = qgemm.BlockLinear(w, None, bits)
            ref = qgemm.quantize_reference(x) @ lin.dequantized().T
            for m in (1, 2, 5, 9, 17, 20):  # a step, verifies, a tile and a row, more than a tile
                y = lin(x[:m])
                assert (y - ref[:m]).abs().max() <= 1e-4 * ref.abs().max()
                assert torch.equal(y[m - 1:], lin(x[m - 1:m]))
            outs.append(lin(x))
    finally:
        qgemm.cache_clear()
    assert all(torch.equal(outs[0], o) for o in outs[1:])


def test_a_forced_variant_must_exist_and_run_here(monkeypatch):
    monkeypatch.setenv("SPECVIZ_KERNEL_ISA", "neon")
    with pytest.raises(RuntimeError, match="not a kernel variant .*avx2"):
        qgemm.isa()
    monkeypatch.setattr(qgemm, "_cpu_flags", lambda: {"avx2", "fma"})
    monkeypatch.setenv("SPECVIZ_KERNEL_ISA", "avx512vnni")
    with pytest.raises(RuntimeError, match="cannot run it .*avx2"):
        qgemm.isa()
    monkeypatch.delenv("SPECVIZ_KERNEL_ISA")
    assert qgemm.isa() == "avx2"
    monkeypatch.setattr(qgemm, "_cpu_flags", lambda: {"avx2", "avx_vnni", "avx512f", "avx512bw", "avx512vl", "avx512_vnni"})
    assert qgemm.runnable() == ["avx512vnni", "avxvnni", "avx2"] and qgemm.isa() == "avx512vnni"
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "avx2")  # an emulated AVX2 machine runs the AVX2 variant
    assert qgemm.isa() == "avx2"


@needs_kernel
def test_a_struct_that_differs_from_its_mirror_is_refused(monkeypatch):
    import ctypes

    class Shorter(ctypes.Structure):
        _fields_ = qgemm.Lin._fields_[:-1]
    monkeypatch.setattr(qgemm, "Lin", Shorter)
    qgemm.cache_clear()
    try:
        with pytest.raises(RuntimeError, match="lin_t is 64 bytes, its ctypes mirror 56"):
            qgemm.library()
    finally:
        qgemm.cache_clear()


@needs_kernel
@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("m", [1, 3, 4, 9])
@pytest.mark.parametrize("k", [320, 352, 512])  # 10 blocks (a full super-block, a short one), 11 (a lone
def test_kernel_computes_the_quantised_product(bits, m, k):  # last block outside a pair), 16
    torch.manual_seed(m)
    w, b = torch.randn(40, k) * 0.05, torch.randn(40)
    lin = qgemm.BlockLinear(w, b, bits)
    x = torch.randn(m, k)
    ref = qgemm.quantize_reference(x) @ lin.dequantized().T + b
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
    qgemm.cache_clear()
    try:
        with pytest.raises(RuntimeError, match="AVX2"):
            qgemm.BlockLinear(torch.zeros(8, 32), None)
    finally:
        qgemm.cache_clear()


def test_a_forced_format_this_machine_lacks_is_a_clear_error(monkeypatch):
    from specviz.calibration import calibrate
    from specviz.errors import ModelError
    from specviz.models.tiny import tiny_model
    monkeypatch.setattr(qgemm, "_cpu_ok", lambda: "needs an x86 CPU with AVX2 (Linux)")
    monkeypatch.setattr(lowbit, "available", lambda: ("w8a8",))
    qgemm.cache_clear()
    try:
        with pytest.raises(ModelError, match="w4a8 does not run on this machine .*AVX2.*--precision auto"):
            calibrate.calibrate(tiny_model(64, seed=0, layers=1, hidden=64), None, precision="w4a8")
    finally:
        qgemm.cache_clear()


@needs_kernel
def test_replaced_buffers_are_read_again():
    """New buffer tensors, or buffers whose storage moved (t.data = ...), are what the kernel reads."""
    torch.manual_seed(0)
    a, b = qgemm.BlockLinear(torch.randn(24, 256), None, 4), qgemm.BlockLinear(torch.randn(24, 256), None, 4)
    x = torch.randn(2, 256)
    first = a(x)
    for name in ("codes", "sub", "tmin", "wd", "wm"):
        setattr(a, name, getattr(b, name).clone())
    assert torch.equal(a(x), b(x)) and not torch.equal(a(x), first)
    for t in a.buffers():  # what models/loading.py's _own_memory does after a calibration's calls
        t.data = t.data.clone()
    torch.randn(1 << 20)  # reuse freed memory
    assert torch.equal(a(x), b(x))
