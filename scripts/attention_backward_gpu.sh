#!/usr/bin/env bash
# Attention backward (sm80 kernel, on the H100 / H200 machine) in one command, from the project root:
#   scripts/attention_backward_gpu.sh [build|verify|rest|library|sm90a|sm90a-build|sm90a-rest|sm90a-library|all]   (default all; logs under $OUT or ./attn-bwd-out)
# build: emits configs/attention/sm80_backward.yaml plus the planted-bug variants and builds them (-j 16, sm_90 SASS
#        beside the PTX); verify: every backward instance on its default problems (dQ, dK, dV against autograd through
#        the float64 forward); rest: planted bugs, bit-for-bit repeat, the speed table against SDPA's cuDNN and flash
#        backward, and a transformer block's training step against torch; library: an exported library's
#        attention_backward(), loss.backward() through lib.attention(), torch.compile, a CUDA graph and the training
#        step (tests/attention/test_attention_backward_library_gpu.py); sm90a: the Hopper backward (examples/88 as one launch:
#        configs/attention/sm90a_backward.yaml, f16 and bf16, built -j 16, verify, planted bugs, repeated launches,
#        the bf16 and f16 speed table against SDPA's cuDNN and flash backward, f16 and bf16 training steps;
#        tests/attention/test_attention_backward_sm90a_gpu.py, its build in generated/attn_bwd90_gpu; sm90a-build
#        builds only, sm90a-rest the rest on that build); sm90a-library: an exported library with sm80 and sm90a
#        backward kernels, the sm90a one forced and by dispatch (f16 and bf16), loss.backward(), a CUDA graph
#        (tests/attention/test_attention_backward_sm90a_library_gpu.py).
#        Each stage stays under 10 minutes; the
#        build is kept in generated/attn_bwd_gpu between stages (EMITTER_ATTN_BWD_DIR overrides).
set -u -o pipefail
cd "$(dirname "$0")/.."
[ -f .device-wheels/setup.sh ] && source .device-wheels/setup.sh
export PYTHONUNBUFFERED=1
PY=${PY:-python3}
STAGE=${1:-all}
OUTDIR="${OUT:-$PWD/attn-bwd-out}"
mkdir -p "$OUTDIR"
export EMITTER_ATTN_BWD_DIR="${EMITTER_ATTN_BWD_DIR:-$PWD/generated/attn_bwd_gpu}"
export EMITTER_GPU_REPORTS="$OUTDIR"
case "$STAGE" in
  build)  SEL="builds" ;;
  verify) SEL="default_problems" ;;
  rest)   SEL="not builds and not default_problems" ;;
  library) SEL="" ;;
  sm90a)  SEL="" ;;
  sm90a-build) SEL="builds" ;;
  sm90a-rest)  SEL="not builds" ;;
  sm90a-library) SEL="" ;;
  all)    SEL="" ;;
  *) echo "usage: $0 [build|verify|rest|library|sm90a|sm90a-build|sm90a-rest|sm90a-library|all]"; exit 2 ;;
esac
TESTS=tests/attention/test_attention_backward_gpu.py
[ "$STAGE" = library ] && TESTS=tests/attention/test_attention_backward_library_gpu.py
case "$STAGE" in sm90a|sm90a-build|sm90a-rest) TESTS=tests/attention/test_attention_backward_sm90a_gpu.py ;; esac
[ "$STAGE" = sm90a-library ] && TESTS=tests/attention/test_attention_backward_sm90a_library_gpu.py
export EMITTER_ATTN_BWD90_DIR="${EMITTER_ATTN_BWD90_DIR:-$PWD/generated/attn_bwd90_gpu}"
[ "$STAGE" = all ] && TESTS="tests/attention/test_attention_backward_gpu.py tests/attention/test_attention_backward_library_gpu.py"
t0=$(date +%s)
$PY -m pytest -q -s -rA -m gpu $TESTS -p no:cacheprovider ${SEL:+-k "$SEL"} \
  2>&1 | tee "$OUTDIR/attn_bwd_${STAGE}.log"
rc=${PIPESTATUS[0]}
if [ "$rc" -ne 0 ] && [ "$STAGE" = verify ] && [ -f "$EMITTER_ATTN_BWD_DIR/manifest.json" ]; then
  # the in-process verify stops at a CUDA fault: say which instances fault, each in its own worker
  echo "== emitter verify (isolated workers) to place the failure"
  $PY -m emitter verify "$EMITTER_ATTN_BWD_DIR" --select 'op=backward' --exclude '*_bug_*' --quick \
    --json "$OUTDIR/attn_bwd_verify.json" 2>&1 | tail -30
fi
echo "attention backward ($STAGE): pytest exit $rc after $(( $(date +%s) - t0 )) s; reports in $OUTDIR"
exit "$rc"
