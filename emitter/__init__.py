"""emitter: YAML kernel specs -> CUTLASS kernel instances, compiled, verified and profiled.

The Python API (emitter/api.py; every call returns the record the CLI prints):

    import emitter
    emitter.emit_specs("configs/gemm/sm80.yaml", out="gen")   # or a dict, or emitter.YamlText(text)
    emitter.build_instances("gen")
    emitter.verify_instances("gen", quick=True)               # on a GPU (backend="fake" without one)
    emitter.profile_instances("gen", problems=["4096x4096x4096"], out="results")
    emitter.export_library("gen", name="mykernels", out="dist/mykernels")
"""

from emitter.version import __version__

_API = ("YamlText", "load_specs", "resolve_specs", "emit_specs", "build_instances", "verify_instances",
        "profile_instances", "export_library", "init_project")
__all__ = ["__version__", *_API, "EmitterError", "SpecError"]


def __getattr__(name: str):
    """The API is imported on first use, so `import emitter` (and the CLI's start-up) stays cheap."""
    if name in _API:
        from emitter import api

        return getattr(api, name)
    if name in ("EmitterError", "SpecError"):
        from emitter import errors

        return getattr(errors, name)
    raise AttributeError(f"module 'emitter' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
