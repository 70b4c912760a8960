"""emitter.kit.prepare (the query / initialize steps the GEMM and attention profiler launches share) on a
scripted host shim: the sizes query() returns, the Params capacity asked for (and the one retry when the shim says
it needs more), refusals and errors with the family's messages, empty launches, and the shared memory allowed.
No GPU."""

from __future__ import annotations

import pytest

from emitter.kit import prepare
from emitter.runtime.backend import CannotImplement, LaunchFailed
from emitter.kit.launcher import PackedParams
from emitter.kit.shim import (EMITTER_BUFFER_TOO_SMALL, EMITTER_CANNOT_IMPLEMENT, EMITTER_INTERNAL_ERROR,
                                  EMITTER_OK, EmitterLaunch)


def _launch(grid=(4, 1, 1), block=(128, 1, 1), shared=1024, params_bytes=96, workspace=0) -> EmitterLaunch:
    out = EmitterLaunch()
    out.grid[:], out.block[:] = list(grid), list(block)
    out.shared_bytes, out.params_bytes, out.params_align, out.workspace_bytes = shared, params_bytes, 8, workspace
    return out


class Shim:
    """initialize() answers from a script: one (status, params, launch) per call; records the capacities asked."""

    def __init__(self, query=(EMITTER_OK, None), script=()):
        self._query = query
        self.script = list(script)
        self.calls: list[tuple] = []

    def query(self, prob):
        status, launch = self._query
        return status, launch if launch is not None else _launch(workspace=256)

    def initialize(self, prob, ws, stream, capacity):
        self.calls.append((prob, ws, stream, capacity))
        return self.script.pop(0)


class Fn:
    def __init__(self):
        self.shared: list[int] = []

    def allow_shared(self, n):
        self.shared.append(n)


def test_query_returns_the_sizes():
    q = prepare.query(Shim(query=(EMITTER_OK, _launch(params_bytes=40, workspace=512))), "P", "k", refusal="no")
    assert (q.params_bytes, q.workspace_bytes) == (40, 512)


@pytest.mark.parametrize("status,exc,message", [
    (EMITTER_CANNOT_IMPLEMENT, CannotImplement, "k_query: can_implement is false for 1x2x3"),
    (EMITTER_INTERNAL_ERROR, LaunchFailed, "emitter_k_query returned EMITTER_INTERNAL_ERROR"),
])
def test_query_refusal_and_error(status, exc, message):
    with pytest.raises(exc) as e:
        prepare.query(Shim(query=(status, _launch())), "P", "k", refusal="k_query: can_implement is false for 1x2x3")
    assert str(e.value) == message


def test_initialize_asks_for_the_queried_capacity_and_allows_the_shared_memory():
    shim, fn = Shim(script=[(EMITTER_OK, b"\1" * 96, _launch(grid=(7, 2, 1), block=(256, 1, 1), shared=4096))]), Fn()
    (grid, block, packed, shared), launch = prepare.initialize(shim, fn, "P", 0x1000, 5, _launch(params_bytes=96),
                                                               "k", refusal="no")
    assert shim.calls == [("P", 0x1000, 5, 96)]
    assert (grid, block, shared) == ((7, 2, 1), (256, 1, 1), 4096) and fn.shared == [4096]
    assert isinstance(packed, PackedParams) and packed.size == 96
    assert launch.shared_bytes == 4096


def test_initialize_capacity_is_at_least_64_bytes_and_retries_once_with_what_the_shim_needs():
    shim = Shim(script=[(EMITTER_BUFFER_TOO_SMALL, b"", _launch(params_bytes=300)),
                        (EMITTER_OK, b"\2" * 300, _launch(params_bytes=300))])
    (_, _, packed, _), _ = prepare.initialize(shim, Fn(), "P", 0, 5, _launch(params_bytes=8), "k", refusal="no")
    assert [c[3] for c in shim.calls] == [64, 300] and packed.size == 300


def test_initialize_too_small_without_a_larger_size_is_an_error_not_a_loop():
    shim = Shim(script=[(EMITTER_BUFFER_TOO_SMALL, b"", _launch(params_bytes=64))])
    with pytest.raises(LaunchFailed, match="^emitter_k_initialize returned EMITTER_BUFFER_TOO_SMALL$"):
        prepare.initialize(shim, Fn(), "P", 0, 5, _launch(params_bytes=64), "k", refusal="no")
    assert len(shim.calls) == 1


@pytest.mark.parametrize("answer,exc,message", [
    ((EMITTER_CANNOT_IMPLEMENT, b"", _launch()), CannotImplement, "initialize: can_implement is false for 8x8x8"),
    ((EMITTER_INTERNAL_ERROR, b"", _launch()), LaunchFailed, "emitter_k_initialize returned EMITTER_INTERNAL_ERROR"),
    ((EMITTER_OK, b"", _launch()), LaunchFailed, "emitter_k_initialize returned EMITTER_OK"),
    ((EMITTER_OK, b"\0" * 64, _launch(grid=(0, 1, 1))), LaunchFailed,
     "shim returned an empty launch: grid=(0, 1, 1) block=(128, 1, 1)"),
    ((EMITTER_OK, b"\0" * 64, _launch(block=(128, 0, 1))), LaunchFailed,
     "shim returned an empty launch: grid=(4, 1, 1) block=(128, 0, 1)"),
])
def test_initialize_refusals_and_errors(answer, exc, message):
    fn = Fn()
    with pytest.raises(exc) as e:
        prepare.initialize(Shim(script=[answer]), fn, "P", 0, 5, _launch(), "k",
                           refusal="initialize: can_implement is false for 8x8x8")
    assert str(e.value) == message and fn.shared == []
