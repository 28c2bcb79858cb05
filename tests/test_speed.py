"""The small-M linear path must compute what F.linear computes, whatever the
layout of its input (an upstream transposed output once sent it down a 3x
slower kernel without changing a single number)."""
import pytest
import torch
import torch.nn.functional as F

from specviz.engine.cpu import speed


@pytest.mark.parametrize("m", [1, 2, 5, 9, 40])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("transposed_input", [False, True])
def test_small_m_linear_matches_f_linear(m, bias, transposed_input):
    torch.manual_seed(m)
    lin = torch.nn.Linear(48, 80, bias=bias)
    x = torch.randn(1, m, 48)
    if transposed_input:  # same values, column-major storage
        x = torch.randn(48, m).T.unsqueeze(0)
    want = F.linear(x, lin.weight, lin.bias)
    assert speed.patch_small_m_linear(lin) == 1
    got = lin(x)
    assert got.shape == want.shape and got.is_contiguous()
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_patch_skips_non_fp32():
    lin = torch.nn.Linear(8, 8).to(torch.bfloat16)
    assert speed.patch_small_m_linear(lin) == 0
