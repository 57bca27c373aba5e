"""The differences from PyTorch that README's table lists, each asserted on both sides: if
PyTorch changes, or tinyattn does, this fails and the table needs a look."""
import numpy as np
import pytest

from torch_compare import torch

import tinyattn as ta
import tinyattn.nn.functional as F


def test_numpy_float64_becomes_float32():
    a = np.ones(2)
    assert ta.tensor(a).dtype == ta.float32 and torch.tensor(a).dtype == torch.float64


def test_max_with_a_dim_returns_values_and_ties_share_the_gradient():
    x = np.array([[1.0, 3.0, 3.0]])
    a = ta.tensor(x, dtype="float64", requires_grad=True)
    a.max(1).sum().backward()
    t = torch.tensor(x, requires_grad=True)
    values, indices = t.max(1)
    values.sum().backward()
    assert a.grad.tolist() == [[0.0, 0.5, 0.5]] and t.grad.tolist() in ([[0.0, 1.0, 0.0]], [[0.0, 0.0, 1.0]])


def test_cross_entropy_and_nll_loss_with_every_target_ignored():
    x, t = np.zeros((2, 3)), np.array([-100, -100])
    for loss in ("cross_entropy", "nll_loss"):
        assert getattr(F, loss)(ta.tensor(x), ta.tensor(t)).item() == 0.0
        assert np.isnan(getattr(torch.nn.functional, loss)(torch.tensor(x), torch.tensor(t)).item())


def test_clip_grad_norm_with_no_gradient():
    with pytest.raises(ValueError, match="clip_grad_norm_: no parameter has a gradient"):
        ta.nn.utils.clip_grad_norm_([ta.zeros(2, requires_grad=True)], 1.0)
    assert torch.nn.utils.clip_grad_norm_([torch.zeros(2, requires_grad=True)], 1.0).item() == 0.0
    assert ta.nn.utils.clip_grad_norm_([], 1.0).item() == 0.0            # no parameters at all: 0 in both


def test_kl_div_gradient_at_a_target_of_0():
    """The term p log p is 0 at p = 0 in both; its gradient there is 0 here (p log p taken as 0
    nearby too), where PyTorch gives NaN."""
    x, p = np.log(np.full((1, 2), 0.5)), np.array([[0.0, 1.0]])
    a = ta.tensor(p, dtype="float64", requires_grad=True)
    F.kl_div(ta.tensor(x, dtype="float64"), a, reduction="sum").backward()
    t = torch.tensor(p, requires_grad=True)
    torch.nn.functional.kl_div(torch.tensor(x), t, reduction="sum").backward()
    assert np.isfinite(a.grad.numpy()).all() and np.isnan(t.grad.numpy()[0, 0])


def test_layer_norm_and_rms_norm_take_an_int_shape():
    assert F.layer_norm(ta.randn(2, 4), 4).shape == (2, 4) and F.rms_norm(ta.randn(2, 4), 4).shape == (2, 4)
    with pytest.raises(TypeError):
        torch.nn.functional.layer_norm(torch.randn(2, 4), 4)
    with pytest.raises(TypeError):
        torch.nn.functional.rms_norm(torch.randn(2, 4), 4)


def test_sign_of_nan_and_the_gradient_of_abs_there():
    assert np.isnan(ta.tensor([np.nan]).sign().item()) and torch.tensor([np.nan]).sign().item() == 0.0
    a = ta.tensor([np.nan], dtype="float64", requires_grad=True)
    a.abs().sum().backward()
    t = torch.tensor([np.nan], requires_grad=True)
    t.abs().sum().backward()
    assert np.isnan(a.grad.item()) and t.grad.item() == 0.0


def test_integers_to_negative_integer_powers():
    with pytest.raises(ValueError):
        2 ** ta.tensor([-1])
    assert (2 ** torch.tensor([-1])).tolist() == [0]


def test_gradients_of_var_with_no_degrees_of_freedom():
    x = np.array([1.0, 3.0])
    a = ta.tensor(x, dtype="float64", requires_grad=True)
    a.var(correction=2).backward()
    t = torch.tensor(x, requires_grad=True)
    t.var(correction=2).backward()
    assert np.isnan(a.grad.numpy()).all() and np.isinf(t.grad.numpy()).all()


def test_in_place_while_recording_makes_a_new_tensor():
    a = ta.randn(3, requires_grad=True) * 1.0
    alias = a
    a += 1
    assert a is not alias                          # PyTorch: the same tensor, changed in place
    t = torch.randn(3, requires_grad=True) * 1.0
    t_alias = t
    t += 1
    assert t is t_alias
