"""Fixed instances used by golden-file and manifest tests (spec text -> resolved instance)."""

import textwrap

from emitter.emit import resolve_specs

GOLDEN_SPECS = {
    "sm80": """
        arch: sm80
        dtype: {a: f16, b: f16, c: f16, d: f16, accumulator: f32}
        layout: tn
        tile: 128x128x32
        warp: 64x64x32
        stages: 4
        swizzle: 8
        epilogue: relu
    """,
    "sm90a": """
        arch: sm90a
        dtype: {a: bf16, b: bf16, c: bf16, d: bf16, accumulator: f32}
        layout: tn
        tile: 128x256x64
        cluster: 2x1x1
        schedule: {kernel: cooperative, tile_scheduler: persistent}
    """,
}


def resolve_text(tmp_path, text: str, name: str = "golden.yaml"):
    p = tmp_path / name
    p.write_text(textwrap.dedent(text))
    resolved, rejected, _specs, _dups = resolve_specs([p])
    return resolved, rejected
