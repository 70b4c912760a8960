#!/usr/bin/env bash
# Do the libraries exported from an older revision and from this tree dispatch the same way? (CPU only, no GPU,
# no kernel build.)
#   scripts/dispatch_compare.sh OLD_REV [WORKDIR]      e.g. scripts/dispatch_compare.sh 3341ddd^
#   NEW_REV=7e662d2 scripts/dispatch_compare.sh 7e662d2^   (two revisions; without NEW_REV: this working tree)
# Both trees export the same libraries from the same inputs: OLD_REV's config files (the specs both trees must
# still accept) and this tree's committed tuning tables, copied alone into WORKDIR/tables so that no profile.json
# lies beside them (with one, GEMM's predicted-time rule would rank kernels between profiled shapes, which the old
# tree cannot do). Libraries:
#   gemm        configs/gemm/*.yaml                                       + docs/perf/tuning.json
#   gemm_h100   configs/gemm/*.yaml                                       + docs/perf/tuning.nvidia-h100-80gb-hbm3.json
#   tuned       configs/gemm/*.yaml configs/tuning/sm90a_candidates.yaml  + docs/perf/tuning.json (every entry's kernel)
#   tuned_h100  the same                                                  + the H100 table
#   mix         configs/gemm, attention (forward) and conv *.yaml         + docs/perf/tuning.json
# GEMM: each tree's tools/<lib>_dispatch_probe.cpp is compiled with its src/<lib>_table.cpp by the host compiler and
# fed the same problems (every tuned shape with neighbours, and a seeded few hundred others per operation: odd,
# small, large, split-K-prone, explicit split-K, batched, transposed, any accumulator, fast-accum opt-in on and off,
# clamp bounds, several compute capabilities); kernels and tuning records are compared by name and content, not
# by index. Attention: both trees' Python mirror of the C dispatch (emitter.families.attention.library.candidates,
# which each tree's tests hold equal to its C code) on the same problems, over each tree's own kernel records.
# Conv (no probe, no Python mirror): the exported kernel table and the dispatch code of both trees are diffed.
# Prints the figures; exit 0 = every decision identical, 3 = GEMM differences that are all the options-padding
# rule (commit 7e662d2, checked per candidate against CUTLASS's tile scheduler), 1 = other differences (listed under
# WORKDIR/*.diff), 2 = error.
set -u -o pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
OLD_REV="${1:?usage: scripts/dispatch_compare.sh OLD_REV [WORKDIR]}"
WORK="${2:-$(mktemp -d /tmp/dispatch_compare.XXXXXX)}"
PY="${PY:-$ROOT/.venv/bin/python}"
CXX="${CXX:-$(command -v g++ || command -v c++)}"
mkdir -p "$WORK"
WORK="$(cd "$WORK" && pwd)"
OLD="$WORK/tree.old"
NEW="$ROOT"

git -C "$ROOT" rev-parse --verify -q "$OLD_REV^{commit}" >/dev/null || { echo "error: $OLD_REV is not a commit"; exit 2; }
rm -rf "$OLD"
git -C "$ROOT" worktree prune
git -C "$ROOT" worktree add -q --detach "$OLD" "$OLD_REV" || exit 2
cleanup() {
  git -C "$ROOT" worktree remove --force "$OLD" 2>/dev/null
  [ "$NEW" != "$ROOT" ] && git -C "$ROOT" worktree remove --force "$NEW" 2>/dev/null
  git -C "$ROOT" worktree prune
}
trap cleanup EXIT
if [ -n "${NEW_REV:-}" ]; then
  NEW="$WORK/tree.new"
  rm -rf "$NEW"
  git -C "$ROOT" worktree add -q --detach "$NEW" "$NEW_REV" || exit 2
fi

mkdir -p "$WORK/tables/t" "$WORK/tables/h100"
cp "$ROOT/docs/perf/tuning.json" "$WORK/tables/t/tuning.json"
cp "$ROOT/docs/perf/tuning.nvidia-h100-80gb-hbm3.json" "$WORK/tables/h100/tuning.json"

# the old tree's configs, given to both trees
CFG="$OLD/configs"
GEMM_CFGS=("$CFG"/gemm/*.yaml)
TUNED_CFGS=("${GEMM_CFGS[@]}" "$CFG/tuning/sm90a_candidates.yaml")
# (the attention backward spec is left out: OLD_REV=3341ddd^ emits it but its library export refuses it)
MIX_CFGS=("${GEMM_CFGS[@]}")
for f in "$CFG"/attention/*.yaml; do [[ "$f" == *backward* ]] || MIX_CFGS+=("$f"); done
MIX_CFGS+=("$CFG"/conv/*.yaml)

# export SIDE SET TABLE CONFIGS...: emit with SIDE's code, then `emitter library`
export_lib() {
  local side="$1" set="$2" table="$3"; shift 3
  local tree
  if [ "$side" = old ]; then tree="$OLD"; else tree="$NEW"; fi
  local gen="$WORK/$side/$set.gen" lib="$WORK/$side/$set.lib" log="$WORK/$side/$set.log"
  mkdir -p "$WORK/$side"
  rm -rf "$gen" "$lib"
  (cd "$tree" && PYTHONPATH="$tree" nice "$PY" -m emitter emit "$@" -o "$gen" -q) >"$log" 2>&1 \
    || { echo "error: $side emit for $set failed (see $log)"; tail -5 "$log"; return 1; }
  (cd "$tree" && PYTHONPATH="$tree" nice "$PY" -m emitter library "$gen" --tuning "$table" --name dc -o "$lib") >>"$log" 2>&1 \
    || { echo "error: $side library for $set failed (see $log)"; tail -5 "$log"; return 1; }
  grep -E "profile.json|predicted time" "$log" && { echo "error: $side $set read a profile.json"; return 1; }
  grep -E "^library dc:" "$log" | sed "s|^|  $side $set: |" | cut -c1-240
}

for side in old new; do
  export_lib "$side" gemm "$WORK/tables/t/tuning.json" "${GEMM_CFGS[@]}" || exit 2
  export_lib "$side" gemm_h100 "$WORK/tables/h100/tuning.json" "${GEMM_CFGS[@]}" || exit 2
  export_lib "$side" tuned "$WORK/tables/t/tuning.json" "${TUNED_CFGS[@]}" || exit 2
  export_lib "$side" tuned_h100 "$WORK/tables/h100/tuning.json" "${TUNED_CFGS[@]}" || exit 2
  export_lib "$side" mix "$WORK/tables/t/tuning.json" "${MIX_CFGS[@]}" || exit 2
done

# the probes: each tree's probe source with its own table, host compiler only
for side in old new; do
  for set in gemm gemm_h100 tuned tuned_h100 mix; do
    lib="$WORK/$side/$set.lib"
    nice "$CXX" -std=c++17 -O1 -I"$lib/src" "$lib/tools/dc_dispatch_probe.cpp" "$lib/src/dc_table.cpp" \
      -o "$WORK/$side/$set.probe" || { echo "error: $side $set probe does not compile"; exit 2; }
  done
done

cat >"$WORK/compare.py" <<'PYEOF'
"""Compares the dispatch of two trees' exported libraries (see dispatch_compare.sh): GEMM through the probes,
attention through the mirrors' orders and its table, conv through its table and dispatch text (--families)."""
import json
import random
import re
import subprocess
import sys
from pathlib import Path

WORK = Path(sys.argv[1])
SETS = sys.argv[2:]
RE_KERNEL = re.compile(r'/\* (\d+) \*/ \{"([^"]+)", \{([^}]*)\},')


def kernel_ops(lib: Path) -> dict[str, tuple]:
    """name -> (a, b, c, d, acc, la, lb, lc, act, bias, fast_accum, clamp_min, clamp_max) from src/dc_table.cpp."""
    text = (lib / "src/dc_table.cpp").read_text()
    out = {}
    for _, name, op in RE_KERNEL.findall(text):
        vals = [v.strip().rstrip("f") for v in op.split(",")]
        out[name] = tuple(int(v) for v in vals[:11]) + tuple(float(v) for v in vals[11:13])
    return out


def records(lib: Path):
    m = json.loads((lib / "manifest.json").read_text())
    kernels = {k["index"]: k["name"] for k in m["kernels"]}
    tuning = {t["index"]: "{}@{}x{}x{}x{}/cc{}/split{}/opt{}".format(
        t["kernel"], t["problem"]["m"], t["problem"]["n"], t["problem"]["k"], t["problem"]["batch"], t["gpu_cc"],
        t["split_k"], t["options"]) for t in m["tuning"]}
    return kernels, tuning, len(m.get("measured") or [])


def problems(ops: dict[str, tuple], tuned: list[tuple], seed: int) -> list[str]:
    rnd = random.Random(seed)
    lines = []

    def add(op, m, n, k, batch=1, split=1, cc=90, fast=0, clamp=None):
        vals = list(op[:10]) + [m, n, k, batch, split, cc, fast]
        line = " ".join(map(str, vals))
        if clamp is not None:
            line += " %g %g" % clamp
        lines.append(line)

    distinct = sorted({v[:10] + v[11:13] for v in ops.values()})
    for v in distinct:
        base, clamp = v[:10], (v[10], v[11])
        variants = [base, base[:7] + (3 - base[7],) + base[8:],          # C/D in the other layout: the transpose
                    base[:4] + (0,) + base[5:],                          # any accumulator
                    base[:5] + (base[6], base[5]) + base[7:]]            # A and B layouts swapped
        for i, op in enumerate(variants):
            count = 120 if i == 0 else 40
            for _ in range(count):
                kind = rnd.random()
                if kind < 0.25:   # split-K-prone: small output, long k
                    m, n, k = rnd.choice([1, 8, 16, 64, 128, 256]), rnd.choice([16, 64, 128, 256, 512]), \
                        rnd.choice([4096, 8192, 14336, 28672, 65536, rnd.randrange(2000, 70000)])
                elif kind < 0.5:  # odd sizes
                    m, n, k = (rnd.randrange(1, 5000) | 1 for _ in range(3))
                elif kind < 0.7:  # small
                    m, n, k = (rnd.randrange(1, 300) for _ in range(3))
                else:             # large
                    m, n, k = rnd.choice([1, 7, 64, 100, 777, 4096, 8192, 20000]), rnd.randrange(1, 40000), \
                        rnd.choice([rnd.randrange(1, 9000), rnd.randrange(1, 600), 16384])
                batch = rnd.choice([1, 1, 1, 1, 3, 8])
                split = rnd.choice([1] * 10 + [2, 5])
                cc = rnd.choice([90] * 6 + [80, 86, 89, 100])
                fast = rnd.choice([0, 1])
                cl = None
                if op[8] == 5:    # clamp: the kernel's bounds, or others
                    cl = clamp if rnd.random() < 0.7 else (clamp[0] - 1, clamp[1] + 0.5)
                add(op, m, n, k, batch, split, cc, fast, cl)
    for op, m, n, k, batch, cc in tuned:   # every tuned shape, its neighbours, other devices, other splits
        for fast in (0, 1):
            for mm, nn, kk in [(m, n, k), (m + 1, n, k), (m, n - 1, k), (m, n, k + 7), (2 * m, n, k), (m, n, k // 2),
                               (max(m // 2, 1), 2 * n, k), (m * 3 + 1, n, k)]:
                add(op, mm, nn, kk, batch, 1, cc, fast)
            add(op, m, n, k, batch, 1, 80, fast)
            add(op, m, n, k, batch, 4, cc, fast)
            add(op, m, n, k, batch + 2, 1, cc, fast)
            tr = op[:7] + (3 - op[7],) + op[8:]
            add(tr, n, m, k, batch, 1, cc, fast)
    return lines


def normalise(line: str, kernels, tuning, side: str) -> tuple[str, int]:
    if line == "-":
        return "-", 0
    out, measured = [], 0
    for c in line.split():
        f = c.split(":")
        if len(f) == 6:
            measured += f[5] != "-1"
        t = int(f[1])
        out.append("{}|{}|tr{}|split{}|opt{}".format(kernels[int(f[0])], tuning[t] if t >= 0 else "fallback",
                                                   f[2], f[3], f[4]))
    return " ".join(out), measured


RE_FULL = re.compile(r'/\* (\d+) \*/ \{"([^"]+)", \{[^}]*\},\s*([^}]*)\}')


def geometry(lib: Path) -> dict[str, tuple]:
    """name -> (tile_m, tile_n, cluster_m, cluster_n, swap_ab, swizzle), where the table has them (None if not)."""
    out = {}
    for _, name, rest in RE_FULL.findall((lib / "src/dc_table.cpp").read_text()):
        f = [v.strip() for v in rest.split(",")]
        if len(f) < 18:
            return {}
        out[name] = (int(f[7]), int(f[8]), int(f[10]), int(f[11]), int(f[15]), int(f[17]))
    return out


def _padded(g, m, n, max_swizzle):
    """The tiles CUTLASS's sm90 persistent scheduler launches: CTAs rounded up to the cluster, then to swizzle x
    cluster (written from cutlass/gemm/kernel/tile_scheduler_params.h: get_tiled_cta_shape_mnl,
    get_log_swizzle_size and the round_up after it; not from emitter's dispatch code, which it checks)."""
    tm, tn, cm, cn, swap, _ = g
    if swap:
        m, n = n, m
    cm, cn = max(cm, 1), max(cn, 1)
    bm = -(-(-(-m // tm)) // cm) * cm
    bn = -(-(-(-n // tn)) // cn) * cn
    small = min(bm, bn)
    log = 3 if max_swizzle >= 8 and small >= 6 else 2 if max_swizzle >= 4 and small >= 3 else \
        1 if max_swizzle >= 2 and small >= 2 else 0
    s = 1 << log
    return (-(-bm // (s * cm)) * s * cm) * (-(-bn // (s * cn)) * s * cn)


def explain(problem: str, old: str, new: str, geo: dict) -> str:
    """Why one candidate differs: 'options-padding' when only the run-time options differ, the old one being the
    tuning record's and the new one none, on a problem of another m x n than the record's whose options' swizzle
    pads the tile grid beyond the kernel's compiled-in swizzle (the rule of commit 7e662d2); else 'other'."""
    fo, fn = old.split("|"), new.split("|")
    if fo[:4] != fn[:4] or fn[4] != "opt0" or fo[1] == "fallback" or not geo.get(fo[0]):
        return "other"
    rec_opt = int(fo[1].rsplit("/opt", 1)[1])
    if fo[4] != f"opt{rec_opt}":
        return "other"
    rm, rn = (int(v) for v in fo[1].split("@")[1].split("x")[:2])
    v = problem.split()
    qm, qn = int(v[10]), int(v[11])
    if fo[2] == "tr1":
        qm, qn = qn, qm
    g = geo[fo[0]]
    code = rec_opt & 0xF
    if (qm, qn) != (rm, rn) and code and _padded(g, qm, qn, 1 << (code - 1)) > _padded(g, qm, qn, max(g[5], 1)):
        return "options-padding"
    return "other"


def gemm(set_name: str) -> int:
    libs = {s: WORK / s / f"{set_name}.lib" for s in ("old", "new")}
    ops = {**kernel_ops(libs["old"]), **kernel_ops(libs["new"])}
    recs = {s: records(libs[s]) for s in libs}
    kern_same = sorted(recs["old"][0].values()) == sorted(recs["new"][0].values())
    tun_same = sorted(recs["old"][1].values()) == sorted(recs["new"][1].values())
    tuned = []
    for s in libs:
        m = json.loads((libs[s] / "manifest.json").read_text())
        for t in m["tuning"]:
            p = t["problem"]
            tuned.append((ops[t["kernel"]][:10], p["m"], p["n"], p["k"], p["batch"], t["gpu_cc"]))
    tuned = sorted(set(tuned))
    lines = problems(ops, tuned, seed=36)
    (WORK / f"{set_name}.problems").write_text("\n".join(lines) + "\n")
    outs = {}
    for s in libs:
        res = subprocess.run([str(WORK / s / f"{set_name}.probe")], input="\n".join(lines) + "\n", text=True,
                             capture_output=True)
        if res.returncode != 0:
            print(f"error: {s} {set_name} probe exit {res.returncode}: {res.stderr.strip()[:300]}")
            return 2
        got = res.stdout.splitlines()
        if len(got) != len(lines):
            print(f"error: {s} {set_name} probe answered {len(got)} lines for {len(lines)} problems")
            return 2
        listing = subprocess.run([str(WORK / s / f"{set_name}.probe"), "--kernels"], text=True, capture_output=True,
                                 check=True).stdout.splitlines()
        if [l.split()[1] for l in listing] != [recs[s][0][i] for i in range(len(listing))]:
            print(f"error: {s} {set_name}: the probe's kernel list is not the manifest's")
            return 2
        outs[s] = [normalise(l, recs[s][0], recs[s][1], s) for l in got]
    measured = sum(m for _, m in outs["new"]) + sum(m for _, m in outs["old"])
    same = sum(a[0] == b[0] for a, b in zip(outs["old"], outs["new"]))
    order_same = sum([c.split("|")[0] for c in a[0].split()] == [c.split("|")[0] for c in b[0].split()]
                     for a, b in zip(outs["old"], outs["new"]))
    first_same = sum(a[0].split()[:1] == b[0].split()[:1] for a, b in zip(outs["old"], outs["new"]))
    nonempty = sum(a[0] != "-" for a in outs["old"])
    tuned_first = sum("|fallback|" not in a[0].split()[0] + "|" for a in outs["old"] if a[0] != "-")
    diffs = [(p, a[0], b[0]) for p, a, b in zip(lines, outs["old"], outs["new"]) if a[0] != b[0]]
    geo = geometry(libs["new"])
    why = {}
    kept = 0   # candidates both trees run with a tuning record's nonzero options on another m x n (the rule keeps)
    with open(WORK / f"{set_name}.diff", "w") as f:
        for p, a, b in diffs:
            f.write(f"problem {p}\n  old {a}\n  new {b}\n")
            for ca, cb in zip(a.split(), b.split()):
                if ca != cb:
                    w = explain(p, ca, cb, geo)
                    why[w] = why.get(w, 0) + 1
                    if w == "other":
                        f.write(f"  unexplained: {ca} -> {cb}\n")
    kept_padding = 0   # ... of which the padding rule above would have dropped (0 if the rule explains both ways)
    for p, a, b in zip(lines, outs["old"], outs["new"]):
        for ca, cb in zip(a[0].split(), b[0].split()):
            fo = ca.split("|")
            if ca == cb and len(fo) == 5 and fo[1] != "fallback" and fo[4] != "opt0":
                kept += 1
                kept_padding += explain(p, ca, ca.rsplit("|", 1)[0] + "|opt0", geo) == "options-padding"
    print(f"  {set_name}: {len(lines)} problems ({nonempty} with candidates, {tuned_first} led by a tuning record, "
          f"{len(tuned)} tuned (op, shape, cc)), identical {same}/{len(lines)}, same kernel order {order_same}, "
          f"same first candidate (kernel, record, split, options) {first_same}; kernels same: {kern_same}, tuning "
          f"records same: {tun_same}, measured records/ranks: {recs['new'][2]}/{measured}")
    if why:
        print(f"    differing candidates: {why} ('options-padding': only the record's run-time options dropped where "
              f"their swizzle pads the grid, commit 7e662d2); tuned options kept alike: {kept} candidates, "
              f"{kept_padding} of them where the rule would drop them")
        why["other"] = why.get("other", 0) + kept_padding
    ok = kern_same and tun_same and measured == 0 and order_same == len(lines)
    return 0 if same == len(lines) and ok else 1 if not ok or why.get("other") else 3


def attention() -> int:
    """Each tree's attention mirror over its own kernel records (from the mix export) on the same problems."""
    code = r'''
import json, sys
from pathlib import Path
import emitter.families.attention.library as L
lib = Path(sys.argv[1]); problems = json.loads(Path(sys.argv[2]).read_text())
m = json.loads((lib / "manifest.json").read_text())
gen = lib.parent / "mix.gen"
entries = [e for e in json.loads((gen / "manifest.json").read_text())["instances"] if e.get("family") == "attention"]
import inspect
codes = {"f16": 1, "bf16": 2, "e4m3": 8}
kr = L.kernel_records(entries, codes, ValueError)
kernels = kr[0] if isinstance(kr, tuple) else kr
params = inspect.signature(L.candidates).parameters
out = []
for p in problems:
    args = {k: v for k, v in p.items() if k in params}
    if "tuning" in params:
        args["tuning"] = []
    try:
        got = L.candidates(kernels, **args)
        out.append([kernels[i].name if isinstance(i, int) else i.name for i in got])
    except TypeError as e:
        print("signature:", e, file=sys.stderr); sys.exit(3)
print(json.dumps({"kernels": sorted(k.name for k in kernels), "orders": out}))
'''
    (WORK / "attn_mirror.py").write_text(code)
    return 0


def _rows(text: str, array: str) -> list[list[str]]:
    """The rows of `const X array[] = {...};` in exported source: name and fields (shim pointers left out)."""
    start = text.find(f" {array}[] = {{")
    if start < 0:
        return []
    body = text[start:text.find("\n};", start)]
    rows = []
    for m in re.finditer(r'(?:/\* \d+ \*/ )?\{"([^"]+)",([^&}]*)', body):
        rows.append([m.group(1)] + [v.strip() for v in m.group(2).replace("\n", " ").split(",") if v.strip()])
    return rows


def _section(text: str, title: str) -> str:
    """One `// ---- <title> ...` section of the exported C API, up to the next such line."""
    parts = re.split(r"\n(?=// ---- )", text)
    hits = [p for p in parts if p.lower().startswith(f"// ---- {title}")]
    return hits[0] if hits else ""


def families() -> int:
    rc = 0
    lib = {s: WORK / s / "mix.lib" for s in ("old", "new")}
    api = {s: (lib[s] / "src/dc_api.cpp").read_text() for s in lib}
    table = {s: (lib[s] / "src/dc_table.cpp").read_text() for s in lib}
    # attention: the kernel table (fields the old tree has; the new one's extra fields listed) and the mirrors
    ra, rb = _rows(api["old"], "kAttention"), _rows(api["new"], "kAttention")
    same_rows = len(ra) == len(rb) and all(a == b[:len(a)] for a, b in zip(ra, rb))
    extra = sorted({tuple(b[len(a):]) for a, b in zip(ra, rb)})
    o, n = (json.loads((WORK / s / "attn.orders.json").read_text()) for s in ("old", "new"))
    probs = json.loads((WORK / "attn.problems.json").read_text())
    same = sum(a == b for a, b in zip(o["orders"], n["orders"]))
    with open(WORK / "attention.diff", "w") as f:
        for p, a, b in zip(probs, o["orders"], n["orders"]):
            if a != b:
                f.write(f"problem {json.dumps(p)}\n  old {' '.join(a)}\n  new {' '.join(b)}\n")
    nonempty = sum(bool(a) for a in o["orders"])
    sec = {s: _section(api[s], "attention") for s in api}
    # the table rows are compared above, field by field
    changed = [l for l in difflib_lines(sec["old"], sec["new"]) if not re.match(r'[+-]  /\* \d+ \*/ \{"', l)]
    print(f"  attention: {len(ra)} kernels, table rows same (old fields): {same_rows}, new fields' values: {extra}; "
          f"split_kv kernels old/new: {o['split_kv']}/{n['split_kv']}; mirror orders identical {same}/{len(probs)} "
          f"({nonempty} with candidates); C dispatch section, rows aside: {len(changed)} changed lines")
    for l in changed:
        print(f"    {l[:150]}")
    if not (same_rows and same == len(probs) and o["kernels"] == n["kernels"]):
        rc = 1
    # conv: no probe and no Python mirror: the kernel and tuning tables and the dispatch code must be the same text
    ca, cb = _rows(table["old"], "kConvKernels"), _rows(table["new"], "kConvKernels")
    ta, tb = _rows(table["old"], "kConvTuning"), _rows(table["new"], "kConvTuning")
    csec = {s: _section(api[s], "convolution") for s in api}
    hdr = {s: (lib[s] / "src/dc_conv_table.h").read_text() if (lib[s] / "src/dc_conv_table.h").exists() else ""
           for s in lib}
    cchanged = list(difflib_lines(csec["old"], csec["new"]))
    print(f"  conv: {len(ca)} kernels, kernel rows same: {ca == cb and bool(ca)}, tuning rows {len(ta)}/{len(tb)} same: "
          f"{ta == tb}, dc_conv_table.h same: {hdr['old'] == hdr['new']}, C dispatch section ({len(csec['new'])} "
          f"chars): {len(cchanged)} changed lines")
    for l in cchanged[:20]:
        print(f"    {l[:150]}")
    if not (ca == cb and ca and ta == tb and hdr["old"] == hdr["new"] and csec["old"] and not cchanged):
        rc = 1
    return rc


def difflib_lines(a: str, b: str):
    import difflib
    for l in difflib.unified_diff(a.splitlines(), b.splitlines(), lineterm="", n=0):
        if l[:1] in "+-" and not l.startswith(("+++", "---")):
            yield l


if __name__ == "__main__":
    if SETS == ["--families"]:
        sys.exit(families())
    rc = 0
    for s in SETS:
        rc = max(rc, gemm(s))
    sys.exit(rc)
PYEOF

# Attention: each tree's Python mirror of its C dispatch, over its own kernel records of the mix export.
# `gen` (old tree) writes the problems: every kernel's operation with and without LSE, equal heads and GQA ratios,
# query lengths around the decode and long-sequence bounds, key lengths on and off the tiles, several devices.
cat >"$WORK/attn_mirror.py" <<'PYEOF'
import inspect, json, random, sys
from pathlib import Path
import emitter.families.attention.library as L
mode, gen, out = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
entries = [e for e in json.loads((gen / "manifest.json").read_text())["instances"]
           if e.get("family") == "attention" and e["config"].get("op", "forward") == "forward"]
kernels = L.kernel_records(entries, {"f16": 1, "bf16": 2, "e4m3": 8}, ValueError)
if mode == "gen":
    rnd = random.Random(36)
    ops = sorted({(k.dtype_code, k.inst.head_dim, k.inst.head_dim_v, k.mask_code, int(k.inst.varlen)) for k in kernels})
    probs = []
    for dtype, hd, hdv, mask, varlen in ops:
        for _ in range(60):
            hq = rnd.choice([1, 8, 16, 32, 64])
            hkv = rnd.choice([hq, hq, max(hq // rnd.choice([2, 4, 8]), 1), 1])
            probs.append(dict(cc=rnd.choice([90, 90, 90, 80, 86, 89, 100]), dtype=dtype, head_dim=hd, head_dim_v=hdv,
                              mask=mask, varlen=bool(varlen), heads_q=hq, heads_kv=hkv,
                              seq_q=rnd.choice([1, 2, 15, 16, 17, 100, 511, 512, 513, 4096, rnd.randrange(1, 9000)]),
                              seq_k=rnd.choice([1, 64, 127, 128, 129, 1000, 4096, rnd.randrange(1, 20000)]),
                              lse=rnd.random() < 0.5, batch=rnd.choice([1, 2, 8])))
        probs.append(dict(probs[-1], dtype=99))   # no kernel
    out.write_text(json.dumps(probs))
else:
    params = inspect.signature(L.candidates).parameters
    probs = json.loads(Path(sys.argv[4]).read_text())
    orders = [[k.name for k in L.candidates(kernels, **{a: v for a, v in p.items() if a in params})] for p in probs]
    out.write_text(json.dumps({"kernels": [k.name for k in kernels],
                               "split_kv": sum(bool(getattr(k, "split_kv", False)) for k in kernels), "orders": orders}))
PYEOF
(cd "$OLD" && PYTHONPATH="$OLD" "$PY" "$WORK/attn_mirror.py" gen "$WORK/old/mix.gen" "$WORK/attn.problems.json") || exit 2
for side in old new; do
  if [ "$side" = old ]; then tree="$OLD"; else tree="$NEW"; fi
  (cd "$tree" && PYTHONPATH="$tree" "$PY" "$WORK/attn_mirror.py" order "$WORK/$side/mix.gen" "$WORK/$side/attn.orders.json" \
    "$WORK/attn.problems.json") || exit 2
done

echo "== GEMM dispatch probes (old = $OLD_REV, new = ${NEW_REV:-$(git -C "$ROOT" rev-parse --short HEAD) + working tree})"
"$PY" "$WORK/compare.py" "$WORK" gemm gemm_h100 tuned tuned_h100 mix
rc=$?
echo "== attention and conv (mix library)"
"$PY" "$WORK/compare.py" "$WORK" --families
rc2=$?
[ $rc2 -eq 1 ] || [ $rc2 -eq 2 ] && rc=$rc2
echo "work dir: $WORK (problems: *.problems, differences: *.diff)"
exit $rc
