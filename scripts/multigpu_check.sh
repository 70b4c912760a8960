#!/bin/bash
# Issue 30 on a machine of 2+ GPUs (nvidia-h100-x2 or larger): the same profile on one GPU, on all GPUs with
# local worker processes, and on all GPUs through Ray (one actor per GPU); each run's per-GPU work split, its
# wall time (speed-up against one GPU) and its winners against the one-GPU run's. From the project root:
#   source .device-wheels/setup.sh; source .device-wheels-ray/setup.sh; FAULT=1 bash scripts/multigpu_check.sh
# (FAULT=1: a fourth run kills GPU 1's worker mid-run and checks that nothing of GPU 0 is lost)
# (without .device-wheels-ray the Ray run is skipped). 4 sm90a instances x 13 problems: ~40 s of nvcc on 32
# cores, then about two minutes of profile on one GPU (14.7 TFLOP of problems; 2026-11-25: 12.6 took 108 s).
# NCCL is not involved: no collective communication.
set -uo pipefail
GEN=${GEN:-generated/multigpu}     # the emitted instances ($OUT is the device tool's)
RES=${RES:-results/multigpu}
BACKEND=${BACKEND:-pycuda}          # fake: a dry run of this script without GPUs (ALL_GPUS=3)
ALL=${ALL_GPUS:-all}
python3 -m emitter emit configs/gemm/sm90a_bf16.yaml -o "$GEN" || exit 1
GEN=$(cd "$GEN" && pwd)
[ "$BACKEND" = fake ] || python3 -m emitter build "$GEN" --no-progress | tail -1 || exit 1
mkdir -p "$RES"
cat > "$RES/config.yaml" <<YAML
manifests: [$GEN]
problems:     # no problem above ~17% of the work (a problem is the unit of sharding; 2026-11-25's set had 16384^3 at 70%)
  - square: [1024, 2048, 4096, 8192]
  - {m: 128, n: 8192, k: 8192}
  - {m: 512, n: 8192, k: 8192}
  - {m: 2048, n: 16384, k: 4096}
  - {m: 16384, n: 4096, k: 16384}
  - {m: 4096, n: 16384, k: 16384}
  - {m: 8192, n: 8192, k: 16384}
  - {m: 16384, n: 8192, k: 8192}
  - {m: 8192, n: 16384, k: 8192}
  - {m: 12288, n: 12288, k: 8192}
output: {plots: false}
YAML
nvidia-smi -L 2>/dev/null
run() {  # name, extra args
  local t0=$(date +%s.%N)
  timeout "${RUN_TMO:-240}" python3 -m emitter profile "$RES/config.yaml" -o "$RES/$1" --backend "$BACKEND" "${@:2}" > "$RES/$1.log" 2>&1
  local rc=$?
  local t1=$(date +%s.%N)
  echo "$1: rc=$rc wall $(python3 -c "print(f'{$t1 - $t0:.1f}')") s"
  python3 - "$RES/$1/profile.json" <<'PY'
import json, os, sys, collections
if not os.path.exists(sys.argv[1]):
    sys.exit(f"   no {sys.argv[1]}: see the log beside it")
d = json.load(open(sys.argv[1]))
split = collections.defaultdict(set)
for m in d["measurements"]:
    p = m["problem"]; split[m.get("gpu")].add(f"{p['m']}x{p['n']}x{p['k']}")
for g in sorted(split, key=str):
    print(f"   gpu{g}: {len(split[g])} problems: {' '.join(sorted(split[g]))}")
PY
  grep -c "^\[gpu" "$RES/$1.log" | sed 's/^/   worker log lines: /'
}
run local --gpus "$ALL"
run one --gpus 1
echo "== winners: all GPUs (local) vs one GPU"; python3 scripts/compare_tuning.py "$RES/one" "$RES/local"
if python3 -c "import ray" 2>/dev/null; then run ray --gpus "$ALL" --executor ray; fi
if [ -f "$RES/ray/tuning.json" ]; then echo "== winners: all GPUs (Ray) vs one GPU"; python3 scripts/compare_tuning.py "$RES/one" "$RES/ray"; fi
if [ "${FAULT:-0}" = 1 ] && [ "$BACKEND" != fake ]; then
  # a GPU's worker dies mid-run (SIGKILL, FAULT_AFTER s after it starts): the other GPU's results must all be kept,
  # the dead worker's measurement recorded as a fault, the worker restarted on the rest of its shard
  ( for i in $(seq 1 240); do
      sleep 0.25
      for p in $(pgrep -f "emitter.profile.worker"); do
        if tr '\0' '\n' < /proc/$p/environ 2>/dev/null | grep -qx "CUDA_VISIBLE_DEVICES=1"; then
          sleep "${FAULT_AFTER:-8}"; kill -9 "$p" && echo "fault: killed the gpu1 worker (pid $p) ${FAULT_AFTER:-8} s after it started"
          exit 0
        fi
      done
    done; echo "fault: no gpu1 worker seen" ) &
  run fault --gpus "$ALL"
  wait
  python3 - "$RES/local/profile.json" "$RES/fault/profile.json" <<'PY'
import json, sys, collections
def load(p):
    d = json.load(open(p)); out = collections.defaultdict(dict)
    for m in d["measurements"]:
        pr = m["problem"]; out[m.get("gpu")][(f"{pr['m']}x{pr['n']}x{pr['k']}", m["name"], m.get("split_k"))] = m["status"]
    return out
a, b = load(sys.argv[1]), load(sys.argv[2])
for g in sorted(set(a) | set(b), key=str):
    ka, kb = a.get(g, {}), b.get(g, {})
    lost = [k for k in ka if k not in kb]
    bad = collections.Counter(v for v in kb.values() if v not in ("ok", "not_applicable"))
    print(f"   gpu{g}: {len(kb)} measurements after the fault vs {len(ka)} without; missing {len(lost)}; "
          f"non-ok statuses {dict(bad)}")
PY
  echo "== winners: all GPUs with a killed worker vs one GPU"; python3 scripts/compare_tuning.py "$RES/one" "$RES/fault"
fi
