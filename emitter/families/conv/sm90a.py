"""CUTLASS 3.x (sm90a) convolution: conv::collective::CollectiveBuilder (KernelImplicitTmaWarpSpecializedSm90,
im2col TMA) + epilogue::collective::CollectiveBuilder (TmaWarpSpecialized) + conv::kernel::ConvUniversal over
ConvProblemShape. resolve() checks what these builders and the kernel's can_implement need before nvcc.

Facts (compiled in emitter's entry form with nvcc 13.0, CUTLASS 4.2): the device code needs
cutlass/kernel_hardware_info.h; the tile's K mode must be nested (Shape<_128,_128,Shape<_64>>; wgrad nests N
too, as CUTLASS's generator writes it); only the non-persistent schedule exists (the cooperative / pingpong conv
schedules static_assert); TMA needs 16-byte rows (C % 8 for f16: C = 3 is refused, use the sm80 few/fixed
channel iterators for a first layer); padding <= 256 (2D) / 16 (3D); groups = 1; alignof(Params) = 128.
The kernel has one producer and ONE consumer warpgroup (256 threads): a tile's f32 accumulators take
m*n/128 registers a thread, so 128x256 (256) spills (4684 bytes, ptxas -v) -- accepted, as CUTLASS's generator
emits it, but 128x128 / 64x256 are the largest tiles that keep their accumulators in registers.

`kernel: gemm_1x1` (fprop, dgrad, wgrad): a 1x1, stride-1, unpadded conv on NHWC tensors is a GEMM, built here with
gemm::collective::CollectiveBuilder + epilogue::collective::CollectiveBuilder + gemm::kernel::GemmUniversal and a
persistent schedule (KernelTmaWarpSpecializedCooperative / ...Pingpong) with the persistent or stream-K tile
scheduler (what the conv kernel lacks: the 1x1 layers' short K-dim (fprop) or few output tiles (wgrad) leave it
latency-bound or idle):
  fprop  D[N*D*H*W, K] = x[N*D*H*W, C] . w[K, C]^T   A row-major (K-major), B = w N x K K-major, C/D row-major
  dgrad  dx[N*D*H*W, C] = dy[N*D*H*W, K] . w[K, C]  A = dy row-major (K-major), B = w N-major (MN-major: 16-bit),
                                                     D = dx row-major
  wgrad  dw[K, C] = dy[N*Z*P*Q, K]^T . x[N*D*H*W, C] A = dy M-major, B = x N-major (MN-major TMA/wgmma: 16-bit),
                                                     D = dw row-major [K, C] (== KRSC, R = S = 1)
The shim (templates/conv/sm90a/gemm1x1_device.cu.j2) keeps the conv ABI and refuses every problem that is not
such a GEMM (EMITTER_CANNOT_IMPLEMENT); problem.not_supported_reasons says the same in words.

`split_k: parallel` (wgrad, f16/bf16, clusters of at most 2 CTAs, tiles up to 128x128): wgrad's implicit GEMM (M = K, N = C*R*S
tiled along C with S, R as their own modes, K-dim = N*Z*P*Q) has a handful of output tiles over a reduction of
10^5..10^6 (C64 56^2 K64 3x3 at N = 128: 9 tiles of 64x64, 6272 k-tiles each), which CUTLASS's non-persistent
kernel leaves on 9 SMs. The same conv collectives run under emitter's persistent kernel
(templates/conv/sm90a/splitk_conv_universal.cu.j2) and stream-K tile scheduler: the conv ABI's run-time
split_k_slices > 1 cuts each tile's k-tiles into that many units (1: CUTLASS's stream-K heuristic), the units of a
tile sum f32 partials in the workspace (atomic adds, so the last bits may differ run to run) and its last unit runs
the epilogue. Mainloop and epilogue shared memory are separate there, which the stage count already allows for.

`stride_support: strided` (dgrad): CUTLASS 4.2's sm90 dgrad collective is unit-stride only (its im2col TMA steps dy
by the traversal stride, fprop's gather; the strided-dgrad collective is sm100's). emitter's strided dgrad is the
stride-phase decomposition (dgrad_phase_plan below): per spatial dim of stride s, the dx rows i = s*t + a receive
the taps r = r0 + s*m only, r0 = (a + pad) mod s, and
    dx[s*t + a] = sum_m w[r0 + s*m] * dy[t + c - m],   c = (a + pad - r0) / s
a UNIT-stride dgrad of the filter view w[r0::s] (stride s*stride_w), front padding c, on the dx view dx[a::s]
(stride s*stride_x), dy unchanged. Each phase is CUTLASS's unit-stride sm90 dgrad (its ConvProblemShape takes the
views' strides and the phase's lower / upper padding); templates/conv/sm90a/strided_kernel.cu.j2 runs the phases
as the z-slices of ONE launch (each phase's Params, TMA descriptors included, in the kernel's by-value Params) and
a last slice writes beta * source (0 at beta = 0) where no tap lands: the phases without taps (a 1x1 filter at
stride 2: three of four) and the rows past the last dy row a phase reads.
"""

from __future__ import annotations

from emitter.dtypes import DType
from emitter.families.conv.common import GEMM_TEXT, epilogue_text, reject, tensor_text
from emitter.families.conv.model import (
    AUTO, Activation, Arch, ConvInstance, ConvKernelKind, ConvOp, ConvSchedule, ConvTileScheduler, IteratorAlgorithm,
    Rejection, Shape3, SplitK, StrideSupport,
)

ARCHES = (Arch.sm90a,)
LEVELS = ("mma", "epilogue", "mainloop", "kernel", "device", "entry")
SMEM_LIMIT = 232448
_INPUTS = (DType.f16, DType.bf16, DType.f32, DType.tf32, DType.s8)
_ACTIVATION_CPP = {
    Activation.relu: "cutlass::epilogue::thread::ReLu",
    Activation.gelu: "cutlass::epilogue::thread::GELU",
    Activation.silu: "cutlass::epilogue::thread::SiLu",
    Activation.sigmoid: "cutlass::epilogue::thread::Sigmoid",
    Activation.clamp: "cutlass::epilogue::thread::Clamp",
}


def _epilogue_smem(inst: ConvInstance) -> int:
    # TmaWarpSpecialized with EpilogueTileAuto: a 64 x 32 (or tile-sized) subtile, C and D staged (2 + 2)
    sub = min(inst.tile.m, 64) * min(inst.tile.n, 32) * inst.c.bytes
    return 4 * sub + 1024


def mainloop_stage_bytes(inst: ConvInstance) -> int:
    return (inst.tile.m + inst.tile.n) * inst.tile.k * inst.a.bytes + 32


def resolve(inst: ConvInstance) -> ConvInstance | Rejection:
    if inst.arch not in ARCHES:
        return reject(inst, "arch", f"the sm90a conv module does not build {inst.arch}")
    if inst.group_mode.value != "none":
        return reject(inst, "group-sm80-only", f"group_mode {inst.group_mode}: grouped convolution is CUTLASS 2.x's "
                                               f"DefaultConv2dGroupFprop (the 3.x conv collective has no groups): use "
                                               f"arch: sm80 (its sm_80 build runs on Hopper), or group_mode: none")
    if inst.a not in _INPUTS:
        return reject(inst, "dtype-input", f"{inst.a} convolution is not built on sm90a by emitter: use f16, bf16, "
                                           f"f32 (tf32 math) or s8")
    a = DType.f32 if inst.a is DType.tf32 else inst.a
    if a is DType.s8:
        if inst.accumulator is not DType.s32:
            return reject(inst, "dtype-accumulator", f"accumulator {inst.accumulator} with s8 inputs: use s32")
    elif inst.accumulator is not DType.f32 and not (a is DType.f16 and inst.accumulator is DType.f16):
        return reject(inst, "dtype-accumulator", f"accumulator {inst.accumulator} with {a} inputs: use f32 "
                                                 f"(f16 accumulation only for f16 inputs)")
    allowed_c = {DType.f16: (DType.f16, DType.f32), DType.bf16: (DType.bf16, DType.f32), DType.f32: (DType.f32,),
                 DType.s8: (DType.s8, DType.s32)}[a]
    if inst.c not in allowed_c:
        return reject(inst, "dtype-output", f"output {inst.c} with {a} inputs: use one of "
                                            f"{', '.join(map(str, allowed_c))}")
    if a is DType.s8 and inst.epilogue.activation is not Activation.identity:
        return reject(inst, "activation-s8", "s8 convolution outputs integers: no activation")
    if inst.epilogue_compute not in (DType.f32, DType.f16) or (inst.epilogue_compute is DType.f16 and inst.accumulator is not DType.f16):
        return reject(inst, "dtype-epilogue", f"epilogue compute {inst.epilogue_compute}: use f32")
    if inst.warp is not None or inst.instruction is not None:
        return reject(inst, "warp-is-2x", "warp and instruction shapes are CUTLASS 2.x choices: the sm90 collective "
                                          "builder picks the wgmma; remove warp/instruction (or use arch: sm80)")
    if inst.iterator is not IteratorAlgorithm.optimized:
        return reject(inst, "iterator-is-2x", f"iterator {inst.iterator} is a CUTLASS 2.x choice (sm90a gathers with "
                                              f"im2col TMA): remove `iterator` or use arch: sm80")
    if inst.swizzle != 1:
        return reject(inst, "swizzle-is-2x", "swizzle is a 2.x threadblock swizzle; the sm90 conv kernel is "
                                             "non-persistent (one CTA per tile): remove `swizzle`")
    if inst.kernel is ConvKernelKind.gemm_1x1:
        return _resolve_gemm_1x1(inst, a)
    if inst.schedule is not ConvSchedule.auto or inst.scheduler is not ConvTileScheduler.auto or inst.swap_ab:
        return reject(inst, "schedule-gemm-1x1-only", f"schedule {inst.schedule} / scheduler {inst.scheduler} / swap_ab: the "
                                                      f"sm90 conv kernel has one schedule (non-persistent); persistent "
                                                      f"schedules are for `kernel: gemm_1x1` (1x1 fprop/wgrad): remove "
                                                      f"schedule/scheduler/swap_ab or add kernel: gemm_1x1")
    if inst.op is ConvOp.dgrad and inst.stride_support is StrideSupport.strided:
        why = _strided_dgrad_rejection(inst, a)
        if why is not None:
            return why
    if inst.split_k is not SplitK.none:
        why = _split_k_rejection(inst, a)
        if why is not None:
            return why
    if inst.epilogue.bias and inst.op is not ConvOp.fprop:
        return reject(inst, "bias-fprop-only", f"a per-channel bias belongs to the forward output; {inst.op} writes a "
                                               f"gradient: remove bias")
    t = inst.tile
    if t.m not in (64, 128, 256):
        return reject(inst, "tile-m", f"tile m={t.m}: a consumer warpgroup's wgmma covers 64 rows; use 64, 128 or 256")
    if t.n % 16 or not 16 <= t.n <= 256:
        return reject(inst, "tile-n", f"tile n={t.n}: wgmma N must be a multiple of 16 up to 256 (64, 128, 256 "
                                      f"are what CUTLASS's generator emits)")
    kbytes = t.k * a.bytes
    if kbytes not in (64, 128, 256):
        return reject(inst, "tile-k", f"tile k={t.k} is {kbytes} bytes of {a}: the TMA/wgmma swizzle needs 64, 128 "
                                      f"or 256 bytes, e.g. k={128 // a.bytes} (4 wgmma k-steps)")
    cl = inst.cluster or Shape3(1, 1, 1)
    if cl.k != 1 or cl.m not in (1, 2, 4) or cl.n not in (1, 2, 4) or cl.m * cl.n > 4:
        return reject(inst, "cluster", f"cluster {cl}: use m, n in 1, 2, 4 with m*n <= 4 and k = 1 (CUTLASS's "
                                       f"generator: 1x1x1, 2x1x1, 1x2x1)")
    full = 128 // a.bytes // 8
    need = 16 // a.bytes
    out_need = 16 // inst.c.bytes
    al = [inst.alignment_a or need, inst.alignment_b or need, inst.alignment_c or out_need]
    del full
    if al[0] != need or al[1] != need or al[2] != out_need:
        return reject(inst, "alignment-tma", f"alignment {al[0]}x{al[1]}x{al[2]}: TMA moves 16-byte rows, so "
                                             f"sm90a conv needs {need}x{need}x{out_need} (channels C and K multiples "
                                             f"of {need}); for C = 3 first layers use arch: sm80 with iterator: few_channels")
    per_stage = mainloop_stage_bytes(inst)
    budget = SMEM_LIMIT - _epilogue_smem(inst)
    max_stages = budget // per_stage
    stages = inst.stages
    if stages == AUTO:
        stages = min(max_stages, 8)
        if stages < 2:
            return reject(inst, "smem", f"tile {t} needs {per_stage} bytes a stage: not even 2 stages fit in "
                                        f"{SMEM_LIMIT} bytes of shared memory; use a smaller tile")
    elif stages > max_stages:
        return reject(inst, "smem", f"{stages} stages of tile {t} need {stages * per_stage + _epilogue_smem(inst)} "
                                    f"bytes of shared memory (limit {SMEM_LIMIT}): use stages <= {max_stages} or auto")
    if inst.epilogue.activation is not Activation.identity and inst.epilogue_compute is not DType.f32:
        return reject(inst, "activation-compute", "activations are computed in float: use epilogue: f32")
    return inst.replace(a=a, cluster=cl, alignment_a=al[0], alignment_b=al[1], alignment_c=al[2], stages=stages)


# the stride phases one launch holds (z-slices): stride_d * stride_h * stride_w of a problem, up to 3x3 (2D) and
# 2x2x2 (3D). The kernel's by-value Params hold one CUTLASS Params a phase (1536 bytes for f16 128x128x64): about
# 14 KiB, within CUDA 12.1's 32764-byte kernel-parameter limit (Volta and later), not the older 4 KiB.
STRIDED_DGRAD_MAX_PHASES = 9


def _strided_dgrad_rejection(inst: ConvInstance, a: DType) -> Rejection | None:
    """`stride_support: strided` on sm90a dgrad: the stride phases of emitter's kernel (see the module text)."""
    if a not in (DType.f16, DType.bf16):
        return reject(inst, "dgrad-strided-dtype", f"strided dgrad on sm90a is built for f16 and bf16 ({inst.a}: the "
                                                   f"phases' zero-tap slice writes beta * source in 16-bit types): "
                                                   f"use dtype f16 or bf16, or arch: sm80 with stride_support: strided")
    if inst.epilogue.activation is not Activation.identity:
        return reject(inst, "dgrad-strided-activation", f"activation {inst.epilogue.activation}: strided dgrad on "
                                                        f"sm90a writes a plain gradient (alpha * dgrad + beta * "
                                                        f"source): remove the activation")
    if inst.split_k is not SplitK.none:
        return reject(inst, "dgrad-strided-split-k", f"split_k {inst.split_k}: strided dgrad on sm90a runs its "
                                                     f"stride phases side by side in one launch: remove split_k")
    return None


def _dgrad_phase_dim(extent: int, taps: int, stride: int, pad: int, out: int, a: int) -> tuple[int, ...]:
    """One spatial dim of phase a: (r0, taps M, front padding c, dx rows T, rows the unit-stride dgrad computes Tc,
    its back padding). Rows t >= Tc read only dy rows past the last one (t + c - m >= P for every tap m): they are
    beta * source, like a phase without taps; below Tc the unit-stride problem's dy extent Tc + c + pad_back - M + 1
    is exactly P with pad_back >= 0, so dy is passed whole."""
    r0 = (a + pad) % stride
    m = 0 if r0 >= taps else (taps - 1 - r0) // stride + 1
    c = (a + pad - r0) // stride
    t = max(0, -(-(extent - a) // stride))
    tc = max(0, min(t, out - c + m - 1)) if m else 0
    return r0, m, c, t, tc, out - tc - c + m - 1


def dgrad_phase_plan(p) -> list[dict]:
    """The stride phases of dgrad problem p (a ConvProblem or anything with its fields), dilation 1, as the shim
    (templates/conv/sm90a/strided_kernel.cu.j2) plans them; each phase a dict of per-dim (depth, height, width)
    tuples: a (the dx offset), r0 (first tap), taps, pad (front), extent (dx rows T), conv (rows Tc the unit-stride
    dgrad writes), pad_back; `runs`: whether the phase launches a unit-stride dgrad (every taps and conv > 0)."""
    outs = p.output_extents()
    dims = [(p.d, p.t), (p.h, p.r), (p.w, p.s)]
    phases = []
    for ad in range(p.stride[0]):
        for ah in range(p.stride[1]):
            for aw in range(p.stride[2]):
                # a unit-stride dim stays whole (its dilation too)
                per = [_dgrad_phase_dim(dims[i][0], dims[i][1], p.stride[i], p.pad_front[i], outs[i], a)
                       if p.stride[i] > 1 else (0, dims[i][1], p.pad_front[i], dims[i][0], dims[i][0], p.pad_back[i])
                       for i, a in enumerate((ad, ah, aw))]
                ph = {"a": (ad, ah, aw)}
                for j, key in enumerate(("r0", "taps", "pad", "extent", "conv", "pad_back")):
                    ph[key] = tuple(d[j] for d in per)
                ph["runs"] = all(m > 0 for m in ph["taps"]) and all(t > 0 for t in ph["conv"])
                phases.append(ph)
    return phases


def _split_k_rejection(inst: ConvInstance, a: DType) -> Rejection | None:
    """`split_k: parallel` on sm90a: CUTLASS's conv collectives under emitter's persistent split-K / stream-K kernel
    (templates/conv/sm90a/splitk_*.cu.j2), built for wgrad's long reduction; None when the instance can have it."""
    if inst.split_k is SplitK.serial:
        return reject(inst, "split-k-3x", "serial split-K chains a tile's slices through the output in its own "
                                                 "type (CUTLASS 2.x); the sm90a split-K kernel sums f32 partials in a "
                                                 "workspace: use split_k: parallel (or arch: sm80 with split_k: serial)")
    if inst.op is not ConvOp.wgrad:
        return reject(inst, "split-k-wgrad-only", f"split_k {inst.split_k} on sm90a is built for wgrad (M = K, N = C*R*S: "
                                                  f"a few output tiles over a reduction of N*P*Q); {inst.op} has "
                                                  f"M = N*P*Q rows of tiles to fill the SMs: remove split_k")
    if a not in (DType.f16, DType.bf16) or inst.accumulator is not DType.f32:
        return reject(inst, "split-k-dtype", f"split_k {inst.split_k} on sm90a is built for f16 and bf16 inputs with "
                                             f"f32 accumulators (f32 partial sums), not {inst.a} / {inst.accumulator}: "
                                             f"use dtype f16 or bf16 with accumulator: f32, or remove split_k")
    cl = inst.cluster or Shape3(1, 1, 1)
    if cl.k != 1 or cl.m * cl.n > 2:
        # a cluster shares (multicasts) the dy tile along n / the x tile along m; the scheduler pads the tile
        # counts to whole clusters, so larger clusters add more empty tiles (wgrad: 9 n-tiles -> 12 at n = 4)
        return reject(inst, "split-k-cluster", f"cluster {cl} with split_k {inst.split_k}: use 1x1x1, 1x2x1 (dy "
                                               f"multicast to two filter taps / channel tiles) or 2x1x1")
    t = inst.tile
    if t.m not in (64, 128) or t.n > 128:
        return reject(inst, "split-k-tile", f"tile {t} with split_k {inst.split_k}: the one consumer warp group "
                                            f"holds a tile's f32 sums in registers and the fixup adds a tile's "
                                            f"partials to them: use m = 64 or 128 and n <= 128 (e.g. 64x64x64 for "
                                            f"K = C = 64 layers, 128x128x64 for 128)")
    return None


def _gemm_epilogue_smem(inst: ConvInstance, cooperative: bool) -> int:
    """An upper estimate of the GEMM epilogue's shared storage: EpilogueTileAuto subtiles (128 x 32 cooperative,
    64 x 32 otherwise), at most 4 stages shared by C and D (ElementC == ElementD, 16 or 32 bits: CUTLASS's
    ReuseSmemC), a bias row, barriers."""
    sub = min(inst.tile.m, 128 if cooperative else 64) * min(inst.tile.n, 32) * inst.c.bytes
    return 4 * sub + inst.tile.n * inst.c.bytes + 1024


def _resolve_gemm_1x1(inst: ConvInstance, a: DType) -> ConvInstance | Rejection:
    """kernel: gemm_1x1 -- the conv as a persistent CUTLASS 3.x GEMM (see the module text)."""
    if a not in (DType.f16, DType.bf16):
        return reject(inst, "gemm-1x1-dtype", f"kernel gemm_1x1 is built for f16 and bf16 inputs (wgrad reads "
                                              f"MN-major operands, which TMA/wgmma take for 16-bit types only), not "
                                              f"{inst.a}: use dtype f16 or bf16, or kernel: implicit")
    if inst.accumulator is not DType.f32:
        return reject(inst, "gemm-1x1-accumulator", f"accumulator {inst.accumulator}: kernel gemm_1x1 accumulates "
                                                    f"in f32: use accumulator: f32")
    if inst.epilogue.bias and inst.op is not ConvOp.fprop:
        return reject(inst, "bias-fprop-only", f"a per-channel bias belongs to the forward output; {inst.op} writes a "
                                               f"gradient: remove bias")
    if inst.swap_ab and inst.op is not ConvOp.wgrad:
        return reject(inst, "gemm-1x1-swap-ab", f"swap_ab is built for wgrad (dw^T = x^T . dy); {inst.op}'s GEMM "
                                                f"M = N*P*Q is already the long side: remove swap_ab")
    if inst.split_k is not SplitK.none:
        return reject(inst, "gemm-1x1-split-k", f"split_k {inst.split_k}: kernel gemm_1x1 splits the reduction with "
                                                f"its tile scheduler: use scheduler: stream_k and remove split_k")
    schedule = ConvSchedule.cooperative if inst.schedule is ConvSchedule.auto else inst.schedule
    scheduler = inst.scheduler
    if scheduler is ConvTileScheduler.auto:
        scheduler = ConvTileScheduler.stream_k if inst.op is ConvOp.wgrad else ConvTileScheduler.persistent
    if scheduler is ConvTileScheduler.stream_k and schedule is not ConvSchedule.cooperative:
        return reject(inst, "gemm-1x1-stream-k-pingpong", "CUTLASS's pingpong kernel does not take the stream-K "
                                                          "scheduler: use schedule: cooperative with scheduler: "
                                                          "stream_k, or scheduler: persistent")
    t = inst.tile
    if schedule is ConvSchedule.cooperative and t.m not in (128, 256):
        return reject(inst, "gemm-1x1-tile-m", f"tile m={t.m}: the cooperative kernel splits a tile's rows over two "
                                               f"consumer warpgroups of 64: use m = 128 or 256 (or schedule: "
                                               f"pingpong for m = 64)")
    if schedule is ConvSchedule.pingpong and t.m not in (64, 128):
        return reject(inst, "gemm-1x1-tile-m", f"tile m={t.m}: a pingpong consumer warpgroup owns a whole tile: "
                                               f"use m = 64 or 128")
    if t.n % 16 or not 16 <= t.n <= 256:
        return reject(inst, "tile-n", f"tile n={t.n}: wgmma N must be a multiple of 16 up to 256 (64, 128, 256 "
                                      f"are usual)")
    kbytes = t.k * a.bytes
    if kbytes not in (64, 128):
        return reject(inst, "tile-k", f"tile k={t.k} is {kbytes} bytes of {a}: use 64 or 128 bytes, e.g. "
                                      f"k={128 // a.bytes}")
    cl = inst.cluster or Shape3(1, 1, 1)
    if cl.k != 1 or cl.m not in (1, 2) or cl.n not in (1, 2) or cl.m * cl.n > 2:
        return reject(inst, "cluster", f"cluster {cl}: kernel gemm_1x1 takes 1x1x1, 2x1x1 or 1x2x1")
    need, out_need = 16 // a.bytes, 16 // inst.c.bytes
    al = [inst.alignment_a or need, inst.alignment_b or need, inst.alignment_c or out_need]
    if al != [need, need, out_need]:
        return reject(inst, "alignment-tma", f"alignment {al[0]}x{al[1]}x{al[2]}: TMA moves 16-byte rows, so kernel "
                                             f"gemm_1x1 needs {need}x{need}x{out_need} (C and K multiples of {need})")
    if inst.stages != AUTO:
        need_bytes = inst.stages * (mainloop_stage_bytes(inst) + 16) + _gemm_epilogue_smem(
            inst, schedule is ConvSchedule.cooperative)
        if inst.stages < 2 or need_bytes > SMEM_LIMIT:
            return reject(inst, "smem", f"{inst.stages} stages of tile {t} need about {need_bytes} bytes of shared "
                                        f"memory (limit {SMEM_LIMIT}): use fewer stages or stages: auto (the "
                                        f"epilogue's carve-out)")
    elif 2 * (mainloop_stage_bytes(inst) + 16) + _gemm_epilogue_smem(inst, schedule is ConvSchedule.cooperative) > SMEM_LIMIT:
        return reject(inst, "smem", f"tile {t}: not even 2 stages fit in {SMEM_LIMIT} bytes of shared memory; use "
                                    f"a smaller tile")
    if inst.epilogue.activation is not Activation.identity and inst.epilogue_compute is not DType.f32:
        return reject(inst, "activation-compute", "activations are computed in float: use epilogue: f32")
    # stride 1 only: the name and the library's dispatch key say unity
    return inst.replace(a=a, cluster=cl, alignment_a=al[0], alignment_b=al[1], alignment_c=al[2],
                        stride_support=StrideSupport.unity, schedule=schedule, scheduler=scheduler)


def _fusion_cpp(inst: ConvInstance) -> str:
    ns = "cutlass::epilogue::fusion::"
    act = inst.epilogue.activation
    types = "ElementD, ElementCompute"
    if not inst.epilogue.bias:
        if act is Activation.identity:
            return f"{ns}LinearCombination<{types}, ElementC, ElementCompute>"
        return f"{ns}LinCombEltAct<{_ACTIVATION_CPP[act]}, {types}, ElementC, ElementCompute>"
    # the conv output is (M = N*Z*P*Q) x (N = K): one bias value per output channel = CUTLASS's per-column bias
    tail = f"{types}, ElementBias, ElementC, ElementCompute, AlignmentBias"
    if act is Activation.identity:
        return f"{ns}LinCombPerColBias<{tail}>"
    return f"{ns}LinCombPerColBiasEltAct<{_ACTIVATION_CPP[act]}, {tail}>"


def _cute_shape(dims: list[int], nest: tuple[bool, bool, bool]) -> str:
    parts = [f"cute::Shape<cute::_{d}>" if n else f"cute::_{d}" for d, n in zip(dims, nest)]
    return "cute::Shape<" + ", ".join(parts) + ">"


def template_context(inst: ConvInstance) -> dict:
    """C++ spellings derived from enums and integers only."""
    a_t, b_t = inst.op.operands
    out = inst.op.output
    elem_in = "float" if inst.a in (DType.f32, DType.tf32) else inst.a.cpp   # the builder picks tf32 wgmma for float
    cl = inst.cluster or Shape3(1, 1, 1)
    return {
        "arch": inst.arch.yaml,
        "op": inst.op.value,
        "op_cpp": inst.op.cpp,
        "dims": inst.dims,
        "gemm_text": GEMM_TEXT[inst.op],
        "layout_cpp": inst.layout.cpp,
        # wgrad writes filters: CUTLASS's epilogue tag for a KRSC / KTRSC gradient (the generator's choice)
        "layout_c_cpp": ({2: "cutlass::layout::TensorKCSR", 3: "cutlass::layout::TensorKCSRT"}[inst.dims]
                         if inst.op is ConvOp.wgrad else inst.layout.cpp),
        "element_a": elem_in,
        "element_b": elem_in,
        "element_c": inst.c.cpp,
        "element_accumulator": inst.accumulator.cpp,
        "element_compute": inst.epilogue_compute.cpp,
        "tensor_a": tensor_text(inst, a_t),
        "tensor_b": tensor_text(inst, b_t),
        "tensor_c": tensor_text(inst, out),
        "alignment_a": inst.alignment_a,
        "alignment_b": inst.alignment_b,
        "alignment_c": inst.alignment_c,
        "alignment_bias": inst.alignment_c,
        "align_bytes_c": inst.alignment_c * inst.c.bytes,
        "tile_shape": _cute_shape(inst.tile.as_list(), (False, inst.op is ConvOp.wgrad, True)),
        "cluster_shape": f"cute::Shape<cute::_{cl.m}, cute::_{cl.n}, cute::_{cl.k}>",
        "cluster": cl.as_list(),
        "stages_text": str(inst.stages),
        "stage_count_cpp": f"cutlass::conv::collective::StageCount<{int(inst.stages)}>",
        "epilogue_text": epilogue_text(inst),
        "fusion_cpp": _fusion_cpp(inst),
        "has_bias": inst.epilogue.bias,
        "is_clamp": inst.epilogue.activation is Activation.clamp,
        "clamp_min": inst.epilogue.clamp_min,
        "clamp_max": inst.epilogue.clamp_max,
        "output_shape_var": {"x": "shape_x", "w": "shape_w", "y": "shape_y"}[out],
        "output_ptr": out,
        "ptr_a": a_t,
        "ptr_b": b_t,
        "unity_stride": inst.stride_support is StrideSupport.unity,
        # stride_support: strided dgrad -- the stride phases of strided_kernel.cu.j2 (one launch, z-slices)
        "strided_dgrad": inst.op is ConvOp.dgrad and inst.stride_support is StrideSupport.strided,
        "max_phases": STRIDED_DGRAD_MAX_PHASES,
        # split_k: parallel -- the persistent split-K / stream-K kernel of splitk_*.cu.j2 (device.cu.j2 passes the
        # run-time slice count to its scheduler)
        "split_k_parallel": inst.split_k is SplitK.parallel,
        # the row (channel) alignment each tensor needs, by its role in this op
        **{f"align_{t}": al for t, al in ((a_t, inst.alignment_a), (b_t, inst.alignment_b), (out, inst.alignment_c))},
        **(gemm_1x1_context(inst) if inst.kernel is ConvKernelKind.gemm_1x1 else {}),
    }


def gemm_1x1_context(inst: ConvInstance) -> dict:
    """What templates/conv/sm90a/gemm1x1_*.cu.j2 add for `kernel: gemm_1x1` (enums and integers only)."""
    fprop = inst.op is ConvOp.fprop
    swap = inst.swap_ab
    coop = inst.schedule is not ConvSchedule.pingpong
    stream_k = inst.scheduler is ConvTileScheduler.stream_k
    row, col = "cutlass::layout::RowMajor", "cutlass::layout::ColumnMajor"
    dgrad = inst.op is ConvOp.dgrad
    if fprop:      # A = x [NPQ, C] K-major, B = w [K, C] (N x K, K-major), D = y [NPQ, K] row-major
        ptrs, mnk, lds = ("x", "w"), "M = int(npq), N = p->k, K = p->c", "lda = ldx, ldb = ldw, ldc = ldy"
        text = "GEMM M = N*Z*P*Q, N = K, K = C (x . w^T)"
    elif dgrad:    # A = dy [NPQ, K] K-major, B = w [K, C] read N-major (KRSC rows are C), D = dx [NPQ, C] row-major
        ptrs, mnk, lds = ("y", "w"), "M = int(npq), N = p->c, K = p->k", "lda = ldy, ldb = ldw, ldc = ldx"
        text = "GEMM M = N*D*H*W, N = C, K = K (dy . w)"
    elif not swap:  # A = dy [NPQ, K] read M-major, B = x [NPQ, C] read N-major, D = dw [K, C] row-major
        ptrs, mnk, lds = ("y", "x"), "M = p->k, N = p->c, K = int(npq)", "lda = ldy, ldb = ldx, ldc = ldw"
        text = "GEMM M = K, N = C, K = N*Z*P*Q (dy^T . x)"
    else:          # A = x read M-major, B = dy read N-major, D = dw^T [C, K] column-major (the same dw [K, C] memory)
        ptrs, mnk, lds = ("x", "y"), "M = p->c, N = p->k, K = int(npq)", "lda = ldx, ldb = ldy, ldc = ldw"
        text = "GEMM M = C, N = K, K = N*Z*P*Q (dw^T = x^T . dy, D column-major)"
    return {
        "gemm_1x1": True,
        "gemm_layout_a": row if fprop or dgrad else col,
        "gemm_layout_b": col if fprop else row,
        "gemm_layout_c": col if swap else row,
        "gemm_a_ld_mode": 0 if fprop or dgrad else 1,
        "gemm_b_ld_mode": 0 if fprop else 1,
        "gemm_c_ld_mode": 1 if swap else 0,
        "gemm_ptr_a": ptrs[0],
        "gemm_ptr_b": ptrs[1],
        "gemm_tensor_a": tensor_text(inst, ptrs[0]),
        "gemm_tensor_b": tensor_text(inst, ptrs[1]),
        "gemm_mnk_cpp": mnk,
        "gemm_lds_cpp": lds,
        "gemm_text_1x1": text,
        "gemm_tile_shape": f"cute::Shape<cute::_{inst.tile.m}, cute::_{inst.tile.n}, cute::_{inst.tile.k}>",
        "kernel_schedule_cpp": ("cutlass::gemm::KernelTmaWarpSpecializedCooperative" if coop
                                else "cutlass::gemm::KernelTmaWarpSpecializedPingpong"),
        "epilogue_schedule_cpp": ("cutlass::epilogue::TmaWarpSpecializedCooperative" if coop
                                  else "cutlass::epilogue::TmaWarpSpecialized"),
        "schedule_text": "cooperative" if coop else "pingpong",
        "is_stream_k": stream_k,
        "tile_scheduler_cpp": ("emitter_sk::StreamKSchedulerResettingLocks" if stream_k
                               else "cutlass::gemm::PersistentScheduler"),
        "gemm_stage_count_cpp": (
            "cutlass::gemm::collective::StageCountAutoCarveout<"
            "static_cast<int>(sizeof(typename CollectiveEpilogue::SharedStorage))>"
            if inst.stages == AUTO else f"cutlass::gemm::collective::StageCount<{int(inst.stages)}>"),
        "gemm_stages_text": "auto (the epilogue's carve-out)" if inst.stages == AUTO else str(int(inst.stages)),
        "ptr_c": inst.op.output,
    }
