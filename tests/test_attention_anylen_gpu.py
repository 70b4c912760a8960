"""Any sequence length on the sm90a attention kernels, on the GPU (H100 / H200), against a float64 torch
reference: lengths 1..300 (every length below 18, the tile edges, a seeded sample of the rest) and a few
thousand, seq_q = seq_k and seq_q != seq_k both ways under each mask (both causal alignments), rows that see
no key (O = 0, LSE = -inf), GQA / MQA, both layouts; planted off-by-ones caught for their reason; the speed of
an odd length against the next multiple of 8.

Every problem sits in buffers 3 rows longer than its sequences (torch_run.gapped_tensors): O and LSE are NaN
everywhere first, so a row below seq_q left unwritten and a row past seq_q written (into the next sequence,
with packed tensors) both show, row by row (torch_run.row_verdict).

    scripts/attention_anylen.sh        (emit + build -j 16 + these tests + emitter verify + the library test)
or by hand:
    python3 -m emitter emit configs/attention/sm90a_anylen.yaml -o /tmp/anylen && python3 -m emitter build /tmp/anylen -j 16
    EMITTER_ATTENTION_ANYLEN_BUILD=/tmp/anylen python3 -m pytest -q -s -m gpu tests/test_attention_anylen_gpu.py

$EMITTER_ANYLEN_REPORT=<file.json> also writes the speed table there. Skips cleanly without torch, a compute
capability 9.0 GPU, or the build.
"""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")

ROOT = os.environ.get("EMITTER_ATTENTION_ANYLEN_BUILD", "")
DT = {"f16": torch.float16, "bf16": torch.bfloat16}
EDGES = [1, 2, 3, 5, 7, 8, 9, 15, 16, 17, 31, 33, 63, 64, 65, 77, 100, 127, 128, 129, 191, 192, 193, 197, 255,
         256, 257, 299, 300]
SAMPLE = sorted(set(EDGES) | set(random.Random(39).sample(range(1, 301), 16)))
THOUSANDS = [(2049, 2047), (3001, 1999), (1999, 3001), (4097, 4097), (1, 4097), (4097, 1), (2500, 7)]


def _skip_reason() -> str | None:
    if not torch.cuda.is_available():
        return "no CUDA device"
    if torch.cuda.get_device_capability() != (9, 0):
        return "sm90a kernels need a compute capability 9.0 GPU"
    if not ROOT or not (Path(ROOT) / "manifest.json").is_file():
        return "EMITTER_ATTENTION_ANYLEN_BUILD does not name an emitted + built sm90a attention directory"
    return None


@pytest.fixture(scope="module")
def kernels():
    why = _skip_reason()
    if why:
        pytest.skip(why)
    from emitter.families.attention.torch_run import AttentionKernel, manifest_configs

    torch.cuda.init()
    torch.empty(1, device="cuda")
    out = {name: (cfg, AttentionKernel(ROOT, name)) for name, cfg in manifest_configs(ROOT).items()
           if cfg["arch"] == "sm90a" and not cfg["varlen"]}
    if not out:
        pytest.skip(f"no fixed-length sm90a attention instance in {ROOT}")
    return out


def _heads(cfg) -> tuple[int, int]:
    return (8, 2) if cfg["gqa"] else (4, 4)


def _case(cfg, kern, sq, sk, *, b=2, hq=None, hkv=None, scale=0.0, plant=None, seed=0):
    from emitter.families.attention.torch_run import check_gapped, gapped_tensors, run_gapped

    dq, dkv = _heads(cfg)
    t = gapped_tensors(b, sq, sk, hq or dq, hkv or dkv, cfg["head_dim"], dtype=DT[cfg["dtype"]],
                       layout=cfg["layout"], lse=cfg["lse"], seed=seed)
    run_gapped(kern, t, scale=scale, plant=plant)
    return check_gapped(t, cfg["mask"], cfg["dtype"], scale=scale)


def _failures(results):
    return [f"{name} sq={sq} sk={sk}: {v['reason']}" for name, sq, sk, v in results if v["status"] != "PASSED"]


def test_lengths_1_to_300(kernels):
    """Equal lengths (every sampled n) and unequal ones both ways (n against the sample reversed)."""
    results = []
    for name, (cfg, kern) in kernels.items():
        pairs = [(n, n) for n in SAMPLE] + list(zip(SAMPLE, reversed(SAMPLE)))
        for i, (sq, sk) in enumerate(pairs):
            results.append((name, sq, sk, _case(cfg, kern, sq, sk, seed=i, scale=0.3 if i % 3 == 0 else 0.0)))
    bad = _failures(results)
    assert not bad, f"{len(bad)} of {len(results)} cases failed:\n" + "\n".join(bad[:40])
    print(f"\nlengths 1..300: {len(results)} cases on {len(kernels)} kernels passed")


def test_a_few_thousand(kernels):
    results = []
    for name, (cfg, kern) in kernels.items():
        for sq, sk in THOUSANDS:
            results.append((name, sq, sk, _case(cfg, kern, sq, sk, b=1, hq=4, hkv=2 if cfg["gqa"] else 4)))
    bad = _failures(results)
    assert not bad, "\n".join(bad)


def test_rows_without_keys(kernels):
    """Bottom-right with seq_q > seq_k: rows i < seq_q - seq_k see no key (O = 0, LSE = -inf, checked row by
    row by row_verdict); top-left and full masks over the same shapes for contrast."""
    from emitter.families.attention.torch_run import check_gapped, gapped_tensors, run_gapped

    seen_empty = 0
    for name, (cfg, kern) in kernels.items():
        for sq, sk in ((300, 20), (129, 1), (1000, 999), (77, 76), (5, 3)):
            hq, hkv = _heads(cfg)
            t = gapped_tensors(2, sq, sk, hq, hkv, cfg["head_dim"], dtype=DT[cfg["dtype"]], layout=cfg["layout"],
                               lse=cfg["lse"], seed=sq)
            run_gapped(kern, t)
            v = check_gapped(t, cfg["mask"], cfg["dtype"])
            assert v["status"] == "PASSED", f"{name} sq={sq} sk={sk}: {v['reason']}"
            if cfg["mask"] == "causal_bottom_right":
                o = t["o"][:, :sq - sk] if cfg["layout"] == "bshd" else t["o"][:, :, :sq - sk]
                assert bool((o == 0).all()), f"{name}: rows without keys not exactly 0"
                if t["lse"] is not None:
                    assert bool(torch.isneginf(t["lse"][:, :, :sq - sk]).all())
                seen_empty += 1
    if not any(c["mask"] == "causal_bottom_right" for c, _ in kernels.values()):
        pytest.skip("no causal_bottom_right instance in the build")
    assert seen_empty


def test_gqa_and_mqa_at_odd_lengths(kernels):
    results = []
    for name, (cfg, kern) in kernels.items():
        if not cfg["gqa"]:
            continue
        for hq, hkv in ((8, 2), (6, 1), (12, 3)):
            for sq, sk in ((77, 300), (197, 197), (1, 1000), (513, 33)):
                results.append((name, sq, sk, _case(cfg, kern, sq, sk, hq=hq, hkv=hkv, seed=hq + sq)))
    if not results:
        pytest.skip("no GQA instance in the build")
    bad = _failures(results)
    assert not bad, "\n".join(bad)


def test_planted_off_by_one_caught_for_its_reason(kernels):
    """Each kernel launched with a row or key bound one off (torch_run.PLANTS) must FAIL for that reason: a
    row past seq_q stored (exactly row seq_q of each (batch, head)), the last row never stored, a key past
    seq_k visible (LSE only too high; O off without LSE). seq_q > seq_k so every mask lets the extra
    key show."""
    from emitter.families.attention.torch_run import PLANTS, expected_reason

    b, sq, sk = 2, 77, 5          # few keys: one more shows in O too (instances without LSE)
    lines = []
    for name, (cfg, kern) in kernels.items():
        hq, _ = _heads(cfg)
        clean = _case(cfg, kern, sq, sk, b=b, seed=5)
        assert clean["status"] == "PASSED", f"{name}: {clean['reason']}"
        for plant in PLANTS:
            v = _case(cfg, kern, sq, sk, b=b, plant=plant, seed=5)
            ok = v["status"] == "FAILED" and expected_reason(plant, v, rows=b * hq, lse=cfg["lse"])
            lines.append(f"{name:60s} {plant:18s} {'CAUGHT' if ok else 'MISSED'}: {v['reason']}")
            assert ok, lines[-1]
    print("\n" + "\n".join(lines))


# ------------------------------------------------------------------------------------------------ speed
# (case, what the instance config must hold, batch, heads_q, heads_kv, length not a multiple of 8): against the
# next multiple of 8; batch x length about 16k tokens, seq_q = seq_k (causal: both alignments coincide).
SPEED = [
    ("LLM prefill GQA causal", dict(dtype="bf16", head_dim=128, mask="causal_bottom_right"), 4, 16, 4, 4097),
    ("LLM prefill full", dict(dtype="f16", head_dim=128, mask="none"), 8, 16, 16, 2049),
    ("Whisper encoder 1500", dict(dtype="bf16", head_dim=64, mask="none"), 11, 20, 20, 1500),
    ("ViT-B/16 197", dict(dtype="bf16", head_dim=64, mask="none"), 83, 12, 12, 197),
    ("ViT-L/14-336 577", dict(dtype="bf16", head_dim=64, mask="none"), 28, 16, 16, 577),
    ("CLIP text 77 causal", dict(dtype="f16", head_dim=64, mask="causal_bottom_right"), 212, 8, 8, 77),
    ("d256 causal", dict(dtype="bf16", head_dim=256, mask="causal_top_left"), 16, 8, 8, 1025),
]
GOAL = 0.95


def _sdpa_ms(q, k, v, causal):
    """cuDNN SDPA on the same tensors (None where this torch cannot run it)."""
    from emitter.families.attention.torch_run import time_ms

    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel
        import torch.nn.functional as F

        qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
        gqa = qt.shape[1] != kt.shape[1]

        def run():
            with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
                F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal, enable_gqa=gqa)
        run()
        torch.cuda.synchronize()
        return time_ms(run)
    except Exception:           # noqa: BLE001 - a baseline that cannot run is reported as missing
        return None


def test_odd_length_speed_vs_next_multiple_of_8(kernels):
    from emitter.families.attention.flops import visible_pairs
    from emitter.families.attention.torch_run import time_ms

    rows, misses = [], []
    for label, want, b, hq, hkv, odd in SPEED:
        match = [(n, c, k) for n, (c, k) in kernels.items() if all(c[key] == val for key, val in want.items())
                 and (c["gqa"] or hq == hkv)]
        if not match:
            continue
        name, cfg, kern = match[0]
        row = {"case": label, "kernel": name, "batch": b, "heads": f"{hq}/{hkv}", "head_dim": cfg["head_dim"]}
        for tag, s in (("odd", odd), ("aligned", -(-odd // 8) * 8)):
            dt, d = DT[cfg["dtype"]], cfg["head_dim"]
            shape = (lambda h: (b, s, h, d)) if cfg["layout"] == "bshd" else (lambda h: (b, h, s, d))

            def make(h):
                x = torch.randn(shape(h), device="cuda", dtype=torch.float32).to(dt)
                return x if cfg["layout"] == "bshd" else x.transpose(1, 2)
            q, k, v, o = make(hq), make(hkv), make(hkv), make(hq)
            run = kern.prepare(q, k, v, o, None, 0.0)
            ms = time_ms(run, iters=50)
            fl = 2 * visible_pairs(cfg["mask"], s, s) * 2 * d * hq * b
            row[f"s_{tag}"] = s
            row[f"ms_{tag}"] = ms
            row[f"tflops_{tag}"] = fl / ms / 1e9
            c = _sdpa_ms(q, k, v, cfg["mask"] != "none")
            row[f"cudnn_tflops_{tag}"] = fl / c / 1e9 if c else None
        row["ratio"] = row["tflops_odd"] / row["tflops_aligned"]
        rows.append(row)
        if row["ratio"] < GOAL:
            misses.append(f"{label}: {row['tflops_odd']:.0f} vs {row['tflops_aligned']:.0f} TFLOP/s")
    if not rows:
        pytest.skip("no instance of the speed cases in the build")
    gpu = torch.cuda.get_device_name()
    lines = [f"odd length vs the next multiple of 8 ({gpu}; median of 50 launches; TFLOP/s over visible pairs)",
             "| case | kernel | B | heads | S odd | TFLOP/s | S aligned | TFLOP/s | odd/aligned | cuDNN odd | "
             "emitter/cuDNN |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        cud = r["cudnn_tflops_odd"]
        cud_text = "—" if cud is None else f"{cud:.0f}"
        vs_text = "—" if cud is None else f"{r['tflops_odd'] / cud:.2f}"
        lines.append(f"| {r['case']} | {r['kernel']} | {r['batch']} | {r['heads']} | {r['s_odd']} | "
                     f"{r['tflops_odd']:.0f} | {r['s_aligned']} | {r['tflops_aligned']:.0f} | {r['ratio']:.3f} | "
                     f"{cud_text} | {vs_text} |")
    print("\n" + "\n".join(lines))
    report = os.environ.get("EMITTER_ANYLEN_REPORT")
    if report:
        Path(report).write_text(json.dumps({"gpu": gpu, "rows": rows, "goal": GOAL}, indent=1))
    assert not misses, f"below {GOAL:.2f}x of the aligned length: " + "; ".join(misses)
