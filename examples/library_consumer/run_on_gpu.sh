#!/usr/bin/env bash
# Build and install an exported `mykernels` library, build this consumer against the installed package,
# and run the C++ consumer and the Python loader check on this machine's GPU.
#
#   examples/library_consumer/run_on_gpu.sh <exported tree> <work dir> [cmake options for the library...]
#   e.g. run_on_gpu.sh dist/mykernels /tmp/mk -DCUTLASS_DIR=/path/to/cutlass
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
src="$1"; work="$2"; shift 2
mkdir -p "$work"
t0=$(date +%s)
cmake -S "$src" -B "$work/build" -DCMAKE_INSTALL_PREFIX="$work/prefix" "$@"
cmake --build "$work/build" -j "$(nproc)"
cmake --install "$work/build" > /dev/null
echo "library configured, built and installed in $(( $(date +%s) - t0 )) s"
cmake -S "$here" -B "$work/consumer" -DCMAKE_PREFIX_PATH="$work/prefix" > /dev/null
cmake --build "$work/consumer" > /dev/null
status=0
t1=$(date +%s)
"$work/consumer/consumer" || status=1
echo "consumer ran in $(( $(date +%s) - t1 )) s"
PYTHONPATH="$work/prefix/lib/mykernels/python${PYTHONPATH:+:$PYTHONPATH}" \
  python3 "$here/python_check.py" --json "$work/python_check.json" || status=1
exit $status
