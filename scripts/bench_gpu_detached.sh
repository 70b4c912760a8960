#!/usr/bin/env bash
# Run issue 6's full sweep (benchmarks/profile_sm90a.py: about 25 minutes on an H200 before the warm-up fix of 2026-11-23, several times less since, not yet timed) on a machine whose
# commands may last only minutes (the device tool: 10 minutes a command; a machine idle for 30 s between
# commands is handed back with everything on it). Each call:
#   1. starts the sweep detached from this command (setsid), or, if one is running, leaves it running;
#      when a previous sitting's worker logs are present (RUN/profile/work, or carried in as
#      $BENCH_CARRY/work), it continues that sweep with --resume instead of starting afresh;
#   2. waits up to WAIT seconds for it to finish;
#   3. packs what there is (logs, profile.json/csv, tuning.json, plots, build records; no binaries) into
#      $OUT/run.tgz, so a sweep cut short can be reported (`emitter profile --replay RUN/profile/work`) or
#      carried to the next machine and resumed.
# Usage (project root):  bash scripts/bench_gpu_detached.sh [WAIT_SECONDS]      (default 540)
# Environment: RUN (default /tmp/emitter-bench/sm90a), OUT (default ./bench-out), BENCH_CARRY (an earlier run.tgz's
# `sm90a` folder: its sweep, confirmation, verify and step times go on; or a folder holding its `profile/work`),
# BENCH_ARGS (extra arguments for the benchmark), BENCH_CMD (replaces the benchmark command; tests use it).
# Prints BENCH_EXIT <code> when the sweep ended.
set -u -o pipefail
cd "$(dirname "$0")/.."
WAIT="${1:-540}"
RUN="${RUN:-/tmp/emitter-bench/sm90a}"
OUT="${OUT:-$PWD/bench-out}"
LOG="$(dirname "$RUN")/bench.log"
PIDFILE="$(dirname "$RUN")/bench.pid"
mkdir -p "$RUN" "$OUT"
[ -f .device-wheels/setup.sh ] && source .device-wheels/setup.sh
export PYTHONUNBUFFERED=1

running() { [ -f "$PIDFILE" ] && kill -0 "$(cat "$PIDFILE")" 2>/dev/null; }
finished() { [ -f "$LOG" ] && grep -q '^BENCH_EXIT ' "$LOG"; }

if running; then
  echo "sweep already running (pid $(cat "$PIDFILE")); waiting"
elif finished; then
  echo "sweep already finished: $(grep '^BENCH_EXIT ' "$LOG" | tail -1)"
else
  resume=""
  # BENCH_CARRY: an earlier sitting's run folder (its run.tgz's `sm90a`: profile/work, profile/confirm.json,
  # verify.json, run.json) or its profile folder (work/ in it)
  if [ -n "${BENCH_CARRY:-}" ] && [ ! -d "$RUN/profile/work" ]; then
    prof="$BENCH_CARRY"; [ -d "$BENCH_CARRY/profile/work" ] && prof="$BENCH_CARRY/profile"
    if [ -d "$prof/work" ]; then
      mkdir -p "$RUN/profile" && cp -r "$prof/work" "$RUN/profile/work"
      [ -f "$prof/confirm.json" ] && cp "$prof/confirm.json" "$RUN/profile/confirm.json"
      for f in verify.json run.json; do [ -f "$BENCH_CARRY/$f" ] && cp "$BENCH_CARRY/$f" "$RUN/$f"; done
    fi
  fi
  [ -d "$RUN/profile/work" ] && ls "$RUN/profile/work"/shard*.jsonl >/dev/null 2>&1 && resume="--resume"
  cmd="${BENCH_CMD:-python3 benchmarks/profile_sm90a.py --out $RUN --shapes all -j $(nproc) --repeats 3 --min-duration-ms 10 --doc $(dirname "$RUN")/performance.md $resume ${BENCH_ARGS:-}}"
  echo "starting${resume:+ (resuming)}: $cmd"
  setsid nohup bash -c "$cmd > '$LOG.part' 2>&1; code=\$?; cat '$LOG.part' >> '$LOG'; rm -f '$LOG.part'; echo BENCH_EXIT \$code >> '$LOG'" \
    >/dev/null 2>&1 </dev/null &
  echo $! > "$PIDFILE"
fi

t0=$(date +%s)
while ! finished && [ $(( $(date +%s) - t0 )) -lt "$WAIT" ]; do sleep 5; done

# what the run has so far, in one file (the device tool brings back at most 8)
tail -n 3 "$LOG.part" 2>/dev/null
finished && tail -n 60 "$LOG"
( cd "$(dirname "$RUN")" && tar czf "$OUT/run.tgz" --exclude='*.cubin' --exclude='*.so' --exclude='*.cu' \
    --exclude='*.o' "$(basename "$RUN")" $(ls bench.log bench.log.part performance.md 2>/dev/null) 2>/dev/null )
echo "packed $(du -h "$OUT/run.tgz" | cut -f1) into $OUT/run.tgz"
finished && exit 0
echo "still running after ${WAIT}s: call again within 30 s to keep the machine (and the sweep) alive"
exit 0
