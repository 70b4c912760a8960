"""Facts both conv arch modules use: operand roles, the implicit-GEMM text, epilogue spellings."""

from __future__ import annotations

from emitter.dtypes import DType
from emitter.families.conv.model import Activation, ConvInstance, ConvOp, Rejection

TENSOR_TEXT = {"x": "activations x (NDHWC)", "w": "filters w (KTRSC)", "y": "output y (NZPQK)"}
GRAD_TEXT = {"x": "input gradient dx (NDHWC)", "w": "filter gradient dw (KTRSC)", "y": "output gradient dy (NZPQK)"}

GEMM_TEXT = {
    ConvOp.fprop: "implicit GEMM M = N*Z*P*Q, N = K, K = T*R*S*C",
    ConvOp.dgrad: "implicit GEMM M = N*D*H*W, N = C, K = T*R*S*K",
    ConvOp.wgrad: "implicit GEMM M = K, N = T*R*S*C, K = N*Z*P*Q",
}


def tensor_text(inst: ConvInstance, tensor: str) -> str:
    if inst.op is ConvOp.fprop or tensor == "x" and inst.op is ConvOp.wgrad or tensor == "w" and inst.op is ConvOp.dgrad:
        return TENSOR_TEXT[tensor]
    return GRAD_TEXT[tensor]


def epilogue_text(inst: ConvInstance) -> str:
    core = "alpha * acc + beta * C" + (" + bias[k]" if inst.epilogue.bias else "")
    act = inst.epilogue.activation
    return core if act is Activation.identity else f"{act.value}({core})"


def reject(inst: ConvInstance, rule: str, reason: str) -> Rejection:
    return Rejection(inst, rule, reason)


def bits(d: DType) -> int:
    return d.bits
