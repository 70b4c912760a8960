#!/bin/bash
# Issue 41 on a machine of 2+ GPUs (nvidia-h100-x2 or larger): one profile of every family (4 sm90a GEMMs,
# 3 sm90a attention kernels, 4 sm90a convolutions; 22 problems), on one GPU, on all GPUs with local worker
# processes, and on all GPUs through Ray (one actor per GPU), the GPUs taking problems from one queue, largest
# measured cost first (the one-GPU run's profile.json: --cost-from). Per run: wall time, speed-up against one
# GPU and against the ideal (n), per-GPU busy seconds, winners against the one-GPU run's; then a table to paste.
# From the project root (RES under $OUT brings the results back from the device tool):
#   source .device-wheels/setup.sh; [ -f .device-wheels-ray/setup.sh ] && source .device-wheels-ray/setup.sh;
#   RES=$OUT/multigpu FAULT=1 bash scripts/multigpu_check.sh
# FAULT=1: a fourth run SIGKILLs GPU 1's worker FAULT_AFTER s after it starts; nothing but that measurement may
# be lost. Without Ray importable the Ray run is skipped (and says so): scripts/device_wheels_ray.sh makes
# .device-wheels-ray/ (~45 MiB, fits the carry limit beside .device-wheels/). Dry run without GPUs:
#   BACKEND=fake ALL_GPUS=3 FAULT=1 bash scripts/multigpu_check.sh
# Budget on nvidia-h100-x2: ~2 min of nvcc (11 instances at once), ~100 s of profile on one GPU (the model's
# estimate: 104 s; printed below as `estimated work`), ~55 s each on two GPUs: about 8 minutes in all.
# NCCL is not involved: no collective communication.
set -uo pipefail
GEN=${GEN:-generated/multigpu}     # the emitted instances ($OUT is the device tool's)
RES=${RES:-results/multigpu}
BACKEND=${BACKEND:-pycuda}          # fake: a dry run of this script without GPUs (ALL_GPUS=3)
ALL=${ALL_GPUS:-all}
PY=${PYTHON:-python3}
T0=$(date +%s)
SELECT=(
  gemm_sm90a_                                                                         # the 4 of sm90a_bf16.yaml
  attn_sm90a_bf16_d128_128x128_cooperative_s5_nomask_bshd_lse_gqa
  attn_sm90a_bf16_d128_128x128_pingpong_persistent_s5_nomask_bshd_lse_gqa
  attn_sm90a_bf16_d64_128x128_pingpong_persistent_s5_nomask_bshd_lse_gqa
  conv2d_fprop_sm90a_bf16_bf16_accf32_nhwc_128x128x64_c1x1x1_s6_strided_al8x8x8_identity
  conv2d_fprop_sm90a_bf16_bf16_accf32_nhwc_128x64x64_c1x2x1_s8_strided_al8x8x8_identity
  conv2d_dgrad_sm90a_bf16_bf16_accf32_nhwc_128x128x64_c1x1x1_s6_unity_al8x8x8_identity
  conv2d_wgrad_sm90a_bf16_bf16_accf32_nhwc_128x128x64_c1x2x1_s6_strided_al8x8x8_identity_splitkparallel
)
$PY -m emitter emit configs/gemm/sm90a_bf16.yaml configs/attention/sm90a.yaml configs/conv/sm90a_resnet50.yaml \
  -o "$GEN" -q || exit 1
GEN=$(cd "$GEN" && pwd)
sel=(); for s in "${SELECT[@]}"; do sel+=(--select "$s"); done
if [ "$BACKEND" != fake ]; then
  $PY -m emitter build "$GEN" "${sel[@]}" -j "${JOBS:-32}" --no-progress | tail -3
  [ "${PIPESTATUS[0]}" = 0 ] || echo "   not every instance built (above): the profile reports those as failed"
  echo "build done at +$(( $(date +%s) - T0 )) s"
fi
mkdir -p "$RES"
RES=$(cd "$RES" && pwd)
{
  echo "manifests: [$GEN]"
  echo "select:"; for s in "${SELECT[@]}"; do echo "  - $s"; done
  cat <<'YAML'
baselines: [cublas, sdpa_cudnn, sdpa_flash, cudnn]
problems:     # 22 problems of 3 families, none above ~11% of the estimated work
  - {m: 4096, n: 4096, k: 4096}
  - {m: 8192, n: 8192, k: 8192}
  - {m: 16384, n: 8192, k: 4096}
  - {m: 8192, n: 4096, k: 16384}
  - {m: 512, n: 8192, k: 8192}
  - {m: 2048, n: 14336, k: 4096}
  - {m: 8192, n: 14336, k: 4096}
  - {m: 12288, n: 12288, k: 4096}
  - {m: 6144, n: 6144, k: 8192}
  - b=8,hq=16,sq=2048,sk=2048,d=128
  - b=4,hq=16,sq=4096,sk=4096,d=128
  - b=2,hq=16,sq=8192,sk=8192,d=128
  - b=4,hq=32,hkv=8,sq=4096,sk=4096,d=128
  - b=8,hq=16,sq=4096,sk=4096,d=64
  - b=2,hq=16,sq=8192,sk=8192,d=64
  - n=512,h=56,w=56,c=64,k=64,r=3,s=3,pad=1
  - n=512,h=28,w=28,c=128,k=128,r=3,s=3,pad=1
  - n=512,h=14,w=14,c=256,k=256,r=3,s=3,pad=1
  - n=512,h=7,w=7,c=512,k=512,r=3,s=3,pad=1
  - n=512,h=56,w=56,c=256,k=64,r=1,s=1
  - n=512,h=28,w=28,c=512,k=128,r=1,s=1
  - n=512,h=14,w=14,c=1024,k=256,r=1,s=1
output: {plots: false}
YAML
} > "$RES/config.yaml"
if [ "$BACKEND" != fake ]; then
  nvidia-smi -L 2>/dev/null
  # torch, PyCUDA and CUDA read from disk once before the timed runs, so the one-GPU run (first) is not the only
  # one to pay a cold page cache
  $PY -c "import torch, pycuda.autoinit; torch.zeros(1, device='cuda')" >/dev/null 2>&1
fi
DEADLINE=${DEADLINE:-530}   # seconds after the start by which every run must have ended (the device call's 600,
                            # less ~40 s of setup.sh before this script)
left() { echo $(( DEADLINE - ($(date +%s) - T0) )); }
fits() {  # name, seconds it is expected to take: false (and says so) when that is more than is left
  [ "$(left)" -ge "$2" ] && return 0
  echo "== $1: skipped, $(left) s left before DEADLINE=$DEADLINE s and it needs ~$2 s"; return 1
}
expect() {  # seconds a run on all GPUs is expected to take: the one-GPU run's wall / 1.6, plus $1 s
  $PY -c "import sys; print(int(float(open(sys.argv[1]).read()) / 1.6) + $1)" "$RES/one.wall" 2>/dev/null || echo 60
}
run() {  # name, extra args: one profile run into $RES/<name>, its wall time in $RES/<name>.wall
  rm -rf "${RES:?}/$1"
  local t0 t1 rc tmo
  tmo=$(left); tmo=$(( tmo - 5 < ${RUN_TMO:-300} ? tmo - 5 : ${RUN_TMO:-300} ))
  t0=$(date +%s.%N)
  timeout "$tmo" $PY -m emitter profile "$RES/config.yaml" -o "$RES/$1" --backend "$BACKEND" "${@:2}" \
    > "$RES/$1.log" 2>&1
  rc=$?
  t1=$(date +%s.%N)
  $PY -c "print(f'{$t1 - $t0:.1f}')" > "$RES/$1.wall"
  echo "== $1: rc=$rc, wall $(cat "$RES/$1.wall") s (+$(( $(date +%s) - T0 )) s since the start)"
  grep -E "^(estimated work|Ray:|profiling|gpu[0-9]+: |[0-9]+ problem|note:)" "$RES/$1.log" | sed 's/^/   /'
  [ -f "$RES/$1/profile.json" ] || { echo "   no profile.json: the end of the log:"; tail -15 "$RES/$1.log"; }
  [ "$rc" = 0 ] || tail -5 "$RES/$1.log"
  [ "$rc" = 124 ] && echo "   cut at $tmo s (DEADLINE / RUN_TMO): the table below has what it measured up to then"
  [ "$rc" = 124 ] && $PY -m emitter profile --replay "$RES/$1/work" -o "$RES/$1" --no-plots > /dev/null 2>&1
  return 0
}
run one --gpus 1
COST=(); [ -f "$RES/one/profile.json" ] && COST=(--cost-from "$RES/one/profile.json")
fits local "$(expect 10)" && run local --gpus "$ALL" "${COST[@]}"
RAY=0
if $PY -c "import ray" 2>/dev/null; then
  RAY=1; fits ray "$(expect 20)" && run ray --gpus "$ALL" --executor ray "${COST[@]}"
else
  echo "== ray: skipped, Ray is not importable here (carry .device-wheels-ray/, made by scripts/device_wheels_ray.sh, and source its setup.sh)"
fi
if [ "${FAULT:-0}" = 1 ] && fits fault "$(expect 15)"; then
  # GPU 1's worker dies mid-run (SIGKILL, FAULT_AFTER s after it starts): only its measurement in flight may be
  # lost (a fault record), the rest of its problem goes to another GPU, its restarted worker takes further work
  ( job="$RES/fault/work/shard1.job.json"
    for i in $(seq 1 1200); do
      sleep 0.1
      for p in $(pgrep -f "emitter.profile.worker $job"); do
        sleep "${FAULT_AFTER:-8}"
        if kill -9 "$p" 2>/dev/null; then echo "killed GPU 1's worker (pid $p) ${FAULT_AFTER:-8} s after it started"
        else echo "GPU 1's worker (pid $p) ended before the kill, ${FAULT_AFTER:-8} s after it started"; fi
        exit 0
      done
    done; echo "no worker of GPU 1 seen" ) > "$RES/fault.kill" &
  run fault --gpus "$ALL" "${COST[@]}"
  wait
  echo "   fault: $(cat "$RES/fault.kill")"
fi
echo "== winners against the one-GPU run"
for r in local ray fault; do
  [ -f "$RES/$r/tuning.json" ] && [ -f "$RES/one/tuning.json" ] || continue
  $PY scripts/compare_tuning.py "$RES/one" "$RES/$r" > "$RES/$r.compare" 2>&1
  echo "   $r: $(tail -1 "$RES/$r.compare")"
  grep -E "  (NO|MISSING) " "$RES/$r.compare" | sed 's/^/     /'
done
$PY - "$RES" "$BACKEND" "$RAY" "${FAULT:-0}" <<'PY'
import json, os, sys, collections
res, backend, have_ray, fault = sys.argv[1], sys.argv[2], sys.argv[3] == "1", sys.argv[4] == "1"

def load(name):
    p = os.path.join(res, name, "profile.json")
    return json.load(open(p)) if os.path.exists(p) else None

def wall(name):
    p = os.path.join(res, name + ".wall")
    return float(open(p).read()) if os.path.exists(p) else None

def agree(name):
    p = os.path.join(res, name + ".compare")
    return open(p).read().strip().splitlines()[-1].split(" problems")[0] if os.path.exists(p) else "-"

one = load("one")
if one is None or not one.get("run"):
    sys.exit("no one-GPU profile.json with its run record (cut short?): nothing to compare")
print("== the scaling model against the one-GPU run (seconds of one GPU per family: model estimate / measured)")
fam = collections.defaultdict(lambda: [0.0, 0.0, 0])
for p in one["run"]["problems"]:
    f = fam[p["family"]]
    f[0] += p["estimate_s"]; f[1] += p["wall_s"] or 0; f[2] += 1
for k, (e, w, n) in sorted(fam.items()):
    print(f"   {k:10} {n:2d} problems: model {e:7.1f} s, measured {w:7.1f} s (x{w / e if e else float('nan'):.2f})")
walls = {p["problem"]: p["wall_s"] or 0 for p in one["run"]["problems"]}
total, big = sum(walls.values()), max(walls.values())
start = max(v["startup_s"] for v in one["run"]["per_gpu"].values())
print(f"   one GPU: {total:.1f} s of problems + {start:.1f} s worker start-up; the largest problem "
      f"{max(walls, key=walls.get)} is {big:.1f} s ({100 * big / total:.0f}%)")
base = wall("one")
rows = []
for name, cmd in (("one", "--gpus 1"), ("local", "--gpus all --cost-from one/profile.json"),
                  ("ray", "--gpus all --executor ray --cost-from one/profile.json"),
                  ("fault", "--gpus all --cost-from one/profile.json + kill -9 of GPU 1's worker")):
    d = load(name)
    if d is None:
        if name == "ray" and not have_ray:
            rows.append(f"| Ray | `{cmd}` | skipped: Ray not importable on this machine | | | | |")
        elif name != "fault" or fault:
            rows.append(f"| {name} | `{cmd}` | no profile.json (see {name}.log) | | | | |")
        continue
    run = d.get("run") or {}
    if not run:
        rows.append(f"| {name} | `{cmd}` | cut short: {wall(name)} s, replayed from its work/ | | | | {agree(name)} |")
        continue
    n = len(run.get("gpus", []))
    w = wall(name)
    per = run.get("per_gpu", {})
    work = "; ".join(f"GPU {g}: {v['busy_s']:.1f} s ({v['problems']} pr.)" for g, v in sorted(per.items()))
    sp = base / w if w and base else None
    psp = one["run"]["wall_s"] / run["wall_s"] if run.get("wall_s") else None
    ideal = f"{100 * sp / n:.0f}% of {n}x" if sp and n > 1 else "-"
    # the bound: the measured problem seconds split by the queue as the estimate predicts, plus start-up
    pred = "-"
    if n > 1:
        load_ = [0.0] * n
        for k in sorted(walls, key=lambda k: (-walls[k], k)):
            i = min(range(n), key=lambda j: (load_[j], j)); load_[i] += walls[k]
        pred = f"{(total + start) / (max(load_) + start):.2f}x"
    rows.append(f"| {name} | `{cmd}` | {w:.1f} s | {run.get('wall_s', 0):.1f} s | "
                f"{'-' if n < 2 else f'{sp:.2f}x cmd, {psp:.2f}x profile ({ideal}; LPT bound {pred})'} | {work} | "
                f"{'-' if name == 'one' else agree(name)} |")
    if name == "fault" and os.path.exists(os.path.join(res, "fault.kill")):
        rows.append(f"|  | kill: {open(os.path.join(res, 'fault.kill')).read().strip()} | | | | | |")
    for e in run.get("events", []):
        rows.append(f"|  | event: {e} | | | | | |")
print("== the table (paste into docs/scale-out.md)")
env = one.get("environment", {})
print(f"GPUs: {', '.join(sorted({v.get('name', '?') for v in env.get('per_gpu', {}).values()}))}"
      f" (driver {env.get('driver')}), backend {backend}")
print("| run | command | wall (command) | wall (profile) | speed-up vs one GPU | per-GPU busy s | winners agree |")
print("|---|---|---:|---:|---|---|---|")
for r in rows:
    print(r)
f = load("fault")
l = load("local")
if f and l:
    def keys(d):
        return {(m["kind"], m["name"], json.dumps(m["problem"], sort_keys=True), m.get("split_k"), m.get("options")):
                m["status"] for m in d["measurements"]}
    a, b = keys(l), keys(f)
    bad = collections.Counter(v for v in b.values() if v not in ("ok", "not_applicable", "pruned"))
    print(f"== fault run: {len(b)} measurements vs {len(a)} in the clean run; missing {len([k for k in a if k not in b])};"
          f" statuses other than ok / not_applicable / pruned: {dict(bad)}")
PY
echo "== done at +$(( $(date +%s) - T0 )) s"
