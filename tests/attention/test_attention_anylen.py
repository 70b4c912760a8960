"""Any sequence length on the sm90a attention kernels, without a GPU: the run-time rules (every seq_q, seq_k
>= 1), the default verify problems (odd lengths, one query row, rows that see no key, padded rows), the
row-by-row verdict of the gapped GPU runs (emitter/families/attention/torch_run.py) catching each planted
off-by-one for its reason on numpy stand-ins of what the faulty kernel would write, and (`-m nvcc`) the TMA
descriptors CuTe builds for fixed-length tensors keeping the sequence as a mode of its own whose extent is
seq_q / seq_k exactly -- what makes TMA zero-fill rows past the end on load and drop them on the O store.

GPU side: tests/attention/test_attention_anylen_gpu.py, scripts/attention_anylen.sh.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import numpy as np
import pytest

from emitter.dtypes import DType
from emitter.families.attention import runtime as hooks
from emitter.families.attention import sm90a
from emitter.families.attention.model import Arch, AttentionInstance, Layout, Mask, Schedule
from emitter.families.attention.problem import make_problem, not_supported_reasons
from emitter.families.attention.reference import reference_sequence
from emitter.families.attention.torch_run import PLANTS, expected_reason, row_verdict

ROOT = Path(__file__).resolve().parents[2]


def sm90a_cfg(mask=Mask.causal_bottom_right, key_tail=True, gqa=True, layout=Layout.bshd, varlen=False, d=128):
    inst = sm90a.resolve(AttentionInstance(Arch.sm90a, DType.f16, d, d, 128, 128, schedule=Schedule.cooperative,
                                           mask=mask, key_tail=key_tail, lse=True, gqa=gqa, layout=layout,
                                           varlen=varlen))
    assert isinstance(inst, AttentionInstance), inst
    return hooks.AttentionConfig(name="t", arch="sm90a", instance=inst)


# ------------------------------------------------------------------------------------------------ rules
@pytest.mark.parametrize("sq,sk", [(1, 1), (1001, 1000), (7, 3), (4097, 1), (1, 131072), (197, 197)])
def test_sm90a_takes_every_length(sq, sk):
    cfg = sm90a_cfg()
    p = make_problem(batch=2, heads_q=8, heads_kv=2, seq_q=sq, seq_k=sk, head_dim=128)
    assert not_supported_reasons(cfg, p) == []


def test_sm90a_still_refuses_what_it_cannot_run():
    tail_off = sm90a_cfg(key_tail=False)
    p = make_problem(batch=1, heads_q=8, heads_kv=2, seq_q=77, seq_k=77, head_dim=128)
    assert any("key_tail" in r for r in not_supported_reasons(tail_off, p))
    bad_stride = make_problem(batch=1, heads_q=8, heads_kv=2, seq_q=77, seq_k=77, head_dim=128, pad=3)
    assert any("16 bytes" in r for r in not_supported_reasons(sm90a_cfg(), bad_stride))


@pytest.mark.parametrize("layout", [Layout.bshd, Layout.bhsd])
@pytest.mark.parametrize("quick", [True, False])
def test_default_problems_cover_any_length(layout, quick):
    cfg = sm90a_cfg(layout=layout)
    probs = [p for p, _ in hooks.default_problems(cfg, quick=quick)]
    runnable = [p for p in probs if not not_supported_reasons(cfg, p)]
    assert runnable == probs, [not_supported_reasons(cfg, p) for p in probs if p not in runnable]
    assert sum(p.seq_q % 8 != 0 for p in probs) >= 4                 # not multiples of the 16-byte vector
    assert any(p.seq_q == 1 for p in probs)                          # one query row (decode)
    assert any(p.seq_q > p.seq_k for p in probs) and any(p.seq_q < p.seq_k for p in probs)
    assert any(p.seq_q - p.seq_k >= 100 for p in probs)              # bottom-right: many rows without a key
    assert any(p.pad for p in probs)                                 # LSE padding right after the last row
    if not quick:
        assert any(p.seq_q > 2048 and p.seq_q % 8 for p in probs)


def test_default_problems_of_varlen_instances_have_odd_longest_sequences():
    cfg = sm90a_cfg(varlen=True)
    probs = [p for p, _ in hooks.default_problems(cfg, quick=True)]
    assert all(not not_supported_reasons(cfg, p) for p in probs)
    assert any(p.seq_q % 8 for p in probs)


# ------------------------------------------------------------------------------------------------ verdict
def _faulty(mask: str, sq: int, sk: int, plant: str | None, gap: int = 3, seed: int = 0):
    """What a kernel with `plant` would leave in gapped O / LSE buffers ([b=2, h=4, sq + gap, ...], NaN =
    unwritten), computed in numpy, and the reference of the true lengths."""
    rng = np.random.default_rng(seed)
    b, hq, hkv, d = 2, 4, 2, 16
    q = rng.standard_normal((b, hq, sq + gap, d))
    k = rng.standard_normal((b, hkv, sk + gap, d))
    v = rng.standard_normal((b, hkv, sk + gap, d))
    tq = sq + 1 if plant == "rows_past_end" else sq - 1 if plant == "last_row_dropped" else sq
    tk = sk + 1 if plant == "key_past_end" else sk
    o = np.full((b, hq, sq + gap, d), np.nan)
    lse = np.full((b, hq, sq + gap), np.nan)
    want_o = np.zeros((b, hq, sq, d))
    want_lse = np.zeros((b, hq, sq))
    for i in range(b):
        got_o, got_l = reference_sequence(q[i, :, :tq], k[i, :, :tk], v[i, :, :tk], 0.25, mask)
        o[i, :, :tq] = got_o.astype(np.float16)                       # the kernel's output dtype
        lse[i, :, :tq] = got_l
        want_o[i], want_lse[i] = reference_sequence(q[i, :, :sq], k[i, :, :sk], v[i, :, :sk], 0.25, mask)
    return o, lse, want_o, want_lse


@pytest.mark.parametrize("mask", ["none", "causal_top_left", "causal_bottom_right"])
@pytest.mark.parametrize("sq,sk", [(77, 77), (13, 40), (40, 13), (1, 9)])
def test_verdict_passes_a_right_kernel_and_catches_each_plant_for_its_reason(mask, sq, sk):
    o, lse, want_o, want_lse = _faulty(mask, sq, sk, None)
    v = row_verdict(o, lse, want_o, want_lse, "f16")
    assert v["status"] == "PASSED", v
    if mask == "causal_bottom_right" and sq > sk:
        assert np.isneginf(want_lse).any()                           # rows without keys were checked
    rows = 2 * 4
    for plant in PLANTS:
        if plant == "last_row_dropped" and sq < 2:
            continue
        v = row_verdict(*_faulty(mask, sq, sk, plant), "f16")
        if plant == "key_past_end" and mask == "causal_top_left" and sq <= sk:
            assert v["status"] == "PASSED", v      # no row reaches key sk: the fault cannot show (GPU plants avoid it)
            continue
        assert v["status"] == "FAILED", (plant, v)
        assert expected_reason(plant, v, rows=rows), (plant, v)
        others = [p for p in PLANTS if p != plant and (p != "last_row_dropped" or sq >= 2)]
        assert not any(expected_reason(p, v, rows=rows) for p in others if p != "key_past_end"), (plant, v)


@pytest.mark.parametrize("mask", ["none", "causal_top_left", "causal_bottom_right"])
def test_verdict_without_lse_catches_each_plant_for_its_reason(mask):
    sq, sk = 77, 5                    # the GPU plants' shape: few keys, so one more shows in O
    o, _, want_o, want_lse = _faulty(mask, sq, sk, None)
    assert row_verdict(o, None, want_o, want_lse, "bf16")["status"] == "PASSED"
    for plant in PLANTS:
        o, _, want_o, want_lse = _faulty(mask, sq, sk, plant)
        v = row_verdict(o, None, want_o, want_lse, "bf16")
        assert v["status"] == "FAILED" and expected_reason(plant, v, rows=8, lse=False), (plant, v)
    o, lse, want_o, want_lse = _faulty(mask, sq, sk, "rows_past_end")
    assert row_verdict(o, lse, want_o, want_lse, "f16")["first_stray_row"] == sq


def test_verdict_catches_rows_without_keys_written_wrong():
    o, lse, want_o, want_lse = _faulty("causal_bottom_right", 40, 13, None)
    empty = np.isneginf(want_lse)
    assert empty.sum() == 2 * 4 * 27
    o2 = o.copy()
    o2[:, :, :40][empty] = 0.5                                       # O not zero where no key is seen
    assert row_verdict(o2, lse, want_o, want_lse, "f16")["empty_row_errors"] == int(empty.sum())
    lse2 = lse.copy()
    lse2[:, :, :40][empty] = np.inf                                   # upstream's +inf marker kept
    v = row_verdict(o, lse2, want_o, want_lse, "f16")
    assert v["status"] == "FAILED" and v["empty_row_errors"] == int(empty.sum())


# ------------------------------------------------------------------------------------------------ nvcc
TMA_PROBE = r"""
// The TMA descriptors of emitter's fixed-length sm90a attention tensors, as CuTe builds them from
// (seq, dim, (batch, head)) tensors with run-time strides: print each descriptor's dims and strides.
#include "cute/tensor.hpp"
#include "cute/atom/copy_traits_sm90_tma.hpp"
#include "cute/atom/mma_traits_sm90_gmma.hpp"
#include <cstdio>
using namespace cute;
using T = cutlass::half_t;

template<class SLayout, class Tiler>
void probe(const char* what, int S, int D, int B, int H, bool bshd, SLayout sl, Tiler tiler) {
  const int s_seq = bshd ? H * D : D, s_batch = bshd ? S * H * D : H * S * D, s_head = bshd ? D : S * D;
  auto g = make_tensor(make_gmem_ptr(static_cast<T*>(nullptr)),
                       make_layout(make_shape(S, D, make_shape(B, H)), make_stride(s_seq, _1{}, make_stride(s_batch, s_head))));
  auto cta_v_map = make_identity_layout(shape(g)).compose(tiler);
  auto basis = cute::detail::construct_tma_gbasis<T>(g, get_nonswizzle_portion(sl), cta_v_map);
  cute::array<uint64_t, 5> dims = {1, 1, 1, 1, 1};
  cute::array<uint64_t, 5> strides = {0, 0, 0, 0, 0};
  cute::detail::fill_tma_gmem_shape_stride(recast<T>(g), stride(basis), dims, strides);
  std::printf("%s S=%d D=%d B=%d H=%d %s dims %llu %llu %llu %llu %llu strides %llu %llu %llu %llu %llu\n",
              what, S, D, B, H, bshd ? "bshd" : "bhsd",
              (unsigned long long)dims[0], (unsigned long long)dims[1], (unsigned long long)dims[2],
              (unsigned long long)dims[3], (unsigned long long)dims[4], (unsigned long long)strides[0],
              (unsigned long long)strides[1], (unsigned long long)strides[2], (unsigned long long)strides[3],
              (unsigned long long)strides[4]);
}

// split_kv's packed positions (templates/attention/sm90a/split_kv_mainloop.cu.j2, load_nested_q): TMA writes a
// (64 columns, pack, 64 / pack) box densely, rows in order, 16-byte chunk (col / 8) XOR (row % 8) of each
// 128-byte row (SWIZZLE_128B), one box per 64 columns at stage + block * 64 * 64. Count the elements of a
// 2-stage, 64-row Q layout as the collective builds it (K-major SW128, the static_assert in the mainloop level)
// that the consumers read from anywhere else.
template<int D>
void packed_q(void) {
  auto stages = tile_to_shape(GMMA::Layout_K_SW128_Atom<T>{}, make_shape(_64{}, Int<D>{}, Int<5>{}), Step<_1, _2, _3>{});
  alignas(1024) static T buffer[2 * 64 * D];
  Tensor sQ = make_tensor(make_smem_ptr(buffer), composition(stages, make_tuple(_, _, make_layout(Int<2>{}))));
  int bad = 0;
  for (int st = 0; st < 2; ++st)
    for (int r = 0; r < 64; ++r)
      for (int c = 0; c < D; ++c) {
        const int cc = c % 64;
        const int box = st * 64 * D + (c / 64) * 64 * 64 + r * 64 + ((cc / 8) ^ (r % 8)) * 8 + cc % 8;
        bad += int(&sQ(r, c, st) - buffer) != box;
      }
  std::printf("packedq D=%d elements %d misplaced %d\n", D, 2 * 64 * D, bad);
}

int main() {
  using namespace cute::GMMA;
  packed_q<64>();
  packed_q<128>();
  packed_q<256>();
  // Q / K tiles (64 or 128 rows x head dim, K-major, the collective's swizzle atoms) and the epilogue's
  // 64 x 32 D tile
  auto d32 = tile_to_shape(Layout_K_SW64_Atom<T>{}, make_shape(_64{}, _32{}));
  auto d64 = tile_to_shape(Layout_K_SW128_Atom<T>{}, make_shape(_64{}, _64{}));
  auto d128 = tile_to_shape(Layout_K_SW128_Atom<T>{}, make_shape(_128{}, _128{}));
  for (int S : {1, 7, 77, 197, 4097}) {
    for (int H : {1, 4}) {
      for (bool bshd : {true, false}) {
        probe("tile64x32", S, 32, 3, H, bshd, d32, make_shape(_64{}, _32{}));
        probe("tile64x64", S, 64, 3, H, bshd, d64, make_shape(_64{}, _64{}));
        probe("tile128x128", S, 128, 3, H, bshd, d128, make_shape(_128{}, _128{}));
      }
    }
  }
  return 0;
}
"""


@pytest.mark.nvcc
def test_fixed_length_tma_descriptors_bound_the_sequence_exactly(tmp_path):
    """Every descriptor: dims (head dim, seq, batch, head) with the seq extent exactly S and strides in bytes
    the tensor's own -- so a box reaching past row S is clipped at S (zero-filled loads, dropped stores), never
    continued into the next sequence or head (which a seq mode merged with the batch mode would do). And the
    split_kv packed-positions Q boxes land where the consumers read upstream's Q stage, d64 / d128 / d256."""
    from emitter.build.nvcc import find_nvcc
    from emitter.cutlass_path import find_cutlass

    nvcc = find_nvcc()
    src = tmp_path / "probe.cu"
    src.write_text(TMA_PROBE)
    exe = tmp_path / "probe"
    incs = find_cutlass().include_flags()
    r = subprocess.run([str(nvcc), "-std=c++17", "--expt-relaxed-constexpr", *incs, "-o", str(exe), str(src)],
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-4000:]
    out = subprocess.run([str(exe)], capture_output=True, text=True, timeout=60).stdout.splitlines()
    packed = [line for line in out if line.startswith("packedq ")]
    assert packed == [f"packedq D={d} elements {128 * d} misplaced 0" for d in (64, 128, 256)], packed
    out = [line for line in out if not line.startswith("packedq ")]
    assert len(out) == 5 * 2 * 2 * 3
    for line in out:
        m = re.match(r"\S+ S=(\d+) D=(\d+) B=(\d+) H=(\d+) (\w+) dims (.*) strides (.*)$", line)
        assert m, line
        S, D, B, H = (int(m.group(i)) for i in range(1, 5))
        dims = [int(x) for x in m.group(6).split()]
        strides = [int(x) for x in m.group(7).split()]
        bshd = m.group(5) == "bshd"
        assert dims[:4] == [D, S, B, H], line
        s_seq, s_batch, s_head = (H * D, S * H * D, D) if bshd else (D, H * S * D, S * D)
        assert strides[:4] == [1, s_seq, s_batch, s_head], line     # elements


# ------------------------------------------------------------------------------------------------ torch (CPU)
def _right_kernel(mask):
    """What a right kernel does with the views it is handed (any strides): the reference of the lengths it is
    told, written into O and LSE; run_gapped's plants then tell it the wrong lengths."""
    from emitter.families.attention.torch_run import reference

    def run(q, k, v, o, lse, scale):
        want_o, want_lse = reference(q, k, v, mask=mask, scale=scale)
        o.copy_(want_o.to(o.dtype))
        if lse is not None:
            lse.copy_(want_lse.float())
    return run


@pytest.mark.parametrize("layout", ["bshd", "bhsd"])
@pytest.mark.parametrize("mask", ["none", "causal_top_left", "causal_bottom_right"])
@pytest.mark.parametrize("lse", [True, False])
def test_gapped_runs_catch_each_plant_for_its_reason(layout, mask, lse):
    """The GPU test's path end to end on the CPU (torch views of the gapped buffers, the kernel's problem
    struct, the verdict), with a stand-in kernel: clean runs pass, each plant fails for its own reason."""
    torch = pytest.importorskip("torch")
    from emitter.families.attention.torch_run import (PLANTS, check_gapped, expected_reason, gapped_tensors,
                                                      run_gapped)

    kern = _right_kernel(mask)
    b, hq, hkv, d = 2, 4, 2, 16
    for sq, sk in ((77, 5), (1, 9), (33, 33)):
        t = gapped_tensors(b, sq, sk, hq, hkv, d, dtype=torch.bfloat16, layout=layout, lse=lse, device="cpu")
        run_gapped(kern, t, scale=0.3)
        v = check_gapped(t, mask, "bf16", scale=0.3)
        assert v["status"] == "PASSED", (sq, sk, v)
    sq, sk = 77, 5
    for plant in PLANTS:
        t = gapped_tensors(b, sq, sk, hq, hkv, d, dtype=torch.bfloat16, layout=layout, lse=lse, device="cpu", seed=1)
        run_gapped(kern, t, plant=plant)
        v = check_gapped(t, mask, "bf16")
        assert v["status"] == "FAILED" and expected_reason(plant, v, rows=b * hq, lse=lse), (plant, v)


@pytest.mark.parametrize("layout", ["bshd", "bhsd"])
def test_gapped_views_make_the_strides_the_shim_checks(layout):
    torch = pytest.importorskip("torch")
    from emitter.families.attention.torch_run import GAP, AttentionKernel, gapped_tensors, rows_view

    b, sq, sk, hq, hkv, d = 2, 77, 130, 8, 2, 64
    t = gapped_tensors(b, sq, sk, hq, hkv, d, dtype=torch.float16, layout=layout, device="cpu")
    p = AttentionKernel.problem(*(rows_view(t, n, sq if n in ("q", "o", "lse") else sk)
                                  for n in ("q", "k", "v", "o", "lse")))
    assert (p.batch, p.heads_q, p.heads_kv, p.seq_q, p.seq_k, p.head_dim) == (b, hq, hkv, sq, sk, d)
    rows_q, rows_k = sq + GAP, sk + GAP
    if layout == "bshd":
        assert tuple(p.stride_o) == (rows_q * hq * d, hq * d, d) and tuple(p.stride_k) == (rows_k * hkv * d, hkv * d, d)
    else:
        assert tuple(p.stride_o) == (hq * rows_q * d, d, rows_q * d) and tuple(p.stride_k) == (hkv * rows_k * d, d, rows_k * d)
    assert tuple(p.stride_lse) == (hq * rows_q, rows_q)
    assert all(s * 2 % 16 == 0 for f in ("stride_q", "stride_k", "stride_v", "stride_o") for s in getattr(p, f))


# ------------------------------------------------------------------------------------------------ split KV (decode)
def split_inst(**kw):
    base = dict(arch=Arch.sm90a, dtype=DType.bf16, head_dim=128, head_dim_v=128, tile_q=128, tile_kv=128,
                schedule=Schedule.split_kv, mask=Mask.causal_bottom_right, lse=True, gqa=True)
    base.update(kw)
    return AttentionInstance(**base)


def test_split_kv_resolves_and_names_itself():
    from emitter.families.attention.naming import instance_name

    inst = sm90a.resolve(split_inst())
    assert isinstance(inst, AttentionInstance) and inst.persistent is False and inst.stages == 5
    assert "_split_kv_" in instance_name(inst)
    r = sm90a.resolve(split_inst(persistent=True))
    assert r.rule == "sm90a-split-kv-persistent" and "persistent false" in r.reason
    r = sm90a.resolve(split_inst(varlen=True))
    assert r.rule == "sm90a-split-kv-varlen"


@pytest.mark.parametrize("args,pack,rows,splits", [
    ((1, 32, 8, 1, 131072), 4, 4, 16),      # decode, GQA: 8 tiles of 4 query heads, keys over 16 CTAs each (one wave)
    ((1, 32, 8, 16, 32768), 4, 64, 16),     # 16 positions x 4 query heads of a KV head: one tile a KV head
    ((1, 32, 4, 16, 30000), 8, 128, 30),    # group 8 x 16 positions: a full tile; 30 shares of 8 tiles (33: also 8)
    ((2, 40, 8, 5, 1000), 8, 40, 2),        # group 5 padded to 8 rows a position (3 of 8 rows not stored)
    ((4, 64, 8, 3, 5000), 8, 24, 4),        # 128 CTAs; 5 shares would be 160: two waves
    ((1, 64, 4, 9, 1000), 1, 9, 2),         # group 16 x 9 positions = 144 rows: over one tile, not packed
    ((1, 8, 8, 5, 1000), 1, 5, 2),          # no group: not packed
    ((64, 32, 8, 1, 4096), 4, 4, 1),        # 512 CTAs already: no split, no workspace
    ((2, 8, 2, 4097, 4097), 1, 4097, 1),    # prefill
    ((1, 8, 8, 1, 1000), 1, 1, 2),          # 8 key tiles: two shares of 4 (not 33 for the SMs)
])
def test_split_plan(args, pack, rows, splits):
    plan = sm90a.split_plan(sm90a.resolve(split_inst()), *args)
    assert (plan.pack, plan.rows, plan.splits) == (pack, rows, splits)
    assert (plan.workspace_bytes > 0) == (splits > 1)
    assert plan.nested == (pack > 1 and args[3] > 1)


def test_split_plan_packs_no_positions_at_d32():
    """The nested Q box is 64 columns of 128-byte swizzled rows: d32 keeps one query head a tile for seq_q > 1
    (one query row still packs: upstream's own Q load with the query-head stride)."""
    inst = sm90a.resolve(split_inst(head_dim=32, head_dim_v=32, tile_kv=64))
    assert sm90a.split_plan(inst, 1, 32, 8, 4, 4096).pack == 1
    assert sm90a.split_plan(inst, 1, 32, 8, 1, 4096).pack == 4


def _packed_split_model(q, k, v, *, layout, plan, tile_q, tile_kv, mask, scale, plant=None):
    """What the split_kv kernel computes for packed heads, step by step, in float64: per (batch, KV head) the
    Q tile is gathered box by box from the flat buffer through the shim's nested view (sm90a.nested_q_view:
    warp group w's 64 rows are the (pack, 64 / pack) box at position w * 64 / pack, dense in box order), every
    row masked at its position row // pack, the key tiles split into plan.splits shares (the mask level's trip
    count over the kernel's rows), each share's O and LSE combined as the epilogue does, and the rows stored
    through sm90a.packed_rows. plant: "wrong_head" stores row (s, g) as head g + 1; "row_as_position" masks
    at the row instead of the position."""
    if layout == "bshd":
        b_, sq, hq, d = q.shape
        sk, hkv = k.shape[1], k.shape[2]
        stride_q = (sq * hq * d, hq * d, d)
    else:
        b_, hq, sq, d = q.shape
        sk, hkv = k.shape[2], k.shape[1]
        stride_q = (hq * sq * d, d, sq * d)
    kk = k if layout == "bshd" else k.transpose(0, 2, 1, 3)          # [B, S, H, D] from here on
    vv = v if layout == "bshd" else v.transpose(0, 2, 1, 3)
    flat = np.ascontiguousarray(q).ravel()
    dims, strides, box = sm90a.nested_q_view(plan, stride_q, b_, hkv, sq, d)
    assert dims == (d, plan.group, sq, b_, hkv) and box[1] * box[2] == tile_q // 2
    group, pack, rows = plan.group, plan.pack, plan.rows
    o = np.full((b_, sq, hq, d), np.nan)
    lse = np.full((b_, hq, sq), np.nan)
    tiles_k = -(-sk // tile_kv)
    diag_rows = sk - rows if mask == "causal_bottom_right" else 0
    total = tiles_k if mask == "none" else max(1, min(tiles_k, -(-(min(tile_q, rows) + diag_rows) // tile_kv)))
    per = -(-total // plan.splits)
    diag = sk - sq if mask == "causal_bottom_right" else 0
    keys = np.arange(sk)
    for b in range(b_):
        for kv in range(hkv):
            tile = np.zeros((tile_q, d))
            for w in range(2):                                        # one box per warp group (all columns)
                s0 = w * box[2]
                for sp in range(box[2]):
                    for g in range(box[1]):
                        s = s0 + sp
                        if g < group and s < sq:
                            at = g * strides[1] + s * strides[2] + b * strides[3] + kv * strides[4]
                            tile[w * 64 + sp * pack + g] = flat[at:at + d]
            scores = tile[:rows] @ kk[b, :, kv].T * scale              # [rows, sk]
            position = np.arange(rows) if plant == "row_as_position" else np.arange(rows) // pack
            visible = np.ones((rows, sk), bool) if mask == "none" else keys[None, :] <= position[:, None] + diag
            shares = []
            for j in range(plan.splits):
                lo, hi = j * per * tile_kv, min((j + 1) * per, total) * tile_kv
                sel = visible & (keys[None, :] >= lo) & (keys[None, :] < hi)
                m = np.where(sel, scores, -np.inf).max(axis=1)
                e = np.where(sel, np.exp(scores - np.where(np.isfinite(m), m, 0)[:, None]), 0.0)
                tot = e.sum(axis=1)
                with np.errstate(divide="ignore", invalid="ignore"):
                    shares.append((np.where(tot[:, None] > 0, e @ vv[b, :, kv] / tot[:, None], 0.0),
                                   np.where(tot > 0, m + np.log(tot), -np.inf)))
            top = np.max([ls for _, ls in shares], axis=0)
            wsum = sum(np.exp(ls - np.where(np.isfinite(top), top, 0)) for _, ls in shares)
            osum = sum(np.exp(ls - np.where(np.isfinite(top), top, 0))[:, None] * os for os, ls in shares)
            with np.errstate(divide="ignore", invalid="ignore"):
                out = np.where(np.isfinite(top)[:, None], osum / wsum[:, None], 0.0)
                out_lse = np.where(np.isfinite(top), top + np.log(wsum), -np.inf)
            for r, s, g in sm90a.packed_rows(plan, sq):
                h = kv * group + ((g + 1) % group if plant == "wrong_head" else g)
                o[b, s, h] = out[r]
                lse[b, h, s] = out_lse[r]
    return o, lse


@pytest.mark.parametrize("layout", ["bshd", "bhsd"])
@pytest.mark.parametrize("mask", ["none", "causal_bottom_right", "causal_top_left"])
def test_packed_positions_model_matches_the_reference(layout, mask):
    """seq_q 2..16 with grouped heads packed (group 2..8, padded groups 3 and 5 included), keys split over
    shares: every query head's O and LSE from the packed tile equal the float64 reference, in both layouts."""
    rng = np.random.default_rng(39)
    inst = sm90a.resolve(split_inst(head_dim=64, head_dim_v=64, tile_kv=64))
    checked = 0
    for sq, group, sk in ((2, 4, 1300), (3, 8, 77), (5, 3, 1000), (8, 8, 777), (16, 4, 700), (16, 8, 1), (7, 5, 640),
                          (12, 2, 3)):
        hkv, b = 2, 2
        hq = hkv * group
        plan = sm90a.split_plan(inst, b, hq, hkv, sq, sk)
        assert plan.nested and plan.rows == sq * plan.pack <= 128, plan
        bshd = layout == "bshd"
        shape_q, shape_k = ((b, sq, hq, 64), (b, sk, hkv, 64)) if bshd else ((b, hq, sq, 64), (b, hkv, sk, 64))
        q, k, v = rng.standard_normal(shape_q), rng.standard_normal(shape_k), rng.standard_normal(shape_k)
        o, lse = _packed_split_model(q, k, v, layout=layout, plan=plan, tile_q=128, tile_kv=64, mask=mask,
                                     scale=0.125)
        for bi in range(b):
            per_head = (lambda t: t[bi].transpose(1, 0, 2)) if bshd else (lambda t: t[bi])
            want_o, want_lse = reference_sequence(per_head(q), per_head(k), per_head(v), 0.125, mask)
            np.testing.assert_allclose(o[bi].transpose(1, 0, 2), want_o, rtol=1e-9, atol=1e-9)
            np.testing.assert_allclose(lse[bi], want_lse, rtol=1e-9, atol=1e-9)
        checked += plan.splits > 1
    assert checked >= 4                                       # most cases really split the keys


@pytest.mark.parametrize("plant,mask", [("wrong_head", "none"), ("row_as_position", "causal_bottom_right")])
def test_packed_positions_model_catches_a_misplaced_row(plant, mask):
    """The model can fail: a packed row stored as the next query head of its group, or masked at its row
    instead of its position, differs from the reference."""
    rng = np.random.default_rng(7)
    inst = sm90a.resolve(split_inst(head_dim=64, head_dim_v=64, tile_kv=64))
    sq, group, sk, hkv = 4, 4, 300, 1
    plan = sm90a.split_plan(inst, 1, group * hkv, hkv, sq, sk)
    q, k, v = (rng.standard_normal((1, sq, group, 64)), rng.standard_normal((1, sk, hkv, 64)),
               rng.standard_normal((1, sk, hkv, 64)))
    o, lse = _packed_split_model(q, k, v, layout="bshd", plan=plan, tile_q=128, tile_kv=64, mask=mask, scale=0.125,
                                 plant=plant)
    want_o, want_lse = reference_sequence(q[0].transpose(1, 0, 2), k[0].transpose(1, 0, 2), v[0].transpose(1, 0, 2),
                                          0.125, mask)
    assert not np.allclose(o[0].transpose(1, 0, 2), want_o, atol=1e-6)


def test_packed_rows_cover_each_position_and_head_once():
    """Every (position, query head of the group) is one stored row, for seq_q 1..16 and groups 1..16, packed
    or not; rows stay inside one tile; the mask's position of a row is row // pack; a warp group's 64 rows are
    one whole (pack, 64 / pack) box."""
    inst = sm90a.resolve(split_inst())
    for sq in range(1, 17):
        for group in range(1, 17):
            plan = sm90a.split_plan(inst, 1, 2 * group, 2, sq, 4096)
            got = sm90a.packed_rows(plan, sq)
            want_group = group if plan.pack > 1 else 1
            assert sorted((s, g) for _, s, g in got) == [(s, g) for s in range(sq) for g in range(want_group)]
            assert all(r < (plan.rows if plan.pack > 1 else sq) and r // plan.pack == s for r, s, g in got)
            if plan.nested:
                assert plan.pack >= group and plan.pack & (plan.pack - 1) == 0 and 64 % plan.pack == 0
                assert plan.rows == sq * plan.pack <= 128
            elif group > 1:
                assert sq == 1 or sq * (1 << (group - 1).bit_length()) > 128, (sq, group)


def _render(inst, name="anylen_split"):
    from emitter.render import banner, render_template

    r = sm90a.resolve(inst)
    return render_template("attention/sm90a/instance.cu.j2", inst=r, name=name, ctx=sm90a.template_context(r),
                           banner=banner("t.yaml", "0" * 64))


def test_split_kv_render():
    text = _render(split_inst())
    for words in ("struct SplitLoad", "struct SplitProblem", "split_of(blk_coord, params, problem_size)",
                  "static int bind_split", "cudaMemsetAsync", "* args.mainloop.splits", "atomicAdd(counter, 1)",
                  "kLoadsQSeparately, cute::true_type", "using TileScheduler = cutlass::fmha::kernel::IndividualTileScheduler"):
        assert words in text, words
    plain = _render(split_inst(schedule=Schedule.cooperative))
    assert "SplitProblem" not in plain and "bind_split" not in plain and "workspace_bytes = Device" not in plain


def test_compiled_plants_find_their_text(tmp_path):
    """Each bug the GPU test plants into a rendered instance (torch_run.COMPILED_PLANTS) finds its text exactly
    once in an instance of configs/attention/sm90a_anylen.yaml that it applies to."""
    import json

    from emitter.emit import emit
    from emitter.families.attention.torch_run import COMPILED_PLANTS

    emit([str(ROOT / "configs" / "attention" / "sm90a_anylen.yaml")], tmp_path, jobs=1)
    entries = json.loads((tmp_path / "manifest.json").read_text())["instances"]
    for kind, pick, edits in COMPILED_PLANTS:
        bases = [e for e in entries if pick(e["config"])]
        assert bases, f"{kind}: no instance of sm90a_anylen.yaml to plant into"
        for e in bases:
            text = (tmp_path / e["source"]).read_text()
            for old, _ in edits:
                assert text.count(old) == 1, (kind, e["name"], old)


@pytest.mark.nvcc
def test_split_kv_instance_builds_and_plans_like_python(tmp_path):
    """A split_kv instance through emit + build (device cubin and host shim, -DNDEBUG, no serialized wgmma);
    its shim, asked without a GPU, packs, splits and sizes the workspace as sm90a.split_plan says."""
    import ctypes
    import json
    import sys

    spec = tmp_path / "split.yaml"
    spec.write_text("kernels:\n  - family: attention\n    arch: sm90a\n    dtype: bf16\n    head_dim: 128\n"
                    "    tile: 128x128\n    schedule: split_kv\n    mask: causal_bottom_right\n    lse: true\n"
                    "    gqa: true\n")
    out = tmp_path / "out"
    r = subprocess.run([sys.executable, "-m", "emitter", "emit", str(spec), "-o", str(out)], capture_output=True,
                       text=True, cwd=ROOT, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    r = subprocess.run([sys.executable, "-m", "emitter", "build", str(out), "-j", "1", "--no-progress"],
                       capture_output=True, text=True, cwd=ROOT, timeout=1800)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    [entry] = json.loads((out / "manifest.json").read_text())["instances"]
    name = entry["name"]
    record = json.loads((out / "build" / name / "record.json").read_text())
    assert record["status"] in ("ok", "cached") and not record.get("serialized_wgmma")

    from emitter.families.attention.abi import AttentionShim, EmitterAttentionProblem
    shim = AttentionShim(out / record["artifacts"]["host"], name)
    reason = getattr(shim.lib, f"emitter_{name}_reason")
    reason.restype = ctypes.c_char_p
    inst = AttentionInstance.from_config(entry["config"])
    for b, hq, hkv, sq, sk in ((1, 32, 8, 1, 131072), (1, 32, 8, 16, 32768), (8, 32, 8, 1, 8192), (2, 8, 2, 4097, 4097),
                               (3, 8, 2, 1, 77), (1, 8, 1, 1, 1), (4, 64, 8, 3, 5000), (1, 32, 4, 16, 30000),
                               (2, 40, 8, 5, 1000), (1, 64, 4, 9, 1000), (2, 8, 8, 5, 1000)):
        p = EmitterAttentionProblem(batch=b, heads_q=hq, heads_kv=hkv, seq_q=sq, seq_k=sk, head_dim=128, head_dim_v=128)
        status, launch = shim.query(p)
        assert status == 0, reason()
        assert launch.workspace_bytes == sm90a.split_plan(inst, b, hq, hkv, sq, sk).workspace_bytes, (b, hq, hkv, sq, sk)


def test_library_dispatch_puts_split_kv_first_for_decode_only():
    from emitter.families.attention.library import DECODE_SEQ, AttentionKernel, candidates

    def k(i, schedule):
        return AttentionKernel(i, f"k{i}", sm90a.resolve(split_inst(schedule=schedule, mask=Mask.none)), 1)
    ks = [k(0, Schedule.cooperative), k(1, Schedule.split_kv), k(2, Schedule.pingpong)]
    q = dict(dtype=1, head_dim=128, head_dim_v=128, mask=0, varlen=False, heads_q=32, heads_kv=8, seq_k=32768, lse=True)
    for sq in (1, 7, DECODE_SEQ):
        assert [c.index for c in candidates(ks, cc=90, seq_q=sq, **q)][0] == 1
    for sq in (DECODE_SEQ + 1, 4096):
        assert [c.index for c in candidates(ks, cc=90, seq_q=sq, **q)][-1] == 1


@pytest.mark.parametrize("ctas,tiles,splits", [
    (16, 938, 8),       # 2 x 8 KV heads at 120k keys: 128 CTAs, one wave (the former rule: 17 shares, 272 CTAs, 3 waves)
    (32, 235, 4),       # 4 x 8 KV heads at 30k keys
    (64, 40, 2),        # 16 x 4 KV heads at 5k keys
    (512, 8, 1),        # enough CTAs: no split
    (1, 3, 1),          # fewer than SPLIT_MIN_TILES tiles
    (1, 100000, 64),    # one block, a very long KV: SPLIT_MAX
])
def test_split_count_fills_whole_waves(ctas, tiles, splits):
    got = sm90a.split_count(ctas, tiles)
    assert got == splits
    waves = -(-ctas * got // sm90a.SPLIT_SMS)
    # no other count the rule allows finishes sooner in the model
    most = max(1, min(tiles // sm90a.SPLIT_MIN_TILES, sm90a.SPLIT_MAX))
    cost = waves * (-(-tiles // got) + sm90a.SPLIT_FIXED_TILES)
    assert all(-(-ctas * s // sm90a.SPLIT_SMS) * (-(-tiles // s) + sm90a.SPLIT_FIXED_TILES) >= cost
               for s in range(1, most + 1))
