"""Chapter 1: the Dense layer as a torch.autograd.Function with a hand-written backward.

Check it:  python grad_check.py py
"""

from __future__ import annotations

import math

import torch
from torch import Tensor
from torch.nn import functional as F


class DenseFunction(torch.autograd.Function):
    """y = sigmoid(z), z = x Wᵀ + b, for x of shape (*, in_features)."""

    # torch.func.vmap runs forward, backward and jvp below on batched tensors; they are made
    # of torch ops that all have batching rules, so torch can write the vmap rule itself.
    generate_vmap_rule = True

    @staticmethod
    def forward(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
        if x.dim() == 2:
            z = x @ weight.t() if bias is None else torch.addmm(bias, x, weight.t())
            # In place: z is a fresh tensor never needed again, so y can reuse its memory.
            return z.sigmoid_()
        # x of shape (*, in): fold the leading dimensions into rows, so that one GEMM does the
        # work with the bias inside it, as F.linear does. z is then rounded once: in bfloat16
        # and float16, a GEMM followed by a separate bias add would round it twice. The sigmoid
        # is taken out of place on the unfolded view, so that y is a tensor of its own: an
        # in-place sigmoid would return the view, and autograd forbids in-place ops on a view
        # made inside a Function (`layer(x).add_(1)` would fail).
        x2 = x.reshape(math.prod(x.shape[:-1]), x.shape[-1])
        z = x2 @ weight.t() if bias is None else torch.addmm(bias, x2, weight.t())
        return torch.sigmoid(z.view(*x.shape[:-1], weight.shape[0]))

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

        # Chain rule through the sigmoid, element by element: dL/dz = dL/dy · y (1 − y).
        # ATen's sigmoid_backward computes exactly that product, in one pass over memory
        # where `(grad_out * y).mul_(1 - y)` takes three and allocates twice. It is also
        # differentiable (double backward) and batched (vmap), like the ops it replaces.
        dz = torch.ops.aten.sigmoid_backward(grad_out, y)

        # z = x Wᵀ + b is linear, so with dz of shape (B, out):
        #   dL/dx = dz W      (B, out) @ (out, in) -> (B, in)
        #   dL/dW = dzᵀ x     (out, B) @ (B, in)   -> (out, in)
        #   dL/db = Σ_rows dz  b was broadcast over the batch, so its gradient sums over it
        grad_x = dz @ weight if need_x else None
        if need_w or (need_b and ctx.has_bias):
            # Fold x's leading dimensions into rows (free for a 2-d x).
            dz2 = dz if dz.dim() == 2 else dz.reshape(-1, weight.shape[0])
            grad_w = dz2.t() @ (x if x.dim() == 2 else x.reshape(-1, weight.shape[1])) if need_w else None
            grad_b = dz2.sum(0) if (need_b and ctx.has_bias) else None
        else:
            grad_w = grad_b = None
        return grad_x, grad_w, grad_b


class DenseFunctionForwardAD(DenseFunction):
    """DenseFunction plus its forward-mode rule (``jvp``): what ``dense`` calls in eager mode.

    torch.compile's tracer (Dynamo) refuses every Function that defines a custom ``jvp``, so the
    rule cannot live on DenseFunction itself without costing torch.compile its single graph.
    """

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        DenseFunction.setup_context(ctx, inputs, output)
        x, weight, _ = inputs
        ctx.save_for_forward(x, weight, output)

    @staticmethod
    def jvp(ctx, x_t: Tensor | None, weight_t: Tensor | None, bias_t: Tensor | None) -> Tensor:
        # Forward-mode AD: with tangents dx, dW, db of the inputs,
        #   dz = dx Wᵀ + x dWᵀ + db   (the product rule on z = x Wᵀ + b)
        #   dy = y (1 − y) · dz
        # A tangent is None for an input that has none.
        x, weight, y = ctx.saved_tensors
        dz = torch.zeros_like(y)
        if x_t is not None:
            dz = dz + F.linear(x_t, weight)
        if weight_t is not None:
            dz = dz + F.linear(x, weight_t)
        if bias_t is not None:
            dz = dz + bias_t
        return dz * y * (1 - y)


def dense(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    # Under torch.compile, the Function Dynamo can trace into one graph (it refuses a custom jvp;
    # forward mode there comes from the traced ops' own rules). In eager mode, the one with jvp.
    if torch.compiler.is_compiling():
        return DenseFunction.apply(x, weight, bias)
    return DenseFunctionForwardAD.apply(x, weight, bias)
