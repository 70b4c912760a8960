"""The convolution instance record: one fully resolved implicit-GEMM conv kernel configuration.

A conv spec expands into candidate ConvInstance records (fields may still be AUTO / 0 / None = derive);
the arch module (sm80.py: CUTLASS 2.x DefaultConv{2,3}d{Fprop,Dgrad,Wgrad}; sm90a.py: CUTLASS 3.x conv
CollectiveBuilder + ConvUniversal) resolves them, filling derived values and checking every constraint,
and returns the resolved instance or a Rejection naming the rule and the fix.

The implicit GEMM of each operation (forward geometry: x N x D x H x W x C, w K x T x R x S x C, y N x Z x P x Q x K):
  fprop  M = N*Z*P*Q, N = K, K = T*R*S*C    A = x (im2col gathered), B = w,  C/D = y
  dgrad  M = N*D*H*W, N = C, K = T*R*S*K    A = y (dy),              B = w,  C/D = x (dx)
  wgrad  M = K,       N = T*R*S*C, K = N*Z*P*Q   A = y (dy),         B = x,  C/D = w (dw)
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from emitter.dtypes import DType
from emitter.kit.enums import AUTO, Activation, Arch, Shape3, SplitK

__all__ = ["AUTO", "Activation", "Arch", "ConvEpilogue", "ConvGroupMode", "ConvInstance", "ConvKernelKind", "ConvOp",
           "ConvSchedule",
           "ConvTileScheduler", "IteratorAlgorithm", "Layout", "Rejection", "Shape3", "SplitK", "StrideSupport"]


class ConvOp(Enum):
    fprop = "fprop"
    dgrad = "dgrad"
    wgrad = "wgrad"

    @property
    def cpp(self) -> str:
        return {"fprop": "cutlass::conv::Operator::kFprop", "dgrad": "cutlass::conv::Operator::kDgrad",
                "wgrad": "cutlass::conv::Operator::kWgrad"}[self.value]

    @property
    def output(self) -> str:
        """The tensor the operation writes (x, w or y of the forward geometry)."""
        return {"fprop": "y", "dgrad": "x", "wgrad": "w"}[self.value]

    @property
    def operands(self) -> tuple[str, str]:
        """The tensors the implicit GEMM reads as A and B."""
        return {"fprop": ("x", "w"), "dgrad": ("y", "w"), "wgrad": ("y", "x")}[self.value]

    def __str__(self) -> str:
        return self.value


class Layout(Enum):
    nhwc = "nhwc"      # 2D: cutlass::layout::TensorNHWC (filters KRSC)
    ndhwc = "ndhwc"    # 3D: cutlass::layout::TensorNDHWC (filters KTRSC)

    @property
    def cpp(self) -> str:
        return "cutlass::layout::TensorNHWC" if self is Layout.nhwc else "cutlass::layout::TensorNDHWC"

    @property
    def dims(self) -> int:
        return 2 if self is Layout.nhwc else 3

    def __str__(self) -> str:
        return self.value


class IteratorAlgorithm(Enum):   # CUTLASS 2.x only (3.x gathers with im2col TMA)
    analytic = "analytic"              # computes every coordinate: any C alignment the access width allows
    optimized = "optimized"            # precomputed deltas and masks: the fast default
    few_channels = "few_channels"      # fprop, C a small multiple of the access width (first layers, C = 3 with alignment 1)
    fixed_channels = "fixed_channels"  # fprop, C exactly the access width (C = 4/8 padded first layers)

    @property
    def cpp(self) -> str:
        return {"analytic": "kAnalytic", "optimized": "kOptimized", "few_channels": "kFewChannels",
                "fixed_channels": "kFixedChannels"}[self.value]

    def __str__(self) -> str:
        return self.value


class StrideSupport(Enum):
    unity = "unity"        # stride 1 only (unity-stride dgrad iterators are simpler and faster)
    strided = "strided"    # any stride

    def __str__(self) -> str:
        return self.value


class ConvKernelKind(Enum):
    """How the conv is computed (spec `kernel:`). implicit: the implicit-GEMM conv kernel of the arch (every conv
    problem its rules allow). gemm_1x1 (sm90a fprop / dgrad / wgrad): a 1x1, stride-1, unpadded conv on NHWC tensors IS a
    GEMM, run by CUTLASS 3.x's persistent GemmUniversal (cooperative / pingpong, stream-K); any other problem is
    refused at run time (EMITTER_CANNOT_IMPLEMENT), so a library dispatch falls through to another kernel.
    depthwise_direct (sm80 2D fprop): CUTLASS 2.x's depthwise direct convolution (DefaultDepthwiseDirect2dConvFprop,
    SIMT): groups = C = K only, its filter size (and, unless `any`, stride and dilation) fixed at compile time; `tile`
    is then the output tile a CTA computes, P x Q x channels (one image, N = 1, as CUTLASS's kernel has it).
    depthwise_simt (sm80 2D wgrad / fprop, groups = C = K): emitter's own SIMT depthwise kernel (sm80_depthwise_simt.py),
    a thread 8 channels, its filter size compiled in, stride / dilation / padding read at run time; `tile` is
    positions (thread rows) x output pixels a thread x channels a CTA."""
    implicit = "implicit"
    gemm_1x1 = "gemm_1x1"
    depthwise_direct = "depthwise_direct"
    depthwise_simt = "depthwise_simt"

    def __str__(self) -> str:
        return self.value


class ConvGroupMode(Enum):
    """Grouped convolution (spec `group_mode:`; sm80 fprop, CUTLASS 2.x DefaultConv2dGroupFprop). none: the
    ordinary kernels, groups = 1 only. single: a CTA computes output channels of one group (K/groups a multiple of
    tile n); multiple: a CTA computes several whole groups (tile n a multiple of K/groups; depthwise, groups = C,
    lands here with one channel a group). Grouped instances run groups > 1 only."""
    none = "none"
    single = "single"
    multiple = "multiple"

    @property
    def cpp(self) -> str:
        return {"none": "kNone", "single": "kSingleGroup", "multiple": "kMultipleGroup"}[self.value]

    def __str__(self) -> str:
        return self.value


class ConvSchedule(Enum):          # gemm_1x1 only: the GemmUniversal kernel schedule
    auto = "auto"                  # cooperative
    cooperative = "cooperative"    # two consumer warpgroups share one tile (tile m 128 or 256)
    pingpong = "pingpong"          # two consumer warpgroups alternate tiles (one's epilogue under the other's MMA)

    def __str__(self) -> str:
        return self.value


class ConvTileScheduler(Enum):     # gemm_1x1 only
    auto = "auto"                  # fprop, dgrad: persistent; wgrad: stream_k (its K-dim N*P*Q is long, its tiles few)
    persistent = "persistent"      # one CTA an SM walks the output tiles
    stream_k = "stream_k"          # the reduction of few output tiles is split across the SMs (cooperative only)

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class ConvEpilogue:
    activation: Activation = Activation.identity
    bias: bool = False           # one value per output channel (fprop, sm90a)
    clamp_min: float = 0.0
    clamp_max: float = 6.0


@dataclass(frozen=True)
class ConvInstance:
    arch: Arch
    op: ConvOp
    layout: Layout               # spatial dims: nhwc = 2D, ndhwc = 3D
    a: DType                     # the element type of both operands (activations and filters)
    c: DType                     # output and beta source
    accumulator: DType
    epilogue_compute: DType
    tile: Shape3                 # threadblock (2.x) / CTA (3.x) tile of the implicit GEMM; depthwise_direct: P x Q x channels
    warp: Shape3 | None          # 2.x only
    cluster: Shape3 | None       # 3.x only
    instruction: Shape3 | None   # 2.x mma.sync shape (None = derive)
    stages: int                  # AUTO (0) = derive
    iterator: IteratorAlgorithm  # 2.x only (3.x: optimized, meaning "not applicable", kept for the name)
    stride_support: StrideSupport
    alignment_a: int             # elements; AUTO (0) = derived maximum
    alignment_b: int
    alignment_c: int
    swizzle: int = 1             # 2.x threadblock swizzle
    epilogue: ConvEpilogue = field(default_factory=ConvEpilogue)
    split_k: SplitK = SplitK.none
    kernel: ConvKernelKind = ConvKernelKind.implicit
    schedule: ConvSchedule = ConvSchedule.auto             # gemm_1x1 only
    scheduler: ConvTileScheduler = ConvTileScheduler.auto  # gemm_1x1 only
    swap_ab: bool = False        # gemm_1x1 wgrad only: compute dw^T[C, K] = x^T . dy (M = C, N = K), D column-major
    group_mode: ConvGroupMode = ConvGroupMode.none         # sm80 fprop only: a grouped-convolution kernel
    # depthwise_direct only: the filter R x S it is compiled for, and the stride / dilation (height, width) compiled
    # in; (0, 0) = `any`, read at run time (CUTLASS's optimized iterator instead of kFixedStrideDilation)
    filter: tuple[int, int] | None = None
    conv_stride: tuple[int, int] | None = None
    conv_dilation: tuple[int, int] | None = None
    spec_file: str = field(default="", compare=False)
    spec_index: int = field(default=0, compare=False)
    spec_hash: str = field(default="", compare=False)

    @property
    def family(self) -> str:
        return "conv"

    @property
    def dims(self) -> int:
        return self.layout.dims

    def replace(self, **changes: Any) -> "ConvInstance":
        return dataclasses.replace(self, **changes)

    def config(self) -> dict[str, Any]:
        """The resolved configuration as plain JSON data (the manifest's `config`)."""
        def plain(v: Any) -> Any:
            if isinstance(v, Enum):
                return v.value[0] if isinstance(v.value, tuple) else v.value
            if isinstance(v, Shape3):
                return v.as_list()
            if isinstance(v, tuple):
                return list(v)
            if isinstance(v, ConvEpilogue):
                out: dict[str, Any] = {"activation": v.activation.value, "bias": v.bias}
                if v.activation is Activation.clamp:
                    out["clamp_min"] = v.clamp_min
                    out["clamp_max"] = v.clamp_max
                return out
            return v
        skip = {"spec_file", "spec_index", "spec_hash"}
        if self.kernel is ConvKernelKind.implicit:   # the implicit kernel's manifest entry stays as it always was
            skip |= {"kernel", "schedule", "scheduler", "swap_ab"}
        if self.group_mode is ConvGroupMode.none:    # so does every ungrouped instance's
            skip.add("group_mode")
        if self.kernel is ConvKernelKind.depthwise_simt:     # its filter only: stride and dilation are run-time
            skip |= {"conv_stride", "conv_dilation"}
        elif self.kernel is not ConvKernelKind.depthwise_direct:
            skip |= {"filter", "conv_stride", "conv_dilation"}
        out = {f.name: plain(getattr(self, f.name)) for f in dataclasses.fields(self) if f.name not in skip}
        out["dims"] = self.dims
        return out


from emitter.families.base import Rejection  # noqa: E402  (shared by every family; re-exported here)
