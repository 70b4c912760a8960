"""The conv family on the shared spec and launch helpers (emitter/spec/points.py, values.py, emitter/kit/prepare.py).

Conv's spec parser sweeps, excludes and reports unknown keys through emitter.spec.points as the GEMM and attention
parsers do, and ConvLaunch prepares its launches through emitter.kit.prepare. The messages are conv's own
("a conv spec", the conv example, "<kernel>: can_implement is false for <problem>"); the two edge cases the shared
helpers add are pinned here: the running number of exclude points is capped like a sweep, and so is the matching
work (combinations x exclude points)."""

from __future__ import annotations

import textwrap
import time
import types

import pytest

from emitter.emit import spec_entries
from emitter.errors import SpecError
from emitter.families.conv.spec import expand_entry
from emitter.spec import points
from emitter.spec.loader import parse_text
from emitter.spec.sweep import sweep_limit
from tests.hostile_helpers import assert_clean, cli
from tests.stages.test_workspace_parity import _Device, _Stream

SM90 = "family: conv\narch: sm90a\nop: fprop\ndtype: f16\ntile: 128x128x64\n"


def expand(text: str) -> list:
    doc = parse_text(textwrap.dedent(text), "c.yaml")
    out = []
    for path, entry, key_paths in spec_entries(doc):
        out += [inst for inst, _ in expand_entry(doc, path, entry, key_paths)]
    return out


def error(text: str, limit: int | None = None) -> SpecError:
    with sweep_limit(limit), pytest.raises(SpecError) as e:
        expand(text)
    return e.value


# ------------------------------------------------------------------------------------------------ spec
def test_unknown_keys_name_a_conv_spec_in_the_spec_and_in_an_exclude_entry():
    for text, key_path in ((SM90 + "tilee: 1x1x1\n", "tilee"), (SM90 + "exclude: [{tilee: 1x1x1}]\n",
                                                                 "exclude[0].tilee")):
        err = error(text)
        assert "unknown key 'tilee' in a conv spec" in str(err) and err.key_path == key_path and err.line == 6
        assert err.fix == "did you mean 'tile'?" and "stride_support" in err.allowed and "exclude" in err.allowed


def test_a_bad_exclude_value_gets_the_conv_example():
    err = error(SM90 + "exclude: 3\n")
    assert "exclude must be a list of partial configurations" in str(err)
    assert err.fix == "e.g. exclude: [{op: wgrad, tile: 256x128x64}]"
    err = error(SM90 + "exclude: [{}]\n")
    assert "each exclude entry must be a non-empty mapping of spec keys" in str(err) and err.key_path == "exclude[0]"


def test_sweep_cap_names_this_spec_and_comes_before_the_dims_layout_check():
    err = error(SM90 + "dims: 2\nlayout: nhwc\nstages: [2, 3, 4]\nswizzle: [1, 2, 4, 8]\n", limit=10)
    assert "this spec sweeps 12 combinations: stages (3) x swizzle (4)" in str(err)
    err = error(SM90 + "dims: 2\nlayout: nhwc\n")
    assert "give either dims or layout, not both" in str(err) and err.key_path == "layout"


def test_one_exclude_entry_over_the_cap_names_the_exclude_list():
    err = error(SM90 + "exclude: [{stages: [2, 3, 4], swizzle: [1, 2, 4, 8]}]\n", limit=10)
    assert "the exclude list sweeps 12 combinations: exclude[0].stages (3) x exclude[0].swizzle (4)" in str(err)


def test_an_exclude_entry_may_give_dims_and_layout_and_a_sweep_drops_each_of_its_points():
    assert len(expand(SM90 + "dims: [2, 3]\nexclude: [{dims: 2, layout: nhwc}]\n")) == 1
    # the swept entry drops both points: nothing would be left, which is an error rather than an empty emit
    err = error(SM90 + "dims: [2, 3]\nexclude: [{dims: [2, 3]}]\n")
    assert "drops every one of the 2 combinations" in str(err) and err.key_path == "exclude[0]"


def test_the_running_number_of_exclude_points_is_capped_like_a_sweep():
    """New with the shared helper (GEMM and attention do the same): entries each under the cap that add up past it
    are an error at the exclude key, where before they were expanded without a bound."""
    text = SM90 + "exclude:\n  - {stages: [2, 3, 4, 5, 6]}\n  - {stages: [7, 8, 9, 10, 11], swizzle: [1, 2]}\n"
    err = error(text, limit=10)
    assert "the exclude list sweeps 15 combinations: exclude (15)" in str(err)
    assert err.key_path == "exclude" and err.line == 7 and err.exit_code == 2 and "--max-instances" in err.fix
    assert len(expand(text)) == 1          # under the default cap: the spec's one point, not excluded


def test_exclude_matching_work_is_bounded(monkeypatch):
    """New with the shared helper (as GEMM): combinations x exclude points over points.EXCLUDE_WORK is an error
    before anything is matched."""
    monkeypatch.setattr(points, "EXCLUDE_WORK", 10)
    text = SM90 + "stages: [2, 3, 4]\nexclude: [{stages: 2}, {stages: 3}, {swizzle: 2}, {swizzle: 4}]\n"
    err = error(text)
    assert "4 exclude entries against 3 combinations is too much matching (12 comparisons)" in str(err)
    assert err.key_path == "exclude" and err.allowed == "combinations x exclude entries up to 10"
    monkeypatch.setattr(points, "EXCLUDE_WORK", 12)
    assert len(expand(text)) == 1


def test_exclude_matching_work_is_bounded_end_to_end(tmp_path):
    """64,800 combinations against 135 exclude entries (8.7 M comparisons): exit 2 at once, no traceback."""
    big = {"stages": list(range(2, 17)), "swizzle": [1, 2, 4, 8], "alignment": [1, 2, 4, 8, 16],
           "split_k": ["none", "serial", "parallel"], "iterator": ["analytic", "optimized"],
           "kernel": ["implicit", "gemm_1x1"], "schedule": ["auto", "cooperative", "pingpong"],
           "scheduler": ["auto", "persistent", "stream_k"], "swap_ab": ["false", "true"]}
    excl = [f"{{stages: {s}, swizzle: {w}, dims: 2}}" for s in range(2, 17) for w in (1, 2, 4, 8)]
    excl += [f"{{stages: {s}, alignment: {a}, dims: 2}}" for s in range(2, 17) for a in (1, 2, 4, 8, 16)]
    spec = tmp_path / "s.yaml"
    spec.write_text(SM90 + "".join(f"{k}: [{', '.join(map(str, v))}]\n" for k, v in big.items())
                    + f"exclude: [{', '.join(excl)}]\n")
    t0 = time.perf_counter()
    code, out = cli("emit", spec, "-o", tmp_path / "o")
    assert time.perf_counter() - t0 < 10
    assert_clean(code, out, "135 exclude entries against 64,800 combinations is too much matching",
                 "key:     exclude")


# ------------------------------------------------------------------------------------------------ launch
class _Shim:
    """A host shim whose answers a test sets: query / initialize statuses, the Params size initialize needs, grid."""

    def __init__(self, query_status: int = 0, init_status: int = 0, needs: int = 8, grid=(4, 1, 1),
                 workspace: int = 0) -> None:
        self.query_status, self.init_status, self.needs, self.grid = query_status, init_status, needs, grid
        self.workspace, self.capacities = workspace, []

    def _launch(self, params_bytes: int):
        from emitter.kit.shim import EmitterLaunch

        out = EmitterLaunch()
        out.grid[:] = list(self.grid)
        out.block[:] = [128, 1, 1]
        out.shared_bytes = 4096
        out.params_bytes, out.params_align, out.workspace_bytes = params_bytes, 8, self.workspace
        return out

    def query(self, prob):
        return self.query_status, self._launch(0)

    def initialize(self, prob, ws, stream, capacity):
        from emitter.kit.shim import EMITTER_BUFFER_TOO_SMALL

        self.capacities.append(capacity)
        if self.init_status:
            return self.init_status, b"", self._launch(self.needs)
        if capacity < self.needs:
            return EMITTER_BUFFER_TOO_SMALL, b"", self._launch(self.needs)
        return 0, bytes(self.needs), self._launch(self.needs)


class _Fn:
    def __init__(self) -> None:
        self.shared: list[int] = []

    def allow_shared(self, n: int) -> None:
        self.shared.append(n)

    def launch(self, grid, block, shared, stream, packed) -> None:
        pass


@pytest.fixture(scope="module")
def conv_entry(tmp_path_factory):
    from emitter.emit import emit
    from emitter.manifest import load

    out = tmp_path_factory.mktemp("conv")
    (out / "spec.yaml").write_text("kernels:\n  - {family: conv, arch: sm80, op: fprop, dtype: f16, "
                                   "tile: 128x128x32, warp: 64x64x32, stages: 3}\n")
    emit([out / "spec.yaml"], out / "k")
    (entry,) = load(out / "k")["instances"]
    return entry


def _launch(monkeypatch, conv_entry, shim: _Shim, fn: _Fn | None = None, sets: int = 2):
    from emitter.families.conv import profile as cp
    from emitter.families.conv import runtime as hooks
    from emitter.profile.config import problems_from_text

    _Device().install(monkeypatch)      # a simulated pycuda.driver
    cc = hooks.config_from_entry(conv_entry)
    (problem,) = problems_from_text(["n=8,h=28,w=28,c=64,k=64,r=3,s=3,pad=1"], families=["conv"])
    data = cp.ConvProfileData(hooks.profile_op(cc), problem, 1.0, 0.0,
                              [cp.ConvSet(x=1 << 20, w=2 << 20, y=3 << 20) for _ in range(sets)], arena=None)
    kernel = types.SimpleNamespace(name="kconv", config=cc, handle={"shim": shim, "fn": fn or _Fn()})
    return cp.kernel_launch(kernel, data, _Stream(), split_k=1, options=0), problem.key


def test_conv_launch_prepares_every_set_through_the_shared_helper(monkeypatch, conv_entry):
    fn = _Fn()
    launch, _ = _launch(monkeypatch, conv_entry, _Shim(needs=8), fn, sets=3)
    assert len(launch.launches) == 3 and fn.shared == [4096] * 3
    grid, block, packed, shared = launch.launches[0]
    assert grid == (4, 1, 1) and block == (128, 1, 1) and shared == 4096 and packed.data() == bytes(8)
    assert launch.info["split_k"] == 1 and launch.info["grid"] == [4, 1, 1]
    assert launch.resets == [None] * 3 and launch.info["workspace_reset_mode"] == "library"


def test_conv_launch_asks_again_with_the_params_size_the_shim_needs(monkeypatch, conv_entry):
    shim = _Shim(needs=200)
    launch, _ = _launch(monkeypatch, conv_entry, shim, sets=1)
    assert shim.capacities == [64, 200] and launch.launches[0][2].data() == bytes(200)


def test_conv_launch_refusals_keep_their_messages(monkeypatch, conv_entry):
    from emitter.runtime.backend import CannotImplement, LaunchFailed
    from emitter.kit.shim import EMITTER_CANNOT_IMPLEMENT

    key = "n8_h28_w28_c64_k64_r3s3_pad0x1x1_0x1x1_str1x1x1_dil1x1x1"
    with pytest.raises(CannotImplement) as e:
        _launch(monkeypatch, conv_entry, _Shim(query_status=EMITTER_CANNOT_IMPLEMENT))
    assert str(e.value) == f"kconv: can_implement is false for {key}"
    with pytest.raises(CannotImplement) as e:
        _launch(monkeypatch, conv_entry, _Shim(init_status=EMITTER_CANNOT_IMPLEMENT))
    assert str(e.value) == f"kconv: initialize: can_implement is false for {key}"
    with pytest.raises(LaunchFailed, match=r"^emitter_kconv_query returned "):
        _launch(monkeypatch, conv_entry, _Shim(query_status=99))
    with pytest.raises(LaunchFailed, match=r"^emitter_kconv_initialize returned "):
        _launch(monkeypatch, conv_entry, _Shim(init_status=99))
    with pytest.raises(LaunchFailed, match=r"^shim returned an empty launch: grid=\(0, 1, 1\) block=\(128, 1, 1\)$"):
        _launch(monkeypatch, conv_entry, _Shim(grid=(0, 1, 1)))
