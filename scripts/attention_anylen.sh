#!/usr/bin/env bash
# Any-length sm90a attention on the GPU in one command (from the project root, on the H100 / H200 machine):
#   scripts/attention_anylen.sh            # logs and the speed table under $OUT (the device tool's) or ./anylen-out
# emits configs/attention/sm90a_anylen.yaml, builds it (-j 16), runs tests/attention/test_attention_anylen_gpu.py (lengths
# 1..300 and a few thousand, each causal alignment, rows without keys, GQA, planted off-by-ones built into real
# kernels, decode through split_kv against 1..128k keys with its planted combine bug, the speed of an odd length
# against the next multiple of 8, decode against the fastest SDPA backend), `emitter verify` on the same build
# (the default problems: odd lengths, one query row, rows without keys, padded rows; isolated workers), and the
# exported-library test
# (odd lengths dispatched to sm90a, not sm80; ANYLEN_LIBRARY=0 skips it). Prints a summary; exit 0 = all passed.
set -u -o pipefail
cd "$(dirname "$0")/.."
[ -f .device-wheels/setup.sh ] && source .device-wheels/setup.sh
export PYTHONUNBUFFERED=1
PY=${PY:-python3}
OUTDIR="${OUT:-$PWD/anylen-out}"
GEN="${EMITTER_ANYLEN_DIR:-/tmp/emitter-anylen}"
mkdir -p "$OUTDIR"
rm -rf "$GEN"

echo "== emit + build (-j 16)"
t0=$(date +%s)
$PY -m emitter emit configs/attention/sm90a_anylen.yaml -o "$GEN" -q || exit 2
$PY -m emitter build "$GEN" -j 16 --no-progress 2>&1 | tail -3
[ "${PIPESTATUS[0]}" -eq 0 ] || { echo "build failed"; exit 2; }
echo "built in $(( $(date +%s) - t0 )) s"

echo "== any-length GPU tests"
EMITTER_ATTENTION_ANYLEN_BUILD="$GEN" EMITTER_ANYLEN_REPORT="$OUTDIR/anylen_speed.json" \
  $PY -m pytest -q -s -rA -m gpu tests/attention/test_attention_anylen_gpu.py -p no:cacheprovider 2>&1 | tee "$OUTDIR/anylen_gpu.log"
trc=${PIPESTATUS[0]}

echo "== emitter verify (default problems)"
$PY -m emitter verify "$GEN" --json "$OUTDIR/anylen_verify.json" 2>&1 | tail -6
vrc=${PIPESTATUS[0]}

lrc=0
if [ "${ANYLEN_LIBRARY:-1}" = 1 ]; then
  echo "== exported library: odd lengths dispatched to sm90a"
  EMITTER_TEST_JOBS=16 $PY -m pytest -q -s -m gpu tests/attention/test_attention_library_gpu.py -p no:cacheprovider 2>&1 \
    | tee "$OUTDIR/anylen_library.log" | grep -E "rel err|passed|failed|error" | tail -12
  lrc=${PIPESTATUS[0]}
fi

echo "== summary"
grep -E "^\| |odd length vs|decode, split KV|cases passed|cases on" "$OUTDIR/anylen_gpu.log" || true
grep -E " (CAUGHT|MISSED)" "$OUTDIR/anylen_gpu.log" | sed -E 's/: .*//' | awk '{print $(NF-1), $NF}' | sort | uniq -c
echo "any-length tests: exit $trc; emitter verify: exit $vrc; library: exit $lrc"
[ "$trc" -eq 0 ] && [ "$vrc" -eq 0 ] && [ "$lrc" -eq 0 ]
