"""emitter: YAML kernel specs -> CUTLASS kernel instances, compiled, verified and profiled."""

__version__ = "0.1.0"
__all__ = ["__version__"]
