"""The run-time attention problem: sizes, scale, layout/strides, variable lengths; can-implement reasons;
the `--problem` string parser.

    b=2,hq=16,hkv=4,sq=1000,sk=1000,d=128            fixed lengths (dv = d unless given)
    b=3,hq=8,hkv=2,lq=100:37:5,lk=120:37:1,d=64      variable lengths (cu_seqlens), one length per sequence
    keys: b|batch, hq|heads_q|h, hkv|heads_kv, sq|seq_q, sk|seq_k, s (both), d|head_dim, dv|head_dim_v,
          scale (0 = 1/sqrt(d)), layout (bshd|bhsd), lq|seqlens_q, lk|seqlens_k, pad (extra elements per row)

Memory (attention_abi.h): the head dim is contiguous; (batch, seq, head) strides come from the layout
(bshd: [B, S, H, D]; bhsd: [B, H, S, D]); varlen tensors are packed [total, H, D] (bshd) or [H, total, D]
(bhsd) with stride_batch 0. LSE is f32 [B, Hq, Sq] (varlen: [Hq, total_q]).
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar, Mapping

from emitter.errors import SpecError

LAYOUTS = ("bshd", "bhsd")
MAX_DIM = 1 << 24


@dataclass(frozen=True)
class AttentionProblem:
    FAMILY: ClassVar[str] = "attention"   # the stages find the family's hooks through it

    batch: int
    heads_q: int
    heads_kv: int
    seq_q: int                      # fixed: every sequence's; varlen: the longest (computed)
    seq_k: int
    head_dim: int
    head_dim_v: int
    scale: float = 0.0              # 0 = 1/sqrt(head_dim)
    layout: str = "bshd"
    seqlens_q: tuple[int, ...] | None = None   # varlen only: one length per sequence
    seqlens_k: tuple[int, ...] | None = None
    # extra elements in every row of each tensor (not packed: bshd seq stride heads*dim + pad, bhsd seq stride
    # dim + pad; LSE head stride seq + pad). Padding holds poison: a kernel that writes it (stray writes) or
    # reads it (NaN) is caught. 0 = packed.
    pad: int = 0
    # the mask the problem asks for (`--problem ...,causal` / `causal=0`): None = the instance's own mask
    # (verify's default problems); True = causal (top-left, torch SDPA's is_causal; bottom-right instances
    # too when seq_q = seq_k), False = no mask. A problem an instance's mask does not match is SKIPPED.
    causal: bool | None = None

    # ---------------------------------------------------------------- derived
    @property
    def varlen(self) -> bool:
        return self.seqlens_q is not None

    @property
    def softmax_scale(self) -> float:
        return self.scale if self.scale != 0.0 else 1.0 / math.sqrt(self.head_dim)

    @property
    def group(self) -> int:
        return self.heads_q // self.heads_kv

    def lengths(self) -> list[tuple[int, int]]:
        """(seq_q, seq_k) of every sequence."""
        if self.varlen:
            return list(zip(self.seqlens_q, self.seqlens_k))
        return [(self.seq_q, self.seq_k)] * self.batch

    @property
    def total_q(self) -> int:
        return sum(self.seqlens_q) if self.varlen else 0

    @property
    def total_k(self) -> int:
        return sum(self.seqlens_k) if self.varlen else 0

    def cu_seqlens(self) -> tuple[list[int], list[int]]:
        cq, ck = [0], [0]
        for a, b in self.lengths():
            cq.append(cq[-1] + a)
            ck.append(ck[-1] + b)
        return cq, ck

    def rows(self, which: str) -> int:
        """Rows along the seq axis of one batch entry's tensor ('q' or 'k'): packed total when varlen."""
        if which == "q":
            return self.total_q if self.varlen else self.seq_q
        return self.total_k if self.varlen else self.seq_k

    def strides(self) -> dict[str, tuple[int, ...]]:
        """Element strides: q/k/v/o -> (batch, seq, head); lse -> (batch, head). Packed unless `pad`."""
        out: dict[str, tuple[int, ...]] = {}
        for name, heads, rows, dim in (("q", self.heads_q, self.rows("q"), self.head_dim),
                                       ("k", self.heads_kv, self.rows("k"), self.head_dim),
                                       ("v", self.heads_kv, self.rows("k"), self.head_dim_v),
                                       ("o", self.heads_q, self.rows("q"), self.head_dim_v)):
            if self.layout == "bshd":
                ss = heads * dim + self.pad
                out[name] = (0 if self.varlen else rows * ss, ss, dim)
            else:
                ss = dim + self.pad
                out[name] = (0 if self.varlen else heads * rows * ss, ss, rows * ss)
        lrow = self.rows("q") + self.pad
        out["lse"] = (0, lrow) if self.varlen else (self.heads_q * lrow, lrow)
        return out

    def elements(self) -> dict[str, int]:
        """Elements of each buffer (with the padding)."""
        bq = 1 if self.varlen else self.batch
        out = {}
        for name, heads, rows, dim in (("q", self.heads_q, self.rows("q"), self.head_dim),
                                       ("k", self.heads_kv, self.rows("k"), self.head_dim),
                                       ("v", self.heads_kv, self.rows("k"), self.head_dim_v),
                                       ("o", self.heads_q, self.rows("q"), self.head_dim_v)):
            per = rows * (heads * dim + self.pad) if self.layout == "bshd" else heads * rows * (dim + self.pad)
            out[name] = bq * per
        out["lse"] = bq * self.heads_q * (self.rows("q") + self.pad)
        return out

    def label(self) -> str:
        parts = [f"b{self.batch}", f"h{self.heads_q}x{self.heads_kv}"]
        if self.varlen:
            parts.append("lq" + "-".join(map(str, self.seqlens_q)))
            parts.append("lk" + "-".join(map(str, self.seqlens_k)))
        else:
            parts.append(f"s{self.seq_q}x{self.seq_k}")
        parts.append(f"d{self.head_dim}" + (f"v{self.head_dim_v}" if self.head_dim_v != self.head_dim else ""))
        if self.scale:
            parts.append(f"sc{self.scale:g}")
        parts.append(self.layout)
        if self.pad:
            parts.append(f"pad{self.pad}")
        if self.causal is not None:
            parts.append("causal" if self.causal else "full")
        text = "_".join(parts)
        return re.sub(r"[^A-Za-z0-9_.+-]", "", text)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        for k in ("seqlens_q", "seqlens_k"):
            if d[k] is not None:
                d[k] = list(d[k])
        if d["causal"] is None:
            del d["causal"]
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "AttentionProblem":
        fields = {"batch", "heads_q", "heads_kv", "seq_q", "seq_k", "head_dim", "head_dim_v", "scale", "layout",
                  "seqlens_q", "seqlens_k", "pad", "causal"}
        d = {k: v for k, v in d.items() if k in fields}   # a result record also holds label, data, source
        if d.get("seqlens_q") is not None:                # varlen: batch and max lengths follow from the lengths
            d.pop("seq_q", None)
            d.pop("seq_k", None)
        for k in ("seqlens_q", "seqlens_k"):
            if d.get(k) is not None:
                d[k] = tuple(int(x) for x in d[k])
        return make_problem(**d)


class ProblemError(ValueError):
    """A malformed problem (sizes out of range, inconsistent varlen lengths)."""


def make_problem(*, batch: int | None = None, heads_q: int, heads_kv: int | None = None, seq_q: int | None = None,
                 seq_k: int | None = None, head_dim: int, head_dim_v: int | None = None, scale: float = 0.0,
                 layout: str = "bshd", seqlens_q=None, seqlens_k=None, pad: int = 0,
                 causal: bool | None = None) -> AttentionProblem:
    """A checked problem (ProblemError naming the field). Varlen: give seqlens_q and seqlens_k; batch and the
    max lengths follow from them."""
    heads_kv = heads_q if heads_kv is None else heads_kv
    head_dim_v = head_dim if head_dim_v is None else head_dim_v
    for name, v in (("heads_q", heads_q), ("heads_kv", heads_kv), ("head_dim", head_dim), ("head_dim_v", head_dim_v)):
        if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= MAX_DIM:
            raise ProblemError(f"{name}={v!r}: a positive integer is expected")
    if heads_q % heads_kv:
        raise ProblemError(f"heads_kv={heads_kv} does not divide heads_q={heads_q}: KV heads are shared by groups of "
                           f"query heads (GQA), so heads_q must be a multiple of heads_kv")
    if layout not in LAYOUTS:
        raise ProblemError(f"layout={layout!r}: use one of {', '.join(LAYOUTS)}")
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(scale) or scale < 0:
        raise ProblemError(f"scale={scale!r}: a finite number >= 0 is expected (0 = 1/sqrt(head_dim))")
    if isinstance(pad, bool) or not isinstance(pad, int) or not 0 <= pad <= 4096:
        raise ProblemError(f"pad={pad!r}: an integer 0..4096 (extra elements per row) is expected")
    if causal is not None and not isinstance(causal, bool):
        raise ProblemError(f"causal={causal!r}: true or false is expected (leave it out: the instance's mask)")
    if (seqlens_q is None) != (seqlens_k is None):
        raise ProblemError("variable lengths need both seqlens_q and seqlens_k")
    if seqlens_q is not None:
        lq, lk = tuple(seqlens_q), tuple(seqlens_k)
        if not lq or len(lq) != len(lk):
            raise ProblemError(f"seqlens_q has {len(lq)} lengths, seqlens_k {len(lk)}: give one of each per sequence")
        for name, ls in (("seqlens_q", lq), ("seqlens_k", lk)):
            if any(isinstance(x, bool) or not isinstance(x, int) or not 0 <= x <= MAX_DIM for x in ls):
                raise ProblemError(f"{name}={list(ls)}: lengths are integers >= 0")
        if max(lq) < 1:
            raise ProblemError("seqlens_q: at least one sequence needs a query")
        if batch is not None and batch != len(lq):
            raise ProblemError(f"batch={batch} but {len(lq)} sequence lengths")
        return AttentionProblem(len(lq), heads_q, heads_kv, max(lq), max(max(lk), 1), head_dim, head_dim_v,
                                float(scale), layout, lq, lk, pad, causal)
    for name, v in (("batch", batch), ("seq_q", seq_q), ("seq_k", seq_k)):
        if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= MAX_DIM:
            raise ProblemError(f"{name}={v!r}: a positive integer is expected")
    return AttentionProblem(batch, heads_q, heads_kv, seq_q, seq_k, head_dim, head_dim_v, float(scale), layout,
                            pad=pad, causal=causal)


# ------------------------------------------------------------------------------------- can implement
def not_supported_reasons(inst, p: AttentionProblem) -> list[str]:
    """Why instance `inst` (an AttentionInstance) cannot run problem `p`; [] when it can. Mirrors the host
    shim's checks (templates/attention/sm80/device.cu.j2) so a case is SKIPPED with a reason."""
    out = []
    if p.head_dim != inst.head_dim or p.head_dim_v != inst.head_dim_v:
        out.append(f"head dims {p.head_dim}/{p.head_dim_v}: the instance is compiled for {inst.head_dim}/{inst.head_dim_v}")
    if p.heads_kv != p.heads_q and not inst.gqa:
        out.append(f"heads_kv={p.heads_kv} != heads_q={p.heads_q}: the instance is not a GQA instance (gqa: false)")
    if p.varlen != inst.varlen:
        out.append("variable lengths (cu_seqlens) need a varlen instance" if p.varlen
                   else "a varlen instance runs only cu_seqlens problems")
    why = mask_mismatch(getattr(inst.mask, "value", inst.mask), p)
    if why:
        out.append(why)
    if not inst.key_tail and any(sk % inst.tile_kv for _, sk in p.lengths()):
        out.append(f"seq_k not a multiple of tile_kv={inst.tile_kv} and the instance has key_tail false")
    # the sm80 kernel's 32-bit row offsets
    if getattr(inst.arch, "yaml", inst.arch) == "sm80":
        s = p.strides()
        for name, rows in (("q", p.seq_q), ("k", p.seq_k), ("v", p.seq_k), ("o", p.seq_q)):
            if s[name][1] * rows >= 2 ** 31:
                out.append(f"{name}: seq {rows} x row stride {s[name][1]} does not fit the kernel's 32-bit offsets")
        if p.heads_q > 65535 or p.batch > 65535:
            out.append("heads_q and batch must be <= 65535 (grid y/z)")
    # sm90a (templates/attention/sm90a/device.cu.j2): any seq_q / seq_k; TMA wants 16-byte strides (padded rows)
    if getattr(inst.arch, "yaml", inst.arch) == "sm90a":
        s = p.strides()
        for name in ("q", "k", "v", "o"):
            bad = [x for i, x in enumerate(s[name]) if not (p.varlen and i == 0) and x * inst.dtype.bits % 128]
            if bad:
                out.append(f"{name}: stride {bad[0]} elements is not a multiple of 16 bytes (sm90a TMA)")
    return out


def mask_mismatch(mask: str, p: AttentionProblem) -> str | None:
    """Why an instance with `mask` (a Mask value) does not compute the mask problem `p` asks for, or None."""
    if p.causal is None:
        return None
    if not p.causal:
        return None if mask == "none" else f"the problem asks for no mask; the instance's mask is {mask}"
    if mask == "causal_top_left":
        return None
    if mask == "causal_bottom_right":
        if all(sq == sk for sq, sk in p.lengths()):
            return None
        return ("the problem asks for causal from the top-left (torch's is_causal) with seq_q != seq_k; the "
                "instance's mask is causal_bottom_right")
    return f"the problem asks for a causal mask; the instance's mask is {mask}"


def visible_keys(mask: str, sq: int, sk: int, i: int) -> int:
    """How many keys (a prefix 0..n-1) query row i of a (sq, sk) sequence sees under `mask` (a Mask value)."""
    if mask == "none":
        return sk
    limit = i + 1 if mask == "causal_top_left" else i + 1 + sk - sq
    return max(0, min(sk, limit))


# ------------------------------------------------------------------------------------- parsing
_KEYS = {
    "b": "batch", "batch": "batch", "hq": "heads_q", "heads_q": "heads_q", "h": "heads_q",
    "hkv": "heads_kv", "heads_kv": "heads_kv", "sq": "seq_q", "seq_q": "seq_q", "sk": "seq_k", "seq_k": "seq_k",
    "s": "s", "d": "head_dim", "head_dim": "head_dim", "dv": "head_dim_v", "head_dim_v": "head_dim_v",
    "scale": "scale", "layout": "layout", "lq": "seqlens_q", "seqlens_q": "seqlens_q", "lk": "seqlens_k",
    "seqlens_k": "seqlens_k", "pad": "pad", "causal": "causal", "mask": "causal",
}
PROBLEM_KEYS = tuple(sorted(set(_KEYS.values()) - {"s"}))


def _int_text(text: str) -> int:
    if not re.fullmatch(r"\d{1,9}", text):
        raise ValueError(text)
    return int(text)


def parse_problem_text(text: str) -> dict[str, Any]:
    """`b=2,hq=16,hkv=4,sq=1000,sk=1000,d=128` -> keyword arguments of make_problem (ValueError on bad text)."""
    if not isinstance(text, str) or not text.strip():
        raise ValueError("an empty problem")
    out: dict[str, Any] = {}
    for part in text.split(","):
        if part.strip().lower() in ("causal", "full"):     # a bare mask word
            part = f"causal={int(part.strip().lower() == 'causal')}"
        if "=" not in part:
            raise ValueError(f"'{part.strip()}' is not key=value")
        key, value = (x.strip() for x in part.split("=", 1))
        canon = _KEYS.get(key.lower())
        if canon is None:
            raise ValueError(f"unknown key '{key}' (known: {', '.join(sorted(_KEYS))})")
        try:
            if canon in ("seqlens_q", "seqlens_k"):
                v: Any = tuple(_int_text(x.strip()) for x in re.split(r"[:/ ]", value) if x.strip())
            elif canon == "scale":
                v = float(value)
            elif canon == "layout":
                v = value.lower()
            elif canon == "causal":
                words = {"1": True, "true": True, "causal": True, "yes": True, "0": False, "false": False,
                         "none": False, "full": False, "no": False}
                v = words[value.lower()]
            else:
                v = _int_text(value)
        except (ValueError, KeyError):
            raise ValueError(f"{key}={value!r} is not a valid value") from None
        if canon == "s":
            out.setdefault("seq_q", v)
            out.setdefault("seq_k", v)
            continue
        if canon in out:
            raise ValueError(f"'{key}' is given twice")
        out[canon] = v
    return out


def parse_problem(text: str, where: str = "<command line>") -> AttentionProblem:
    """A checked problem from a problem string; SpecError (exit code 2) naming the text and the fix."""
    try:
        return make_problem(**parse_problem_text(text))
    except (ValueError, TypeError) as e:
        msg = str(e)
        if isinstance(e, TypeError):
            msg = "missing keys: hq (heads_q) and d (head_dim) are required, and b/sq/sk (or lq/lk)"
        raise SpecError(f"bad attention problem {text!r}: {msg}", file=where, value=text,
                        allowed="b=2,hq=16,hkv=4,sq=1000,sk=1000,d=128[,dv=64][,scale=0.125][,layout=bhsd]; "
                                "varlen: lq=100:37,lk=120:40 instead of b/sq/sk",
                        fix="write the problem as comma-separated key=value pairs") from None


__all__ = ["AttentionProblem", "ProblemError", "make_problem", "not_supported_reasons", "visible_keys", "mask_mismatch",
           "parse_problem", "parse_problem_text", "PROBLEM_KEYS", "LAYOUTS"]
