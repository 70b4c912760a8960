#!/usr/bin/env bash
# The whole GPU suite in one command, for the device machine (from the project root):
#   scripts/gpu_suite.sh            # logs and reports under $OUT (the device tool's folder) or ./gpu-suite-out
# Sets up the carried wheels; the tests emit configs/gemm/*.yaml (+ a few verify-only extras), build every
# instance plus planted-bug variants,
# runs `pytest -m gpu` (verify on the GPU + planted bugs) and prints pass/fail counts.
set -u -o pipefail
cd "$(dirname "$0")/.."
[ -f .device-wheels/setup.sh ] && source .device-wheels/setup.sh
export PYTHONUNBUFFERED=1
OUTDIR="${OUT:-$PWD/gpu-suite-out}"
mkdir -p "$OUTDIR"
export EMITTER_GPU_DIR="${EMITTER_GPU_DIR:-/tmp/emitter-gpu-suite}"
export EMITTER_GPU_REPORTS="$OUTDIR"
export EMITTER_CACHE_DIR="${EMITTER_CACHE_DIR:-/tmp/emitter-cache}"
PY=python3

echo "== device"; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | head -4
nvcc --version | tail -2
$PY -c "import pycuda.driver as d; d.init(); print('pycuda', __import__('pycuda').VERSION_TEXT, d.Device(0).name())" || exit 2

rm -rf "$EMITTER_GPU_DIR"     # the session fixture emits configs/gemm/*.yaml (+ verify extras) into it

echo "== pytest -m gpu (emit + build inside the session fixture, then verify)"
t0=$(date +%s)
$PY -m pytest -m gpu tests/test_gpu_verify.py -s -rA -p no:cacheprovider --junitxml="$OUTDIR/pytest_gpu.xml" \
    2>&1 | tee "$OUTDIR/pytest_gpu.log"
rc=${PIPESTATUS[0]}
echo "pytest -m gpu: exit $rc after $(( $(date +%s) - t0 )) s"

echo "== the user's own commands in a fresh directory: emit, build (the compile cache makes it quick), verify"
USER_DIR="${EMITTER_GPU_DIR}-user"
rm -rf "$USER_DIR"
$PY -m emitter emit configs/gemm/*.yaml -o "$USER_DIR" -q \
  && $PY -m emitter build "$USER_DIR" --no-progress 2>&1 | tail -2 \
  && $PY -m emitter verify "$USER_DIR" --quick -q \
       --json "$OUTDIR/cli_verify.json" --junit "$OUTDIR/cli_verify.xml" 2>&1 | tail -4
cli_rc=${PIPESTATUS[0]}
echo "emitter verify: exit $cli_rc"
[ "$rc" -eq 0 ] && rc=$cli_rc

echo "== counts"
$PY - "$OUTDIR" <<'PYEOF'
import json, sys, pathlib
from collections import Counter
out = pathlib.Path(sys.argv[1])
for stem in ("verify_emitted", "verify_planted", "cli_verify"):
    p = out / f"{stem}.json"
    if not p.is_file():
        print(f"{stem}: no report"); continue
    d = json.loads(p.read_text())
    s = d["summary"]
    print(f"{stem}: device {d['device']}; seed {d['seed']}; instances {s['instances']}; cases {s['cases']}")
    if stem == "verify_planted":
        per = {}
        for r in d["results"]:
            per.setdefault(r["instance"], Counter())[r["status"]] += 1
        for name, c in per.items():
            print(f"   {name.split('_bug_')[-1]:24s} {'CAUGHT' if c['FAILED'] else 'MISSED'} ({dict(c)})")
PYEOF
exit $rc
