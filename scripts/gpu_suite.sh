#!/usr/bin/env bash
# Every family's GPU tests in one command, for the GPU machine (from the project root):
#   scripts/gpu_suite.sh [all|gemm|attention|conv]     (default all; one group fits a 10-minute device call)
#
# Each group emits and builds what its GPU tests need into generated/gpu-suite/ (kept between calls on a warm
# machine, the compile cache beside it), then runs `pytest -m gpu` over the group's test files with
# EMITTER_GPU_SUITE=1, which turns a GPU test that skips into a failure: on the GPU machine every GPU test must
# run. The groups are the test files that hold a GPU test, split by folder (tests/attention -> attention,
# tests/conv -> conv, tests/gemm and tests/stages -> gemm), so every GPU test lands in exactly one group; a GPU
# test file anywhere else stops the suite. Logs, junit files and the counts go under $OUT (the device tool's
# folder) or ./gpu-suite-out.
#   GROUPS_ONLY=1 scripts/gpu_suite.sh   prints each group's files and exits (no GPU, PyCUDA or nvcc needed).
#   SHARD=i/n scripts/gpu_suite.sh GROUP   runs the i-th of n parts of the group's files (every n-th file from the
#   i-th), so a group that outgrows one 10-minute device call runs as n calls, or side by side on n GPUs
#   (CUDA_VISIBLE_DEVICES and OUT apart, each in its own checkout); the user-command check of gemm runs in part 1.
set -u -o pipefail
cd "$(dirname "$0")/.."
[ "${GROUPS_ONLY:-0}" = 1 ] || { [ -f .device-wheels/setup.sh ] && source .device-wheels/setup.sh; }
export PYTHONUNBUFFERED=1
GROUP="${1:-all}"
OUTDIR="${OUT:-$PWD/gpu-suite-out}"
WORK="$PWD/generated/gpu-suite"
mkdir -p "$OUTDIR" "$WORK"
export EMITTER_GPU_SUITE=1
export EMITTER_GPU_REPORTS="$OUTDIR"
export EMITTER_CACHE_DIR="${EMITTER_CACHE_DIR:-$WORK/cache}"
export EMITTER_TEST_JOBS="${EMITTER_TEST_JOBS:-$(nproc)}"
PY=python3
J="$EMITTER_TEST_JOBS"

# the test files holding a GPU test, by group (the group is the file's folder)
mapfile -t GPU_FILES < <(find tests -name 'test_*.py' -not -path '*/__pycache__/*' -exec grep -l "mark.gpu" {} + | sort)
group_of() {
  case "$1" in
    tests/attention/*) echo attention ;;
    tests/conv/*) echo conv ;;
    tests/gemm/* | tests/stages/*) echo gemm ;;
    *) echo none ;;
  esac
}
SHARD="${SHARD:-1/1}"                 # i/n: the i-th of n parts of each group's files (every n-th file from the i-th)
case "$SHARD" in
  [1-9]/[1-9]) SHARD_I=${SHARD%/*}; SHARD_N=${SHARD#*/} ;;
  *) echo "gpu_suite.sh: SHARD=$SHARD: give i/n with 1 <= i <= n <= 9 (e.g. SHARD=2/2)" >&2; exit 2 ;;
esac
[ "$SHARD_I" -le "$SHARD_N" ] || { echo "gpu_suite.sh: SHARD=$SHARD: i must not exceed n" >&2; exit 2; }
files_of() {
  local j=0
  for f in "${GPU_FILES[@]}"; do
    [ "$(group_of "$f")" = "$1" ] || continue
    [ $(( j % SHARD_N + 1 )) = "$SHARD_I" ] && echo "$f"
    j=$(( j + 1 ))
  done
  return 0
}
for f in "${GPU_FILES[@]}"; do
  if [ "$(group_of "$f")" = none ]; then
    echo "gpu_suite.sh: $f holds a GPU test but is in no group's folder (tests/gemm, tests/stages," \
         "tests/attention, tests/conv): move it into one" >&2
    exit 2
  fi
done
if [ "${GROUPS_ONLY:-0}" = 1 ]; then
  for g in gemm attention conv; do
    mapfile -t files < <(files_of "$g")
    echo "== $g: ${#files[@]} files"
    printf '   %s\n' "${files[@]}"
  done
  echo "== ${#GPU_FILES[@]} files hold a GPU test"
  exit 0
fi

echo "== device"; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | head -4
nvcc --version | tail -1
$PY -c "import pycuda.driver as d; d.init(); print('pycuda', __import__('pycuda').VERSION_TEXT, d.Device(0).name())" || exit 2


build() {   # build DIR SPEC...: emit + build (the compile cache makes a second call quick)
  local dir="$1"; shift
  $PY -m emitter emit "$@" -o "$dir" -q && $PY -m emitter build "$dir" -j "$J" --no-progress 2>&1 | tail -2
}

rc=0
run_group() {
  local g="$1"; shift
  local t0; t0=$(date +%s)
  mapfile -t files < <(files_of "$g")
  echo "== $g: ${#files[@]} files: ${files[*]}"
  $PY -m pytest -m gpu "${files[@]}" -q -rfEs -p no:cacheprovider --junitxml="$OUTDIR/pytest_$g.xml" \
      2>&1 | tee "$OUTDIR/pytest_$g.log" | tail -25
  local r=${PIPESTATUS[0]}
  echo "$g: pytest exit $r after $(( $(date +%s) - t0 )) s"
  [ "$r" -eq 0 ] || rc=$r
}

if [ "$GROUP" = all ] || [ "$GROUP" = gemm ]; then
  export EMITTER_GPU_DIR="$WORK/gemm"          # test_gpu_verify's session fixture emits configs/gemm/*.yaml here
  run_group gemm
fi
if { [ "$GROUP" = all ] || [ "$GROUP" = gemm ]; } && [ "$SHARD_I" = 1 ]; then
  echo "== the user's own commands in a fresh directory: emit, build (cached), verify"
  USER_DIR="$WORK/gemm-user"
  rm -rf "$USER_DIR"
  build "$USER_DIR" configs/gemm/*.yaml \
    && $PY -m emitter verify "$USER_DIR" --quick -q --json "$OUTDIR/cli_verify.json" --junit "$OUTDIR/cli_verify.xml" 2>&1 | tail -4
  cli_rc=${PIPESTATUS[0]}
  echo "emitter verify: exit $cli_rc"
  [ "$cli_rc" -eq 0 ] || rc=$cli_rc
fi

if [ "$GROUP" = all ] || [ "$GROUP" = attention ]; then
  specs=(configs/attention/sm90a_verify.yaml)
  [ -f configs/attention/sm90a_anylen.yaml ] && specs+=(configs/attention/sm90a_anylen.yaml)
  build "$WORK/att90" "${specs[@]}"
  export EMITTER_ATTENTION_SM90A_BUILD="$WORK/att90"
  export EMITTER_ATTN_DIR="$WORK/att80"          # test_attention_gpu's fixture emits + builds here
  export EMITTER_ATTN_BWD_DIR="$WORK/attbwd"    # test_attention_backward_gpu's fixture emits + builds here
  export EMITTER_ATTN_BWD90_DIR="$WORK/attbwd90"  # test_attention_backward_sm90a_gpu's fixture (sm90a backward)
  run_group attention
fi

if [ "$GROUP" = all ] || [ "$GROUP" = conv ]; then
  build "$WORK/conv" configs/conv/verify_set.yaml
  export EMITTER_CONV_GPU_DIR="$WORK/conv" EMITTER_CONV_MANIFEST="$WORK/conv"
  run_group conv
fi

echo "== counts"
$PY - "$OUTDIR" <<'PYEOF'
import json, sys, pathlib
import xml.etree.ElementTree as ET
from collections import Counter
out = pathlib.Path(sys.argv[1])
for x in sorted(out.glob("pytest_*.xml")):
    c = Counter()
    for tc in ET.parse(x).getroot().iter("testcase"):
        kids = {k.tag for k in tc}
        c["failed" if kids & {"failure", "error"} else "skipped" if "skipped" in kids else "passed"] += 1
    print(f"{x.stem[7:]:10s} passed {c['passed']}, failed {c['failed']}, skipped {c['skipped']}")
for stem in ("verify_emitted", "verify_planted", "cli_verify"):
    p = out / f"{stem}.json"
    if not p.is_file():
        continue
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
