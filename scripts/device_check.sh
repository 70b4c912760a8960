#!/usr/bin/env bash
# The GPU checks of every family in one device run: emits and builds all needed manifests at once
# (-j over the machine's cores), then runs each stage's GPU checks, each logged to $OUT/logs/<stage>.log;
# the logs are packed into $OUT/logs.tgz at the end (the device tool returns at most 8 files).
# Usage (on the GPU machine, repo root): bash scripts/device_check.sh STAGE...
#   stages: gemm80 attn80 attn90 conv conv1x1 wsreset loader libs gemm-suite gemm-profile bench-attn bench-conv
set -uo pipefail
source .device-wheels/setup.sh
OUT=${OUT:-/tmp/out}; L=$OUT/logs; mkdir -p $L
J=$(nproc)
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv | tee $L/gpu.txt
has() { for s in "${STAGES[@]}"; do [ "$s" = "$1" ] && return 0; done; return 1; }
STAGES=("$@")
emit() { python3 -m emitter emit "$2" -o "$1" > $L/emit_$(basename $1).log 2>&1 || echo "EMIT FAILED $1"; }
dirs=()
has gemm80 && { emit /tmp/g80 configs/gemm/sm80.yaml; dirs+=(/tmp/g80); }
has attn80 && { emit /tmp/a80 configs/attention/sm80.yaml; dirs+=(/tmp/a80); }
has attn90 && { emit /tmp/att90 configs/attention/sm90a_verify.yaml; dirs+=(/tmp/att90); }
{ has conv || has conv1x1; } && { emit /tmp/cv configs/conv/verify_set.yaml; dirs+=(/tmp/cv); }
has wsreset && { emit /tmp/wsr configs/gemm/sm90a_bf16.yaml; dirs+=(/tmp/wsr); }
t0=$(date +%s)
for d in "${dirs[@]}"; do
  python3 -m emitter build $d -j $J --no-progress > $L/build_$(basename $d).log 2>&1 &
done
wait
echo "builds: $(( $(date +%s) - t0 )) s for ${dirs[*]}" | tee -a $L/summary.txt
for d in "${dirs[@]}"; do tail -4 $L/build_$(basename $d).log | sed "s|^|$(basename $d): |" | tee -a $L/summary.txt; done
run() { local name=$1; shift; local t=$(date +%s); timeout ${TMO:-300} bash -c "$*" > $L/$name.log 2>&1; local rc=$?
  echo "== $name rc=$rc $(( $(date +%s) - t )) s" | tee -a $L/summary.txt; tail -${TAIL:-6} $L/$name.log | tee -a $L/summary.txt; }
has gemm80 && run gemm80 "python3 -m emitter verify /tmp/g80 --quick"
has attn80 && run attn80 "python3 -m emitter verify /tmp/a80 --seed 1; EMITTER_ATTN_DIR=/tmp/a80 python3 -m pytest -q -s -p no:cacheprovider -m gpu tests/attention/test_attention_gpu.py"
has attn90 && run attn90 "EMITTER_ATTENTION_SM90A_BUILD=/tmp/att90 python3 -m pytest -q -p no:cacheprovider -m gpu tests/attention/test_attention_sm90a_gpu.py; python3 -m emitter verify /tmp/att90 --seed 1"
has loader && run loader "python3 benchmarks/loader_overhead.py --keep /tmp/lo && EMITTER_LOADER_LIBRARY=/tmp/lo/lobench python3 -m pytest -q -p no:cacheprovider tests/gemm/test_loader_gpu.py"
has conv && run conv "EMITTER_CONV_GPU_DIR=/tmp/cv python3 -m pytest -q -rs -p no:cacheprovider tests/conv/test_conv_gpu.py; python3 -m emitter.families.conv.runner /tmp/cv --planted; python3 -m emitter verify /tmp/cv --quick --seed 1"
has conv1x1 && run conv1x1 "python3 -m emitter verify /tmp/cv --select '*fprop*gemm1x1*' --problem n=2,h=9,w=9,c=64,k=64,r=3,s=3,pad=1,bias=1 --problem n=3,h=7,w=9,c=40,k=72,r=1,s=1,beta=0.5,bias=1; EMITTER_CONV_GEMM1X1_DIR=/tmp/cv python3 -m pytest -q -rs -p no:cacheprovider -m gpu tests/conv/test_conv_gemm1x1_gpu.py; python3 -m emitter.families.conv.runner /tmp/cv --planted --select '*gemm1x1*'"
has wsreset && run wsreset "python3 benchmarks/workspace_reset.py --gen /tmp/wsr --kernel '*streamk*' --problem 256x512x8192 --problem 128x256x16384 --problem 16x4096x4096 --profile --json $OUT/wsr.json; python3 -m pytest -q -s -p no:cacheprovider tests/stages/test_workspace_parity.py -k on_the_gpu"
has gemm-profile && TMO=480 run gemm_profile "python3 -m pytest -q -p no:cacheprovider -m gpu tests/stages/test_profile.py; python3 -m pytest -q -p no:cacheprovider -m gpu tests/stages/test_gpu_verify.py -k split"
has libs && run libs "EMITTER_TEST_JOBS=$J python3 -m pytest -q -s -p no:cacheprovider -m gpu tests/attention/test_attention_library_gpu.py tests/conv/test_conv_library_gpu.py tests/stages/test_api.py"
has gemm-suite && TMO=480 run gemm_suite "python3 -m pytest -q -p no:cacheprovider -m gpu tests/stages/test_gpu_verify.py tests/stages/test_profile.py"
has bench-attn && TMO=560 TAIL=60 run bench_attn "python3 benchmarks/attention_bench.py --out /tmp/attn -j $J --doc $OUT/attention_performance.md; cp /tmp/attn/attention.json $OUT/"
has bench-conv && TMO=560 TAIL=60 run bench_conv "python3 benchmarks/conv_bench.py --out /tmp/conv_bench -j $J --doc $OUT/conv_performance.md; cp /tmp/conv_bench/conv.json $OUT/"
tar czf $OUT/logs.tgz -C $OUT logs
