#!/bin/bash
# Issue 29 item 5, on the GPU machine (one GPU): build through Ray, then profile the same kernels locally and
# through Ray (one GPU actor), and compare the winners. From the project root, with .device-wheels and
# .device-wheels-ray carried (make the latter with scripts/device_wheels_ray.sh):
#   source .device-wheels/setup.sh; source .device-wheels-ray/setup.sh; bash scripts/ray_gpu_check.sh
# About 4 minutes on an H100 machine of 16 cores (4 sm90a instances: ~1.5 min of nvcc, 2 x ~1 min of profile).
set -euo pipefail
OUT=${RAY_CHECK_DIR:-generated/ray_check}   # not $OUT: the device tool sets that to its own folder
RES=${RAY_CHECK_RESULTS:-results/ray_check}
python3 -c "import ray; print('ray', ray.__version__, ray.__file__)"
python3 -m emitter emit configs/gemm/sm90a_bf16.yaml -o "$OUT"
/usr/bin/time -f "ray build: %e s wall" python3 -m emitter build "$OUT" --executor ray --no-cache --no-progress
mkdir -p "$RES"
cat > "$RES/config.yaml" <<YAML
manifests: [$PWD/$OUT]
problems:
  - square: [1024, 4096, 8192]
  - {m: 128, n: 8192, k: 8192}
output: {plots: false}
YAML
/usr/bin/time -f "local profile: %e s wall" python3 -m emitter profile "$RES/config.yaml" -o "$RES/local" --quick
/usr/bin/time -f "ray profile: %e s wall" python3 -m emitter profile "$RES/config.yaml" -o "$RES/ray" --quick --executor ray
python3 scripts/compare_tuning.py "$RES/local" "$RES/ray"
