"""Profiling: config -> (GPU workers: check, event timing, cuBLAS baseline) -> stable best kernels -> reports.

config.py     profile YAML (manifests, selection, problems, timing, baselines, outputs) with line-numbered errors
timing.py     event timing on the GPU: warm-up, blocking kernel, rotation past L2; device memory
stats.py      median / IQR / per-repeat medians of the samples
workload.py   rotated operand sets on the device; a backend-loaded kernel prepared on each set
check.py      the correctness check before a kernel's time counts
baselines.py  cuBLAS through torch on the same buffers, context and stream
selection.py  the best kernel per problem (smallest median; kernels within noise reported as ties); tuning table
runner.py     plan, shard over GPUs, one worker process each, restart after faults
worker.py     one process on one GPU (python -m emitter.profile.worker JOB.json)
report.py     CSV, JSON, tuning table, terminal table, plots
cli.py        `emitter profile`
"""
