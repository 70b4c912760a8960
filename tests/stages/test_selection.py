"""--select / --exclude: name globs, attribute terms, AND within a pattern, OR across --select."""

from __future__ import annotations

import click
import pytest
from click.testing import CliRunner

from emitter.selection import SelectionError, attributes, matches, parse, select, selection_options


def inst(name, arch="sm90a", **cfg):
    base = {"arch": arch, "a": "bf16", "b": "bf16", "c": "bf16", "d": "bf16", "layout_a": "row", "layout_b": "col",
            "layout_c": "row", "tile": [128, 256, 64], "cluster": [2, 1, 1], "warp": None, "stages": 0,
            "kernel_schedule": "cooperative", "epilogue": {"activation": "identity", "bias": "none"}, "batched": False}
    base.update(cfg)
    return {"name": name, "family": "gemm", "arch": arch, "source": f"{name}.cu", "config": base}


COOP = inst("gemm_sm90a_bf16_128x256x64_coop")
PING = inst("gemm_sm90a_bf16_64x128x64_pingpong", tile=[64, 128, 64], kernel_schedule="pingpong")
FP8 = inst("gemm_sm90a_e4m3_128x256x128_coop", a="e4m3", b="e4m3", tile=[128, 256, 128])
SM80 = inst("gemm_sm80_f16_128x128x32_relu", arch="sm80", a="f16", b="f16", c="f16", d="f16", tile=[128, 128, 32],
            cluster=None, warp=[64, 64, 32], stages=4, kernel_schedule="auto", layout_a="col",
            epilogue={"activation": "relu", "bias": "row"})
ALL = [COOP, PING, FP8, SM80]


def names(entries):
    return [e["name"] for e in entries]


def test_nothing_selected_means_everything():
    assert select(ALL) == ALL


def test_name_glob_and_substring():
    assert names(select(ALL, ["*128x256*"])) == [COOP["name"], FP8["name"]]
    assert names(select(ALL, ["pingpong"])) == [PING["name"]]          # a plain word is a substring
    assert names(select(ALL, ["gemm_sm80*"])) == [SM80["name"]]
    assert select(ALL, ["gemm_sm80"]) == [SM80]
    assert select(ALL, ["*nomatch*"]) == []


def test_attribute_terms():
    assert select(ALL, ["arch=sm80"]) == [SM80]
    assert select(ALL, ["tile=128x256x64"]) == [COOP]
    assert select(ALL, ["a=e4m3"]) == [FP8]
    assert select(ALL, ["kernel_schedule=pingpong"]) == [PING]
    assert select(ALL, ["schedule=pingpong"]) == [PING]                  # alias
    assert select(ALL, ["activation=relu"]) == [SM80]                    # nested key by its own name
    assert select(ALL, ["epilogue.bias=row"]) == [SM80]                  # or by its dotted path
    assert select(ALL, ["dtype=f16"]) == [SM80]                          # any of a/b/c/d
    assert select(ALL, ["layout=tn"]) == [COOP, PING, FP8]
    assert select(ALL, ["layout=nnt"]) == [SM80]
    assert select(ALL, ["cluster=none"]) == [SM80]
    assert select(ALL, ["stages=auto"]) == [COOP, PING, FP8]
    assert select(ALL, ["stages=4"]) == [SM80]
    assert select(ALL, ["batched=false"]) == ALL
    assert select(ALL, ["family=gemm"]) == ALL
    assert select(ALL, ["ARCH=SM80"]) == [SM80]                          # case-insensitive


def test_values_or_and_globs():
    assert select(ALL, ["tile=64x128x64,128x128x32"]) == [PING, SM80]
    assert select(ALL, ["tile=128x*"]) == [COOP, FP8, SM80]


def test_terms_in_one_pattern_and():
    assert select(ALL, ["arch=sm90a tile=128x256x64"]) == [COOP]
    assert select(ALL, ["*coop* a=e4m3"]) == [FP8]
    assert select(ALL, ["arch=sm80 a=bf16"]) == []


def test_repeated_select_ors_and_exclude_drops():
    assert select(ALL, ["arch=sm80", "schedule=pingpong"]) == [PING, SM80]
    assert select(ALL, ["arch=sm90a"], ["a=e4m3"]) == [COOP, PING]
    assert select(ALL, [], ["*coop*", "arch=sm80"]) == [PING]
    assert select(ALL, ["arch=sm90a"], ["arch=sm90a"]) == []


def test_unknown_key_is_an_error_not_an_empty_selection():
    with pytest.raises(SelectionError, match="tiel") as e:
        select(ALL, ["tiel=128x256x64"])
    assert "tile" in e.value.render() and e.value.exit_code == 2
    with pytest.raises(SelectionError):
        select(ALL, [], ["bogus=1"])


def test_malformed_patterns():
    for bad in ("", "   ", "=x", "tile="):
        with pytest.raises(SelectionError):
            parse(bad)
    assert matches(COOP, "arch=sm90a")
    assert not matches(COOP, parse("arch=sm80"))


def test_attributes_view():
    a = attributes(SM80)
    assert a["tile"] == ["128x128x32"] and a["arch"] == ["sm80"] and a["activation"] == ["relu"]
    assert "layout" in a and "dtype" in a


def test_shared_click_options():
    seen = {}

    @click.command()
    @selection_options
    def cmd(select, exclude):
        seen.update(select=select, exclude=exclude)

    res = CliRunner().invoke(cmd, ["--select", "arch=sm90a tile=128x256x64", "--select", "*sm80*",
                                   "--exclude", "a=e4m3"])
    assert res.exit_code == 0, res.output
    assert seen == {"select": ("arch=sm90a tile=128x256x64", "*sm80*"), "exclude": ("a=e4m3",)}
    res = CliRunner().invoke(cmd, [])
    assert seen == {"select": (), "exclude": ()}
