"""Exported kernel libraries: `emitter library` turns manifest instances + a tuning table into a
self-contained CMake project with a C API, dispatch by problem shape and a Python loader.

dispatch.py  dispatch records and the Python mirror of the C++ selection rule
tuning.py    reading tuning tables
abi.py       the C structs as field lists (ctypes loader + static_asserts)
export.py    rendering templates/library/ into the output tree
cli.py       the `library` click command
"""
