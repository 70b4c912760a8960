"""Exported kernel libraries: `emitter library` turns manifest instances + tuning tables into a
self-contained CMake project with a C API, dispatch by problem shape and a Python loader.

export.py    selection, tuning-table routing, rendering templates/library/ (the shared files) into the tree
pieces.py    asks each family for its part (library_pieces): the default family's always, the others' when selected
tuning.py    the other families' entries of a tuning table, by family
cli.py       the `library` click command

Each family's C API, tables, dispatch and loader functions are its own (emitter/families/<f>/library*.py,
templates/<f>/library/); the C ABI version and shared codes are the kit's (emitter/kit/library.py).
"""
