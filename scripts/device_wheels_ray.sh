#!/bin/bash
# Ray for the GPU machine, which has no package registry and takes at most 64 MiB of carried files (issue 29):
# downloads ray (cp312, manylinux x86_64) and the dependencies the GPU machine lacks, and repacks ray without
# its Java worker (ray/jars, 31 MiB: Python workers never load it) and the dashboard's JavaScript source map,
# 79 -> ~45 MiB in all. Writes .device-wheels-ray/ (wheels + setup.sh); run from the project root:
#   bash scripts/device_wheels_ray.sh [RAY_VERSION]      (default 2.60.0; PYTHON_VERSION=3.12)
# On the GPU machine: `source .device-wheels/setup.sh; source .device-wheels-ray/setup.sh; python3 -m emitter ...`
set -euo pipefail
RAY_VERSION=${1:-2.60.0}
PYV=${PYTHON_VERSION:-3.12}
PIP=${PIP:-.venv/bin/pip}
OUT=${OUT:-.device-wheels-ray}
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
rm -rf "$OUT"; mkdir -p "$OUT"
dl() { "$PIP" download -q --no-deps --only-binary=:all: --python-version "$PYV" --platform manylinux2014_x86_64 \
         --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 -d "$1" "${@:2}"; }
dl "$TMP" "ray==$RAY_VERSION"
# ray's own requirements, less click and pyyaml (there already): jsonschema and requests with theirs
dl "$OUT" jsonschema attrs referencing rpds-py jsonschema-specifications "msgpack<2,>=1" "protobuf>=3.20.3" \
   requests urllib3 idna charset-normalizer certifi filelock "packaging>=24.2" typing_extensions
"${PYTHON:-.venv/bin/python}" - "$TMP"/ray-*.whl "$OUT" <<'PY'
import sys, zipfile
src, out = sys.argv[1], sys.argv[2]
drop = lambda n: n.startswith("ray/jars/") or n.endswith(".js.map")
zin = zipfile.ZipFile(src)
name = src.rsplit("/", 1)[1]
with zipfile.ZipFile(f"{out}/{name}", "w", zipfile.ZIP_DEFLATED, compresslevel=9) as zout:
    for info in zin.infolist():          # ZipInfo kept: the binaries' exec bits (external_attr) survive
        if drop(info.filename):
            continue
        data = zin.read(info)
        if info.filename.endswith(".dist-info/RECORD"):
            data = "\n".join(l for l in data.decode().splitlines() if not drop(l.split(",")[0])).encode() + b"\n"
        zout.writestr(info, data, compress_type=zipfile.ZIP_DEFLATED, compresslevel=9)
PY
cat > "$OUT/setup.sh" <<'SH'
# Sourced on the GPU machine after .device-wheels/setup.sh: Ray into /tmp/site-ray (once per machine), on PYTHONPATH
# (Ray's raylet and its workers inherit it). Check: python3 -c "import ray; print(ray.__version__)"
if [ ! -f /tmp/site-ray/.ready ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site-ray .device-wheels-ray/*.whl \
    && touch /tmp/site-ray/.ready
fi
export PYTHONPATH=/tmp/site-ray${PYTHONPATH:+:$PYTHONPATH}
export RAY_USAGE_STATS_ENABLED=0
SH
du -sh "$OUT"; ls -la "$OUT"
