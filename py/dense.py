"""Stage 1: the Dense layer as a torch.autograd.Function with a hand-written backward.

Check it:  python grad_check.py py
"""

from __future__ import annotations

import torch
from torch import Tensor


class DenseFunction(torch.autograd.Function):
    """y = sigmoid(z), z = x Wᵀ + b, for x of shape (*, in_features)."""

    @staticmethod
    def forward(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
        # Fold the leading dimensions into one batch so a single GEMM does the work.
        x2 = x.reshape(-1, weight.shape[1])
        z = x2 @ weight.t() if bias is None else torch.addmm(bias, x2, weight.t())
        # In place: z is never needed again, so y can reuse its memory.
        y = z.sigmoid_()
        return y.view(*x.shape[:-1], weight.shape[0])

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        x, weight, bias = inputs
        # sigmoid'(z) = y (1 - y): keeping y means z never has to be stored or recomputed.
        ctx.save_for_backward(x, weight, output)
        ctx.has_bias = bias is not None

    @staticmethod
    def backward(ctx, grad_out: Tensor):
        x, weight, y = ctx.saved_tensors
        need_x, need_w, need_b = ctx.needs_input_grad
        in_f, out_f = weight.shape[1], weight.shape[0]
        g = grad_out.reshape(-1, out_f)
        y = y.reshape(-1, out_f)

        # Chain rule through the sigmoid, element by element: dL/dz = dL/dy · y (1 − y).
        # One temporary, updated in place, instead of three.
        dz = (1 - y).mul_(y).mul_(g)

        # z = x Wᵀ + b is linear, so with dz of shape (B, out):
        #   dL/dx = dz W      (B, out) @ (out, in) -> (B, in)
        #   dL/dW = dzᵀ x     (out, B) @ (B, in)   -> (out, in)
        #   dL/db = Σ_rows dz  b was broadcast over the batch, so its gradient sums over it
        grad_x = (dz @ weight).view(x.shape) if need_x else None
        grad_w = dz.t() @ x.reshape(-1, in_f) if need_w else None
        grad_b = dz.sum(0) if (need_b and ctx.has_bias) else None
        return grad_x, grad_w, grad_b


def dense(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    return DenseFunction.apply(x, weight, bias)
