"""emitter's version, written into every generated file's banner, manifest and exported library (one place, beneath
everything that writes it)."""

__version__ = "0.1.0"
