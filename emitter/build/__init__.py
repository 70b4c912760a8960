"""Build: compile a manifest's instances with nvcc (parallel, content-hash cache, failures as results).

    from emitter.build import build, BuildOptions
    summary = build("generated/demo", select=["arch=sm90a"], options=BuildOptions(jobs=2))
"""

from emitter.build.builder import (BuildOptions, BuildSummary, InstanceResult, Reporter, build, cache_key,
                                   read_record)

__all__ = ["build", "BuildOptions", "BuildSummary", "InstanceResult", "Reporter", "cache_key", "read_record"]
