#!/bin/bash
# Issue 30 on a machine of 2+ GPUs (nvidia-h100-x2 or larger): the same profile on one GPU, on all GPUs with
# local worker processes, and on all GPUs through Ray (one actor per GPU); each run's per-GPU work split, its
# wall time (speed-up against one GPU) and its winners against the one-GPU run's. From the project root:
#   source .device-wheels/setup.sh; source .device-wheels-ray/setup.sh; bash scripts/multigpu_check.sh
# (without .device-wheels-ray the Ray run is skipped). ~4 sm90a instances x 9 problems: ~1.5 min of nvcc on 16
# cores, then about a minute of profile per GPU-run. NCCL is not involved: no collective communication.
set -uo pipefail
OUT=${OUT:-generated/multigpu}
RES=${RES:-results/multigpu}
BACKEND=${BACKEND:-pycuda}          # fake: a dry run of this script without GPUs (ALL_GPUS=3)
ALL=${ALL_GPUS:-all}
python3 -m emitter emit configs/gemm/sm90a_bf16.yaml -o "$OUT" || exit 1
[ "$BACKEND" = fake ] || python3 -m emitter build "$OUT" --no-progress | tail -1 || exit 1
mkdir -p "$RES"
cat > "$RES/config.yaml" <<YAML
manifests: [$PWD/$OUT]
problems:
  - square: [1024, 2048, 4096, 8192, 16384]
  - {m: 128, n: 8192, k: 8192}
  - {m: 512, n: 8192, k: 8192}
  - {m: 2048, n: 16384, k: 4096}
  - {m: 16384, n: 4096, k: 16384}
output: {plots: false}
YAML
nvidia-smi -L 2>/dev/null
run() {  # name, extra args
  local t0=$(date +%s.%N)
  python3 -m emitter profile "$RES/config.yaml" -o "$RES/$1" --backend "$BACKEND" "${@:2}" > "$RES/$1.log" 2>&1
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
run one --gpus 1
run local --gpus "$ALL"
if python3 -c "import ray" 2>/dev/null; then run ray --gpus "$ALL" --executor ray; fi
echo "== winners: all GPUs (local) vs one GPU"; python3 scripts/compare_tuning.py "$RES/one" "$RES/local"
if [ -f "$RES/ray/tuning.json" ]; then echo "== winners: all GPUs (Ray) vs one GPU"; python3 scripts/compare_tuning.py "$RES/one" "$RES/ray"; fi
