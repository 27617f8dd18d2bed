"""MLA decode task: oracle inputs, seed and our split-KV kernel under the Triton CPU interpreter."""

import dataclasses
import inspect
import json
import math
import os
import subprocess
import sys

import pytest
import torch

from task_modules import KERNELS, load, spec

REF = load("mla_decode", "reference")
SEED = load("mla_decode", "seed")
OURS = load("mla_decode", "mla_splitkv")
BASE = load("mla_decode", "baseline")
TASK = spec("mla_decode")
# fp32 inputs in the interpreter make every implementation exact to rounding, far tighter than the task's
# bf16-calibrated tolerances, so a merge or masking slip cannot hide under them.
TIGHT = 1e-5


def rel_rms(out: torch.Tensor, ref: torch.Tensor) -> float:
    out, ref = out.double(), ref.double()
    assert torch.isfinite(out).all(), "non-finite output"
    return ((out - ref).pow(2).mean().sqrt() / ref.pow(2).mean().sqrt()).item()


def _inputs(seed: int = 0, **params) -> dict:
    return REF.make_inputs({"dtype": "float32", **params}, seed, "cpu")


RAGGED = {"B": 3, "H": 5, "N": 97, "lengths": "ragged"}


def test_task_toml_matches_folder_and_outputs():
    assert TASK["name"] == (KERNELS / "mla_decode").name
    assert TASK["outputs"] == ["o", "lse"]
    assert set(TASK["tolerance"]["per_output"]) == {"o", "lse"}
    scales = {s["params"].get("scale_dim", 192) for k in ("cpu", "heldout", "heldout_cpu")
              for s in TASK["shapes"][k]}
    assert {192, 576} <= scales, "held-out shapes must use a second sm_scale"


def test_ragged_lengths_pin_edge_cases_and_are_deterministic():
    a = _inputs(3, B=6, H=2, N=8191, lengths="ragged")
    b = _inputs(3, B=6, H=2, N=8191, lengths="ragged")
    lens = a["cache_seqlens"]
    assert lens.dtype == torch.int32
    assert lens[0] == 1 and lens[1] == 8191
    assert ((lens >= 1) & (lens <= 8191)).all()
    assert not ((lens % 16 == 0) & (lens > 1)).any()
    assert torch.equal(a["q"], b["q"]) and torch.equal(lens, b["cache_seqlens"])
    assert a["sm_scale"] == pytest.approx(192 ** -0.5)


def test_oracle_ignores_rows_past_the_length():
    inputs = _inputs(1, **RAGGED)
    o, lse = REF.forward(**inputs)
    inputs["kv_cache"][0, 1:] = 1e4  # row 0 has length 1
    o2, lse2 = REF.forward(**inputs)
    assert torch.equal(o[0], o2[0]) and torch.equal(lse[0], lse2[0])
    # A length-1 row attends to its only key: o is that latent and lse its scaled score.
    c0 = inputs["kv_cache"][0, 0].double()
    assert torch.allclose(o[0].double(), c0[:512].expand(5, 512).float().double(), atol=1e-6)
    expect = (inputs["q"][0].double() @ c0) * inputs["sm_scale"]
    assert torch.allclose(lse[0].double(), expect, atol=1e-4)


@pytest.mark.parametrize("impl", ["seed", "ours", "baseline"])
@pytest.mark.parametrize("params", [{"B": 2, "H": 4, "N": 37}, {**RAGGED, "scale_dim": 576},
                                    {"B": 1, "H": 3, "N": 1}])
def test_matches_oracle(impl, params):
    fn = {"seed": SEED.forward, "ours": OURS.forward, "baseline": BASE.forward}[impl]
    inputs = _inputs(2, **params)
    ref_o, ref_lse = REF.forward(**inputs)
    o, lse = fn(**inputs)
    assert o.shape == ref_o.shape and o.dtype == inputs["q"].dtype
    assert lse.shape == ref_lse.shape and lse.dtype == torch.float32
    assert rel_rms(o, ref_o) <= TIGHT
    assert rel_rms(lse, ref_lse) <= TIGHT


@pytest.mark.parametrize("impl", ["seed", "ours"])
def test_scale_is_used_not_assumed(impl):
    fn = {"seed": SEED.forward, "ours": OURS.forward}[impl]
    inputs = _inputs(4, B=2, H=4, N=40)
    results = []
    for scale in (192 ** -0.5, 576 ** -0.5):
        inputs["sm_scale"] = scale
        ref_o, ref_lse = REF.forward(**inputs)
        o, lse = fn(**inputs)
        assert rel_rms(o, ref_o) <= TIGHT and rel_rms(lse, ref_lse) <= TIGHT
        results.append(lse)
    assert not torch.allclose(results[0], results[1])


@pytest.mark.parametrize("forced, expect", [(1, 1), (2, 2), (4, 4), (64, 4)])
def test_split_paths(forced, expect, monkeypatch):
    """BLOCK_N=32 over N=97 gives 4 tiles: 1 is the single-split path, the rest merge, 64 is capped to 4."""
    monkeypatch.setitem(OURS.CONFIG, "BLOCK_N", 32)
    inputs = _inputs(5, **RAGGED)
    splits, _ = OURS.split_plan(3, 5, 97, torch.device("cpu"), forced, block_n=32)
    assert splits == expect
    ref_o, ref_lse = REF.forward(**inputs)
    o, lse = OURS.forward(**inputs, num_splits=forced)
    assert rel_rms(o, ref_o) <= TIGHT and rel_rms(lse, ref_lse) <= TIGHT


@pytest.mark.parametrize("merge_heads", [1, 4])
def test_empty_splits_are_never_merged(merge_heads, monkeypatch):
    """Row 0 has length 1, so splits 1-3 are empty there; NaN scratch would leak into o or lse if merged.

    With 4 (batch, head) rows per merge program, rows of different lengths share a program and the last of the
    15 rows' groups is partial: each row must still use its own length.
    """
    monkeypatch.setitem(OURS.CONFIG, "BLOCK_N", 32)
    monkeypatch.setitem(OURS.CONFIG, "MERGE_HEADS", merge_heads)
    inputs = _inputs(6, **RAGGED)
    b, h = 3, 5
    splits, split_len = OURS.split_plan(b, h, 97, torch.device("cpu"), 4, block_n=32)
    assert splits == 4 and inputs["cache_seqlens"][0] <= split_len
    o = torch.full((b, h, 512), math.nan)
    lse = torch.full((b, h), math.nan)
    o_part, lse_part = OURS.partial_buffers(b, h, splits, torch.device("cpu"))
    o_part.fill_(math.nan)
    lse_part.fill_(math.nan)
    OURS.attend_into(**inputs, o=o, lse=lse, o_part=o_part, lse_part=lse_part, splits=splits,
                     split_len=split_len)
    ref_o, ref_lse = REF.forward(**inputs)
    assert rel_rms(o, ref_o) <= TIGHT and rel_rms(lse, ref_lse) <= TIGHT
    # Stage 1 wrote nothing for the empty splits of row 0: its scratch rows are still NaN.
    row0_lse = lse_part.view(b, h, splits)[0, :, 1:]
    assert torch.isnan(row0_lse).all()


@pytest.mark.parametrize("block_n, lazy", [(32, True), (64, False), (16, True)])
def test_tile_configs_and_lazy_rescale(block_n, lazy, monkeypatch):
    """Peaked scores over many tiles make the running max move late, which the lazy rescale must survive."""
    monkeypatch.setitem(OURS.CONFIG, "BLOCK_N", block_n)
    monkeypatch.setitem(OURS.CONFIG, "LAZY_RESCALE", lazy)
    inputs = _inputs(8, B=2, H=4, N=300, qscale=4.0, lengths="ragged")
    ref_o, ref_lse = REF.forward(**inputs)
    for forced in (1, 3):
        o, lse = OURS.forward(**inputs, num_splits=forced)
        assert rel_rms(o, ref_o) <= TIGHT and rel_rms(lse, ref_lse) <= TIGHT


def test_default_plan_fills_the_gpu_and_skips_stage_two_when_batch_does():
    cuda = torch.device("cuda")
    OURS._sm_count.cache_clear()
    real = OURS._sm_count
    OURS._sm_count = lambda device: 132
    try:
        assert OURS.split_plan(1, 64, 8192, cuda, block_n=32) == (128, 64)
        assert OURS.split_plan(32, 64, 8192, cuda, block_n=32) == (4, 2048)
        assert OURS.split_plan(64, 128, 8192, cuda, block_n=32) == (1, 8192)
    finally:
        OURS._sm_count = real


def _poison_past_lengths(inputs: dict) -> None:
    """NaN in the cache rows at or past each length: the contract lets them hold anything."""
    kv, lens = inputs["kv_cache"], inputs["cache_seqlens"]
    kv[torch.arange(kv.shape[1])[None, :] >= lens.to(torch.int64)[:, None]] = math.nan


@pytest.mark.parametrize("cfg", [
    {"LOAD": "peeled", "BLOCK_N": 32},
    {"LOAD": "tma", "BLOCK_N": 32},
    {"LOAD": "tma", "BLOCK_N": 16},
    {"BLOCK_H": 16, "num_warps": 4, "BLOCK_N": 32},
    {"BLOCK_H": 32, "LOAD": "peeled", "BLOCK_N": 16},
    {"BLOCK_N": 16, "PDL": True, "MERGE_HEADS": 4},
    {"BLOCK_N": 32, "MERGE_HEADS": 2, "MERGE_BLOCK_D": 128},
])
def test_variants_match_oracle_with_nan_past_lengths(cfg):
    """Every load mode and head-group size, over ragged rows whose tails are NaN, at one and several splits.

    N=97 with 16/32-row tiles leaves a partial tail tile in most splits, and row 0 (length 1) has no full tile at
    all; any unmasked read past a length turns o into NaN. H=5 leaves the last head group partly empty.
    """
    inputs = _inputs(9, **RAGGED)
    ref_o, ref_lse = REF.forward(**inputs)
    _poison_past_lengths(inputs)
    for forced in (1, 2, 3):
        o, lse = OURS.forward(**inputs, num_splits=forced, config=cfg)
        assert rel_rms(o, ref_o) <= TIGHT and rel_rms(lse, ref_lse) <= TIGHT, (cfg, forced)


def test_config_overrides_are_per_call_and_validated():
    before = dict(OURS.CONFIG)
    assert OURS.resolve({"BLOCK_H": 16})["BLOCK_H"] == 16
    assert OURS.CONFIG == before
    with pytest.raises(ValueError, match="unknown config key 'BLOCK_M'"):
        OURS.resolve({"BLOCK_M": 16})
    inputs = _inputs(10, B=1, H=3, N=50)
    with pytest.raises(ValueError, match="unknown config key"):
        OURS.forward(**inputs, config={"warps": 4})


def test_shipped_config_is_in_its_tunables():
    for key, value in OURS.CONFIG.items():
        assert value in OURS.TUNABLES[key], key


def test_auto_plan_counts_head_groups(monkeypatch):
    """Fewer heads per program means more programs per split: at M1, 16 heads give 4 groups x 32 splits."""
    monkeypatch.setattr(OURS, "_sm_count", lambda device: 132)
    cuda = torch.device("cuda")
    assert OURS.split_plan(1, 64, 8192, cuda, config={"BLOCK_H": 16}) == (32, 256)
    assert OURS.split_plan(1, 64, 8192, cuda, config={"BLOCK_H": 32}) == (64, 128)
    assert OURS.split_plan(32, 64, 8192, cuda, config={"BLOCK_H": 16}) == (1, 8192)


def test_variant_sweep_checker_runs_on_the_interpreter():
    """The device sweep's per-variant check (NaN tails, NaN scratch, forced splits) on a CPU held-out shape,
    and it must reject a broken kernel: one that leaves the last batch row's output unwritten (zeros)."""
    import importlib.util

    path = KERNELS.parent / "benchmarks" / "mla_variants.py"
    spec = importlib.util.spec_from_file_location("mla_variants_test", path)
    mv = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mv)
    shapes = [(s["name"], s["params"]) for s in TASK["shapes"]["heldout_cpu"] if s["name"] == "HC1"]
    mv.VARIANTS["cpu-tma"] = ({"LOAD": "tma", "BLOCK_N": 16, "BLOCK_H": 16}, "test")
    result = mv.check_variant("cpu-tma", device="cpu", shapes=shapes, forced_on=("HC1",))
    assert result["ok"], result["checks"]
    # N=65 is 5 tiles of 16: forcing 4 splits gives 3 of 32 rows, forcing 64 gives one a tile.
    assert [r["shape"] for r in result["checks"]] == ["HC1", "HC1/S=1", "HC1/S=3", "HC1/S=5"]
    real = mv.OURS.attend_into

    def drops_last_row(*args, **kwargs):
        real(*args, **kwargs)
        # Only the checker's forced-split calls pass o by keyword; forward's own calls go through untouched.
        if "o" in kwargs:
            kwargs["o"][-1] = 0.0

    mv.OURS.attend_into = drops_last_row
    try:
        broken = mv.check_variant("cpu-tma", device="cpu", shapes=shapes, forced_on=("HC1",))
    finally:
        mv.OURS.attend_into = real
    assert not broken["ok"]
    assert [r["ok"] for r in broken["checks"]] == [True, False, False, False]


PAGED = {"B": 3, "H": 5, "N": 97, "lengths": "ragged"}
"""Ragged rows over pages: row 0 has length 1 (one page, every split but the first empty), N is no multiple of the
page size, so every row's last page is partly past its length."""


def _spare_pages(inputs: dict) -> torch.Tensor:
    """The pages no block-table entry names (make_inputs draws a spare one per row)."""
    table, pages = inputs["block_table"], inputs["kv_cache"].shape[0]
    named = torch.zeros(pages, dtype=torch.bool)
    named[table[table >= 0].long()] = True
    return (~named).nonzero().flatten()


def _poison_paged(inputs: dict, value: float = math.nan) -> None:
    """`value` in every spare page and in every row at or past its length (the tail of a row's last page)."""
    kv, table, lens = inputs["kv_cache"], inputs["block_table"], inputs["cache_seqlens"]
    kv[_spare_pages(inputs)] = value
    ps = kv.shape[1]
    for b in range(table.shape[0]):
        for n in range(int(lens[b]), table.shape[1] * ps):
            page = int(table[b, n // ps])
            if page >= 0:
                kv[page, n % ps] = value


@pytest.mark.parametrize("page_size", [1, 16, 64])
def test_paged_inputs_are_shuffled_pages_of_one_cache(page_size):
    """A paged shape's table names each row's pages in order from one shuffled pool (no page twice, one spare
    page per row), entries past a row's pages are UNUSED, and the oracle reads exactly the gathered cache: spare
    pages and rows past the lengths change nothing."""
    inputs = _inputs(21, **PAGED, page_size=page_size)
    table, lens, kv = inputs["block_table"], inputs["cache_seqlens"], inputs["kv_cache"]
    per_row = -(-97 // page_size)
    assert table.dtype == torch.int32 and tuple(table.shape) == (3, per_row)
    assert tuple(kv.shape) == (3 * (per_row + 1), page_size, 576)
    used = (lens.long() + page_size - 1) // page_size
    for b in range(3):
        assert (table[b, :used[b]] >= 0).all() and (table[b, used[b]:] == REF.UNUSED_PAGE).all()
    named = table[table >= 0]
    assert named.unique().numel() == named.numel() and _spare_pages(inputs).numel() == kv.shape[0] - named.numel()
    if named.numel() > 2:
        assert not torch.equal(named, named.sort().values), "pages in order: not shuffled"
    assert torch.equal(REF.make_inputs({"dtype": "float32", **PAGED, "page_size": page_size}, 21, "cpu")["block_table"],
                       table)
    o, lse = REF.forward(**inputs)
    flat = REF.gather_pages(kv, table)
    o_flat, lse_flat = REF.forward(inputs["q"], flat, lens, inputs["sm_scale"])
    assert torch.equal(o, o_flat) and torch.equal(lse, lse_flat)
    _poison_paged(inputs, 1e4)
    o2, lse2 = REF.forward(**inputs)
    assert torch.equal(o, o2) and torch.equal(lse, lse2)


@pytest.mark.parametrize("impl", ["seed", "ours", "baseline"])
@pytest.mark.parametrize("params", [{**PAGED, "page_size": 1}, {**PAGED, "page_size": 64, "scale_dim": 576},
                                    {"B": 1, "H": 3, "N": 1, "page_size": 64},
                                    {"B": 2, "H": 4, "N": 130, "page_size": 16, "qscale": 2.5}],
                         ids=["ps1-ragged", "ps64-ragged", "ps64-N1", "ps16"])
def test_paged_matches_oracle(impl, params):
    fn = {"seed": SEED.forward, "ours": OURS.forward, "baseline": BASE.forward}[impl]
    inputs = _inputs(22, **params)
    ref_o, ref_lse = REF.forward(**inputs)
    o, lse = fn(**inputs)
    assert o.shape == ref_o.shape and o.dtype == inputs["q"].dtype and lse.dtype == torch.float32
    assert rel_rms(o, ref_o) <= TIGHT and rel_rms(lse, ref_lse) <= TIGHT


@pytest.mark.parametrize("page_size, cfg", [
    (1, {"BLOCK_N": 16}), (1, {"BLOCK_N": 32, "LOAD": "masked"}), (16, {"BLOCK_N": 32}),
    (32, {"BLOCK_N": 32}), (64, {"BLOCK_N": 32, "LOAD": "peeled"}), (64, {"BLOCK_N": 32}),
    (64, {"BLOCK_N": 64, "MERGE_HEADS": 2}),
], ids=["ps1", "ps1-masked", "ps16-tiles-over-pages", "ps32-tma", "ps64-peeled", "ps64-tma-two-tiles-a-page",
        "ps64-tma"])
def test_paged_variants_with_nan_past_lengths_and_in_spare_pages(page_size, cfg):
    """Every load mode over pages smaller than, equal to and larger than the tile (a tile over several pages
    gathers rows; LOAD "tma" reads whole tiles of one page), NaN in every spare page and every row past its
    length, at one and several splits, and with NaN scratch at a forced split count (empty splits never merged)."""
    inputs = _inputs(23, **PAGED, page_size=page_size)
    ref_o, ref_lse = REF.forward(**inputs)
    _poison_paged(inputs)
    for forced in (1, 2, 3):
        o, lse = OURS.forward(**inputs, num_splits=forced, config=cfg)
        assert rel_rms(o, ref_o) <= TIGHT and rel_rms(lse, ref_lse) <= TIGHT, (cfg, forced)
    splits, split_len = OURS.split_plan(3, 5, inputs["block_table"].shape[1] * page_size, torch.device("cpu"), 4,
                                        config=cfg)
    o, lse = torch.full((3, 5, 512), math.nan), torch.full((3, 5), math.nan)
    o_part, lse_part = OURS.partial_buffers(3, 5, splits, torch.device("cpu"))
    o_part.fill_(math.nan)
    lse_part.fill_(math.nan)
    OURS.attend_into(**inputs, o=o, lse=lse, o_part=o_part, lse_part=lse_part, splits=splits, split_len=split_len,
                     config=cfg)
    assert rel_rms(o, ref_o) <= TIGHT and rel_rms(lse, ref_lse) <= TIGHT
    assert torch.isnan(lse_part.view(3, 5, splits)[0, :, 1:]).all()  # row 0's empty splits: never written


def test_paged_cache_needs_a_well_formed_table():
    inputs = _inputs(24, **PAGED, page_size=16)
    with pytest.raises(ValueError, match="block_table must be"):
        OURS.forward(**{**inputs, "block_table": inputs["block_table"][:2]})
    with pytest.raises(ValueError, match="block_table must be"):
        OURS.forward(**{**inputs, "block_table": inputs["block_table"].t().contiguous().t()})


def _key(**inputs) -> tuple:
    bt = inputs.get("block_table")
    return OURS._plan_key(inputs["q"], inputs["kv_cache"], inputs["cache_seqlens"], bt, inputs.get("splits", 0), 0,
                          inputs.get("config"))


def test_plan_key_tells_apart_everything_a_launch_depends_on():
    """Two calls share a plan (and its compiled kernels) only if every tensor has the same shape, strides, dtype,
    device and 16-byte alignment, the split request and the config are the same: each variant below is a call that
    a stale plan would launch with wrong arguments or a kernel specialised for other inputs."""
    base = _inputs(30, B=2, H=4, N=70)

    def misaligned(t):
        flat = torch.empty(t.numel() + 1, dtype=t.dtype)[1:]
        return flat.view(t.shape).copy_(t)

    def strided(t):
        wide = torch.empty(*t.shape[:-1], t.shape[-1] + 8, dtype=t.dtype)
        wide[..., :t.shape[-1]] = t
        return wide[..., :t.shape[-1]]

    variants = {
        "N": _inputs(30, B=2, H=4, N=71), "H": _inputs(30, B=2, H=5, N=70), "B": _inputs(30, B=3, H=4, N=70),
        "dtype": {k: v.to(torch.bfloat16) if k in ("q", "kv_cache") else v for k, v in base.items()},
        "q strided": {**base, "q": strided(base["q"])}, "kv strided": {**base, "kv_cache": strided(base["kv_cache"])},
        "q misaligned": {**base, "q": misaligned(base["q"])},
        "kv misaligned": {**base, "kv_cache": misaligned(base["kv_cache"])},
        "lens int64": {**base, "cache_seqlens": base["cache_seqlens"].long()},
        "lens misaligned": {**base, "cache_seqlens": misaligned(base["cache_seqlens"])},
        "q device": {**base, "q": base["q"].to("meta")}, "kv device": {**base, "kv_cache": base["kv_cache"].to("meta")},
        "paged": _inputs(30, B=2, H=4, N=70, page_size=64), "page size": _inputs(30, B=2, H=4, N=70, page_size=16),
        "table width": _inputs(30, B=2, H=4, N=70, page_size=16, lengths="ragged"),
        "splits": {**base, "splits": 2}, "config": {**base, "config": {"BLOCK_N": 32}},
    }
    variants["table width"]["block_table"] = variants["table width"]["block_table"][:, :4]
    keys = {name: _key(**v) for name, v in variants.items()}
    keys["base"] = _key(**base)
    assert len(set(keys.values())) == len(keys), [n for n in keys if list(keys.values()).count(keys[n]) > 1]
    # Fresh tensors with the same layout (other data, other addresses) share the plan.
    assert _key(**_inputs(31, B=2, H=4, N=70)) == keys["base"]
    assert _key(**base, config={"BLOCK_N": OURS.CONFIG["BLOCK_N"]}) == keys["base"]


def _caching_plans(monkeypatch) -> None:
    """Plans that keep compiled kernels (the interpreter's do not: it has none), from an empty plan cache."""
    real = OURS._make_plan
    monkeypatch.setattr(OURS, "_make_plan", lambda *args: dataclasses.replace(real(*args), cached=True))
    monkeypatch.setattr(OURS, "_PLANS", {})


def test_warm_calls_launch_the_compiled_kernels_with_this_calls_addresses(monkeypatch):
    """A plan's first call goes through the JIT functions and keeps the compiled kernels they return; the next
    call with the same key launches those with every pointer replaced by this call's address (its own inputs,
    outputs and scratch) and every other argument as the JIT call had it. Another key launches through the JIT."""
    stage1, merge = _stub(monkeypatch, "_mla_split_attend"), _stub(monkeypatch, "_mla_merge_splits")
    _caching_plans(monkeypatch)
    first = _inputs(32, **RAGGED)
    OURS.forward(**first, num_splits=2)
    assert len(stage1.calls) == len(merge.calls) == 1 and not stage1.warm
    second = _inputs(33, **RAGGED)
    o, lse = OURS.forward(**second, num_splits=2)
    assert len(stage1.calls) == 1 and len(stage1.warm) == len(merge.warm) == 1
    jit, warm = stage1.calls[0], stage1.warm[0]
    addresses = {"Q": second["q"], "KV": second["kv_cache"], "SEQLENS": second["cache_seqlens"], "O": o, "LSE": lse}
    for name, tensor in addresses.items():
        assert warm[name] == tensor.data_ptr(), name
    rows = 3 * 5 * 2
    assert warm["LSEP"] - warm["OP"] == rows * 512 * 4 and warm["OP"] % 16 == 0
    for name, value in jit.items():
        if name in warm and isinstance(value, OURS.TensorDescriptor):
            assert warm[name].base.data_ptr() == second["kv_cache"].data_ptr(), name
        elif name in warm and not isinstance(value, torch.Tensor):
            assert warm[name] == value, name
    assert (merge.warm[0]["OP"], merge.warm[0]["LSEP"], merge.warm[0]["O"]) == (warm["OP"], warm["LSEP"],
                                                                                 o.data_ptr())
    # Warm calls of one plan share its partials' buffer (eager calls on one stream run in order).
    OURS.forward(**_inputs(34, **RAGGED), num_splits=2)
    (plan,) = OURS._PLANS.values()
    assert stage1.warm[1]["OP"] == warm["OP"] == plan.scratch.data_ptr()
    # A strided q is another key: a JIT launch with its strides, not the warm kernel.
    wide = torch.zeros(3, 5, 600)
    wide[..., :576] = second["q"]
    OURS.forward(**{**second, "q": wide[..., :576]}, num_splits=2)
    assert len(stage1.calls) == 2 and len(stage1.warm) == 2
    assert (stage1.calls[1]["stride_qb"], stage1.calls[1]["stride_qh"]) == (5 * 600, 600)


def test_warm_gluon_calls_rebuild_descriptors_for_new_addresses_only(monkeypatch):
    """DESC "host": the Gluon path's TMA descriptors are cached per address set: a warm call with the same q and
    cache reuses them, a new q gets a descriptor over its own address, and the fused merge's barrier slot moves
    every call."""
    monkeypatch.setattr(OURS, "gluon_ok", lambda *args, **kwargs: True)
    monkeypatch.setattr(OURS, "_SYNC_WORDS", {})
    stub = _stub(monkeypatch, "_mla_split_attend_ws")
    _caching_plans(monkeypatch)
    inputs = REF.make_inputs({"B": 1, "H": 64, "N": 512}, 34, "cpu")
    cfg = {"MERGE": "fused", "DESC": "host"}
    for _ in range(3):
        OURS.forward(**inputs, config=cfg)
    q2 = inputs["q"].clone()
    OURS.forward(**{**inputs, "q": q2}, config=cfg)
    assert len(stub.calls) == 1 and len(stub.warm) == 3
    warm = stub.warm
    assert stub.calls[0]["FUSED"] and stub.calls[0]["launch_cooperative_grid"]
    (plan,) = OURS._PLANS.values()
    first = stub.calls[0]
    address_sets = {(c["q_desc"].base.data_ptr(), c["kv_desc"].base.data_ptr(), OURS._addr(c["OUT"]))
                    for c in [first, *warm]}
    assert len(plan.descriptors) == len(address_sets)
    for call in warm:
        same = [c for c in [first, *warm] if (c["q_desc"].base.data_ptr(), OURS._addr(c["OUT"])) ==
                (call["q_desc"].base.data_ptr(), call["OUT"])]
        assert all(c["q_desc"] is call["q_desc"] and c["kv_desc"] is call["kv_desc"] for c in same)
    assert warm[2]["q_desc"].base.data_ptr() == q2.data_ptr() != inputs["q"].data_ptr()
    assert warm[2]["kv_desc"].base.data_ptr() == inputs["kv_cache"].data_ptr()
    for call in warm:
        assert call["o_desc"].base.data_ptr() == call["OUT"] and isinstance(call["OUT"], int)
    words = OURS._SYNC_WORDS[torch.device("cpu")]
    slots = [(c["SYNC"] - words.data_ptr()) // (4 * OURS._SYNC_GROUPS) for c in warm]
    assert len(set(slots)) == 3 and all(0 <= s < OURS._SYNC_SLOTS for s in slots)


def test_graph_captures_take_host_descriptors_under_desc_auto(monkeypatch):
    """DESC "auto" (the default): eager calls build their descriptors on the device (a cheaper launch), while a
    call being captured into a graph takes the plan's twin with host-made descriptors (replays pay no host cost,
    and the device-made ones cost GPU time). The twin is made once and keeps its own compiled kernels."""
    assert OURS.CONFIG["DESC"] == "auto"
    monkeypatch.setattr(OURS, "gluon_ok", lambda *args, **kwargs: True)
    monkeypatch.setattr(OURS, "_SYNC_WORDS", {})
    _caching_plans(monkeypatch)
    inputs = REF.make_inputs({"B": 1, "H": 64, "N": 512}, 36, "cpu")
    args = (inputs["q"], inputs["kv_cache"], inputs["cache_seqlens"], None, 0, None)
    eager = OURS._plan_for(*args)
    captured = OURS._plan_for(*args, capturing=True)
    assert eager.device_desc and not captured.device_desc and captured is eager.graph_twin
    assert captured.cfg["DESC"] == "host" and captured.compiled is not eager.compiled
    assert OURS._plan_for(*args, capturing=True) is captured and OURS._plan_for(*args) is eager
    host = OURS._plan_for(*args[:-1], {"DESC": "host"}, capturing=True)
    assert host.graph_twin is None and not host.device_desc
    # A capture gets partials of its own (from the graph's pool); eager calls share the plan's.
    assert OURS._scratch(eager, True) is not OURS._scratch(eager, False) is OURS._scratch(eager, False)


def test_global_scratch_is_one_buffer_per_device_and_stream(monkeypatch):
    """The allocator hook keeps one buffer per (device, stream), grown on demand; the default stream's handle is 0
    on every GPU, so two devices must not share it; a launch being captured gets a fresh buffer every time."""
    made = []

    def empty(size, dtype, device):
        made.append((size, device))
        return torch.zeros(size, dtype=dtype)

    device = [0]
    capturing = [False]
    monkeypatch.setattr(OURS, "_GLOBAL_SCRATCH", {})
    monkeypatch.setattr(OURS.torch, "empty", empty)
    monkeypatch.setattr(OURS.torch.cuda, "current_device", lambda: device[0])
    monkeypatch.setattr(OURS.torch.cuda, "is_current_stream_capturing", lambda: capturing[0])
    first = OURS._global_scratch(384, 128, 0)
    assert OURS._global_scratch(256, 128, 0) is first and made == [(1 << 16, torch.device("cuda", 0))]
    device[0] = 1
    other = OURS._global_scratch(384, 128, 0)
    assert other is not first and made[-1] == (1 << 16, torch.device("cuda", 1))
    assert OURS._global_scratch(384, 128, 7) is not other  # another stream of device 1
    grown = OURS._global_scratch(1 << 17, 128, 0)
    assert grown is not other and grown.numel() == 1 << 17
    capturing[0] = True
    assert OURS._global_scratch(384, 128, 0) is not OURS._global_scratch(384, 128, 0)


def test_warm_gluon_calls_with_device_descriptors_pass_plain_addresses(monkeypatch):
    """DESC "device": the Gluon kernel builds its own descriptors, so a warm call passes q, the cache and the
    partials as addresses with the rows the kernel's descriptors span, builds no descriptor on the host, and puts
    in Triton's allocator hook for the descriptors' global scratch."""
    monkeypatch.setattr(OURS, "gluon_ok", lambda *args, **kwargs: True)
    monkeypatch.setattr(OURS, "_SYNC_WORDS", {})
    stub = _stub(monkeypatch, "_mla_split_attend_ws")
    _caching_plans(monkeypatch)
    hooks = []
    monkeypatch.setattr(OURS.triton, "set_allocator", hooks.append)
    inputs = REF.make_inputs({"B": 1, "H": 64, "N": 512}, 35, "cpu")
    cfg = {"MERGE": "fused", "DESC": "device"}
    for _ in range(3):
        OURS.forward(**inputs, config=cfg)
    (plan,) = OURS._PLANS.values()
    assert plan.device_desc and not plan.descriptors and len(stub.calls) == 1 and len(stub.warm) == 2
    first = stub.calls[0]
    assert first["q_desc"] is inputs["q"] and first["kv_desc"] is inputs["kv_cache"] and first["DEVICE_DESC"]
    assert first["o_desc"] is first["OUT"]
    for call in stub.warm:
        assert (call["q_desc"], call["kv_desc"]) == (inputs["q"].data_ptr(), inputs["kv_cache"].data_ptr())
        assert call["o_desc"] == call["OUT"] == plan.scratch.data_ptr()
    for call in [first, *stub.warm]:
        assert (call["Q_ROWS"], call["KV_ROWS"], call["O_COLS"]) == (64, 512, plan.splits * 512)
    assert hooks == [OURS._global_scratch] * 3


@pytest.mark.parametrize("merge", ["fused", "kernel"])
def test_warm_calls_launch_raw_on_the_current_stream_unless_a_hook_is_set(monkeypatch, merge):
    """Where the compiled kernels' launchers are Triton's CudaLauncher, a warm call makes their C launches itself:
    every launch a runner would make (stage 1, and the merge kernel of a two-kernel plan), on the current stream,
    with the grid, cooperative flag and packed metadata the runner would pass, the device-made descriptors' global
    scratch from the stream's buffer (sized for the whole grid), no hooks, and the runner's parameters. A launch
    hook (a profiler) or profiling scratch sends it back to the runner (a capture does too, on the GPU only:
    mla_compare's graph checks)."""
    monkeypatch.setattr(OURS, "gluon_ok", lambda *args, **kwargs: True)
    monkeypatch.setattr(OURS, "_SYNC_WORDS", {})
    monkeypatch.setattr(OURS, "_GLOBAL_SCRATCH", {})
    streams = []
    monkeypatch.setattr(OURS, "_current_stream", lambda device: streams.append(device) or 77)
    monkeypatch.setattr(OURS.triton, "set_allocator", lambda hook: None)
    fused = merge == "fused"
    stage1 = _stub(monkeypatch, "_mla_split_attend_ws", {"global_scratch_size": 384, "global_scratch_align": 128,
                                                         "launch_cooperative_grid": fused})
    stage2 = _stub(monkeypatch, "_mla_merge_splits", {})
    _caching_plans(monkeypatch)
    inputs = REF.make_inputs({"B": 1, "H": 64, "N": 512}, 37, "cpu")
    cfg = {"MERGE": merge, "DESC": "device"}
    first = OURS.forward(**inputs, config=cfg)
    o, lse = OURS.forward(**inputs, config=cfg)
    (plan,) = OURS._PLANS.values()
    assert plan.fused == fused and plan.launches == (1 if fused else 2)
    # The direct call's outputs (empty_like of the plan's templates) are fresh, contiguous and of forward's types.
    for new, old in zip((o, lse), first):
        assert (new.shape, new.dtype, new.stride()) == (old.shape, old.dtype, old.stride()) and new.is_contiguous()
        assert new.untyped_storage().nbytes() == old.untyped_storage().nbytes()
        assert new.data_ptr() not in (o_.data_ptr() for o_ in first)
    assert o.shape == (1, 64, 512) and lse.shape == (1, 64) and lse.dtype == torch.float32
    assert plan.direct and not stage1.warm and not stage2.warm and streams == [torch.device("cpu")]
    assert len(stage1.raw) == 1 and len(stage2.raw) == (0 if fused else 1)
    grid, stream, function, cooperative, pdl, scratch, rest, params = stage1.raw[0]
    assert (grid, stream, function, cooperative, pdl) == (plan.grid, 77, 0xF00, fused, False)
    assert rest == (None, (4, 1, 1024), None, None, None)  # no profiling scratch, packed metadata, no hooks
    assert plan.raw["gluon"].scratch_bytes == plan.grid[0] * plan.splits * 384 == plan.splits * 384
    buffer = OURS._GLOBAL_SCRATCH[(None, 77)]
    assert scratch == buffer.data_ptr() and buffer.numel() >= plan.splits * 384
    assert params["OUT"] == plan.scratch.data_ptr()
    if fused:
        assert (params["O"], params["LSE"]) == (o.data_ptr(), lse.data_ptr())
    else:
        merged = stage2.raw[0]
        assert (merged[0], merged[1], merged[5]) == (plan.merge_launch[0], 77, None)
        assert (merged[7]["O"], merged[7]["LSE"], merged[7]["OP"]) == (o.data_ptr(), lse.data_ptr(), params["OUT"])
    # A hook set: the runner launches, with the same parameters but for the call's own outputs and barrier slot.
    hook = lambda metadata: None  # noqa: E731
    OURS.triton.knobs.runtime.launch_enter_hook.add(hook)
    try:
        OURS.forward(**inputs, config=cfg)
    finally:
        OURS.triton.knobs.runtime.launch_enter_hook.remove(hook)
    own = ("O", "LSE", "SYNC")
    for stub in (stage1, stage2):
        assert len(stub.warm) == len(stub.raw) <= 1
        for ran, raw in zip(stub.warm, stub.raw):
            assert {k: v for k, v in ran.items() if k not in own} == {k: v for k, v in raw[7].items() if k not in own}
    OURS.forward(**inputs, config=cfg)
    assert len(stage1.raw) == 2 and len(streams) == 2
    # Profiling scratch in the launcher: no raw launch for that plan.
    stage1.launcher = {"profile_scratch_size": 64}
    monkeypatch.setattr(OURS, "_PLANS", {})
    for _ in range(2):
        OURS.forward(**inputs, config=cfg)
    (plan,) = OURS._PLANS.values()
    assert plan.raw["gluon"] is None and not plan.direct and len(stage1.raw) == 2 and len(stage1.warm) == 2


def test_hooks_idle_only_without_any_launch_hook(monkeypatch):
    """Raw launches skip Triton's launch hooks, so they are taken only while no hook would run: none set, or empty
    hook chains (Triton 3.6's default). A chain with a hook in it, or a plain function set as the hook, is busy."""
    runtime = OURS.triton.knobs.runtime
    chain = type(runtime.launch_enter_hook)
    for enter, leave, idle in [(None, None, True), (chain(), chain(), True), (print, None, False),
                               (None, print, False)]:
        monkeypatch.setattr(runtime, "launch_enter_hook", enter)
        monkeypatch.setattr(runtime, "launch_exit_hook", leave)
        assert OURS._hooks_idle() is idle, (enter, leave)
    busy = chain()
    busy.add(print)
    monkeypatch.setattr(runtime, "launch_enter_hook", busy)
    assert not OURS._hooks_idle()


def test_calls_of_changing_shapes_stay_right_on_the_interpreter():
    """The plan cache under real kernels: shapes, layouts and caches alternate call by call, each checked."""
    cases = [RAGGED, {"B": 2, "H": 4, "N": 37}, {**PAGED, "page_size": 16}, RAGGED, {**PAGED, "page_size": 1}]
    for seed, params in enumerate(cases):
        inputs = _inputs(40 + seed, **params)
        if seed == 3:  # RAGGED again, with a cache sliced out of wider rows
            wide = torch.zeros(3, 97, 600)
            wide[..., :576] = inputs["kv_cache"]
            inputs["kv_cache"] = wide[..., :576]
        ref_o, ref_lse = REF.forward(**inputs)
        o, lse = OURS.forward(**inputs, num_splits=2)
        assert rel_rms(o, ref_o) <= TIGHT and rel_rms(lse, ref_lse) <= TIGHT, params


def test_tma_default_falls_back_on_a_strided_cache():
    """The shipped LOAD is "tma", which needs [B*N, 576] contiguous rows; a cache sliced out of wider rows must
    take the pointer path and still be right, not fail or read the wrong columns."""
    assert OURS.CONFIG["LOAD"] == "tma"
    inputs = _inputs(11, B=2, H=4, N=70, lengths="ragged")
    wide = torch.full((2, 70, 600), math.nan)
    wide[:, :, :576] = inputs["kv_cache"]
    inputs["kv_cache"] = wide[:, :, :576]
    assert not OURS.tma_ok(inputs["kv_cache"])
    ref_o, ref_lse = REF.forward(**inputs)
    o, lse = OURS.forward(**inputs, num_splits=2, config={"BLOCK_N": 16})
    assert rel_rms(o, ref_o) <= TIGHT and rel_rms(lse, ref_lse) <= TIGHT


class _Launch:
    """Stands in for a JIT kernel: checks that the host passes every kernel parameter exactly once (a renamed or
    missing one fails only at launch, on the GPU) and records each launch by parameter name. A JIT launch returns a
    compiled-kernel stand-in (as JITFunction.run returns the CompiledKernel) whose launches go to `warm`."""

    OPTIONS = ("num_warps", "num_stages", "maxnreg", "launch_cooperative_grid", "launch_pdl")

    def __init__(self, kernel, launcher: dict | None = None):
        # A JITFunction and the interpreter's InterpretedFunction both keep the Python function they wrap.
        self.names = list(inspect.signature(kernel.fn).parameters)
        self.calls = []
        """JIT launches: the kernel's parameters by name, plus grid and options."""
        self.warm = []
        """Launches through the compiled stand-in: parameters by name, plus grid."""
        self.launcher = launcher
        """CudaLauncher attributes for the compiled stand-in's run (None: it has no run, as before Triton 3.6)."""
        self.raw = []
        """Raw launches (run.launch): (grid, stream, function, cooperative, pdl, scratch, rest, parameters)."""

    def named(self, grid, args, kwargs):
        given = self.names[:len(args)] + list(kwargs)
        assert sorted(given) == sorted(self.names) and len(given) == len(set(given)), set(given) ^ set(self.names)
        return {"grid": grid, **dict(zip(self.names, args)), **kwargs}

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            options = {k: kwargs.pop(k) for k in self.OPTIONS if k in kwargs}
            self.calls.append({**self.named(grid, args, kwargs), **options})
            return _Compiled(self)

        return launch


class _Compiled:
    """The compiled-kernel stand-in _Launch returns: kernel[grid](*args) with every parameter positional. With the
    stub's `launcher` set it also has Triton 3.6's CudaLauncher surface (run.launch and its attributes), whose raw
    launches go to `raw` as (grid, stream, function, cooperative, pdl, global scratch, the rest, parameters)."""

    def __init__(self, stub: _Launch):
        self.stub = stub
        if stub.launcher is not None:
            self.run = _Launcher(stub, **stub.launcher)
            self.function, self.packed_metadata = 0xF00, (4, 1, 1024)

    def __getitem__(self, grid):
        # CompiledKernel's launcher reads grid[0], grid[1] and grid[2]; unlike the JIT path it pads nothing.
        assert len(grid) == 3, grid
        return lambda *args: self.stub.warm.append(self.stub.named(grid, args, {}))


class _Launcher:
    """CudaLauncher's surface as a raw launch reads it; launch() records into the stub's `raw`."""

    def __init__(self, stub: _Launch, global_scratch_size=0, global_scratch_align=1, profile_scratch_size=0,
                 launch_cooperative_grid=False, launch_pdl=False, num_ctas=1):
        self.stub, self.num_ctas = stub, num_ctas
        self.global_scratch_size, self.global_scratch_align = global_scratch_size, global_scratch_align
        self.profile_scratch_size = profile_scratch_size
        self.launch_cooperative_grid, self.launch_pdl = launch_cooperative_grid, launch_pdl

    def launch(self, gx, gy, gz, stream, function, cooperative, pdl, scratch, profile_scratch, *rest):
        packed, rest, params = rest[0], rest[1:4], rest[4:]
        self.stub.raw.append(((gx, gy, gz), stream, function, cooperative, pdl, scratch, (profile_scratch, packed,
                              *rest), self.stub.named((gx, gy, gz), params, {})))


def _stub(monkeypatch, name: str, launcher: dict | None = None) -> _Launch:
    """Replace kernel `name` of our module by a recording _Launch (with a raw launcher's surface: `launcher`)."""
    stub = _Launch(getattr(OURS, name), launcher)
    monkeypatch.setattr(OURS, name, stub)
    return stub


def test_merge_rows_per_program_shrink_with_many_splits(monkeypatch):
    """MERGE_HEADS is a ceiling: the merge launch sees fewer rows per program when the split count is large
    (64 rows at 4 splits: 8 programs of 8 rows x 256 columns; at 128 splits 2 rows x 32 columns)."""
    _stub(monkeypatch, "_mla_split_attend")
    merge = _stub(monkeypatch, "_mla_merge_splits")
    # PDL is asked for but these are CPU tensors: no launch_pdl may reach the interpreter.
    cfg = {"MERGE_HEADS": 8, "PDL": True}
    for splits in (4, 128):
        q = torch.zeros(1, 64, 576)
        kv = torch.zeros(1, 64 * splits, 576)
        o, lse = torch.zeros(1, 64, 512), torch.zeros(1, 64)
        op, lp = OURS.partial_buffers(1, 64, splits, q.device)
        OURS.attend_into(q, kv, torch.tensor([kv.shape[1]], dtype=torch.int32), 0.1, o, lse, op, lp, splits, 64,
                         config=cfg)
    seen = [(c["grid"], c["BLOCK_M"], c["BLOCK_S"], c["BLOCK_D"], c["num_warps"], "launch_pdl" in c)
            for c in merge.calls]
    assert seen[0] == ((8, 2, 1), 8, 4, 256, 4, False)
    assert seen[1] == ((32, 16, 1), 2, 128, 32, 4, False)


@pytest.mark.parametrize("args", [[], ["--fused", "--splits", "128"], ["--fused", "--splits", "4", "--store", "lsu"],
                                  ["--paged", "--splits", "4"], ["--fused", "--splits", "128", "--desc", "host"]],
                         ids=["two-kernel", "fused-128-splits", "fused-4-splits-lsu-store", "paged-4-splits",
                              "fused-host-descriptors"])
def test_gluon_stage1_compiles_for_hopper_and_scores_each_tile_once(tmp_path, args):
    """The Hopper stage 1 cannot run here, but it must compile for sm_90 and keep its structure: within the 227 KB
    of shared memory, each score product issued once (36 m64n64k16 MMAs: 32 latent + 4 rope), the two value
    halves as 4 m64n256k16 MMAs each, q and the tiles by TMA, register budgets set per partition, no spills.
    The fused variants add the in-kernel merge: one unit per merge step at 128 splits, 16 units at 4;
    its cross-warp reduction scratch once pushed shared memory past the limit. o leaves by TMA in 64-column boxes
    (4 a warpgroup; Gluon does not split a store box itself), or by plain stores with STORE "lsu".

    benchmarks/mla_compile_check.py does the compile in a process of its own, without the interpreter flag these
    tests run under, and with an empty cache so that every stage of the compile runs."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path)
    env["PYTHONPATH"] = str(KERNELS.parent)
    proc = subprocess.run([sys.executable, str(KERNELS.parent / "benchmarks" / "mla_compile_check.py"), *args],
                          capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    shape = json.loads(proc.stdout.strip().splitlines()[-1])
    assert shape["shared_bytes"] <= 232448
    assert shape["wgmma"] == {"m64n64k16": 36, "m64n256k16": 8}
    assert shape["tma_copies"] > 0 and 240 in shape["setmaxnreg"] and 24 in shape["setmaxnreg"]
    assert shape["ptx_local_accesses"] == 0 and shape.get("sass_spill_ops", 0) == 0
    assert shape["tma_stores"] == (0 if "lsu" in args else 8)
    # Device-made descriptors (CONFIG's DESC) take 128 B of global scratch each: q and the cache (the loader's), and
    # o once in each consumer warpgroup unless o is written by plain stores; host-made ones take none.
    assert shape["global_scratch_bytes"] == (0 if "host" in args else 128 * (2 if "lsu" in args else 4))


def _gluon_plan(q, kv, seqlens, splits, fused, table=None, cfg=None):
    """A Gluon-stage-1 plan on the CPU, where gluon_ok says no: what a Hopper call would plan for these inputs."""
    plan = OURS._make_plan(q, kv, seqlens, table, splits, -(-kv.shape[0] * kv.shape[1] // q.shape[0] // splits),
                           cfg)
    return dataclasses.replace(plan, gluon=True, fused=fused, tma_store=OURS.CONFIG["STORE"] == "tma", cached=True,
                               merge_step=OURS.merge_tile(splits) if fused else (1, 1, 1))


@pytest.mark.parametrize("desc", ["host", "device"])
@pytest.mark.parametrize("splits, fused, s_pad, upi, wu", [(128, True, 128, 1, 1), (66, True, 128, 1, 1),
                                                          (4, True, 4, 16, 4), (8, False, 1, 1, 1)])
def test_gluon_launcher_passes_every_parameter(monkeypatch, splits, fused, s_pad, upi, wu, desc):
    """The launcher's arguments match the kernel's signature on both paths, the launch is cooperative exactly when
    the kernel merges in place (its barrier needs every program resident), and the merge tile fits 128 rows."""
    stub = _stub(monkeypatch, "_mla_split_attend_ws")
    b, h, n = 1, 64, 64 * splits
    q = torch.zeros(b, h, 576, dtype=torch.bfloat16)
    kv = torch.zeros(b, n, 576, dtype=torch.bfloat16)
    o = torch.zeros(b, h, 512, dtype=torch.bfloat16)
    lse = torch.zeros(b, h)
    o_part, lse_part = OURS.partial_buffers(b, h, splits, q.device, q.dtype)
    sync = torch.zeros(OURS._SYNC_GROUPS, dtype=torch.int32) if fused else None
    seqlens = torch.full((b,), n, dtype=torch.int32)
    plan = _gluon_plan(q, kv, seqlens, splits, fused, cfg={"DESC": desc})
    OURS._launch_gluon_stage1(plan, q, kv, seqlens, None, 0.1, o_part, lse_part, sync, o, lse)
    (call,) = stub.calls
    assert call["grid"] == (1, splits, b) and call["FUSED"] == fused and not call["PAGED"]
    assert call.get("launch_cooperative_grid") == fused
    assert (call["S_PAD"], call["UPI"], call["MERGE_WU"]) == (s_pad, upi, wu)
    assert call["UPI"] * call["S_PAD"] <= 128
    assert call["TMA_STORE"] == (OURS.CONFIG["STORE"] == "tma")
    assert (call["Q_ROWS"], call["KV_ROWS"], call["O_COLS"]) == (b * h, b * n, splits * 512)
    if desc == "device":
        assert call["DEVICE_DESC"] and (call["q_desc"], call["kv_desc"], call["o_desc"]) == (q, kv, o_part)
        return
    assert not call["DEVICE_DESC"]
    assert list(call["q_desc"].block_shape) == [64, 64] and list(call["q_desc"].shape) == [b * h, 576]
    assert list(call["kv_desc"].block_shape) == [64, 64] and list(call["kv_desc"].shape) == [b * n, 576]
    assert call["q_desc"].base.data_ptr() == q.data_ptr() and call["kv_desc"].base.data_ptr() == kv.data_ptr()
    if call["TMA_STORE"]:
        assert list(call["o_desc"].block_shape) == [64, 64] and list(call["o_desc"].shape) == [b * h, splits * 512]
        assert call["o_desc"].base.data_ptr() == o_part.data_ptr()


def test_tma_store_only_where_a_box_stays_inside_its_rows():
    """STORE "tma" writes [64 heads, 64 columns] boxes into o viewed as [B*H, splits*512]: only a head count that
    is a multiple of 64 qualifies (a TMA box is clipped at the tensor's edge, not at a batch row's last head), and
    attend_into refuses caller buffers that are not the contiguous rows the boxes and pointers assume."""
    assert OURS.tma_store_ok(128, 64) and not OURS.tma_store_ok(16, 64)
    inputs = _inputs(13, B=2, H=4, N=40)
    part, lse_part = OURS.partial_buffers(2, 4, 2, torch.device("cpu"))
    good_o, lse = torch.zeros(2, 4, 512), torch.zeros(2, 4)
    OURS.attend_into(**inputs, o=good_o, lse=lse, o_part=part, lse_part=lse_part, splits=2, split_len=32)
    ref_o, _ = REF.forward(**inputs)
    assert rel_rms(good_o, ref_o) <= TIGHT
    strided_o = torch.zeros(2, 512, 4).transpose(1, 2)
    with pytest.raises(ValueError, match="contiguous"):
        OURS.attend_into(**inputs, o=strided_o, lse=lse, o_part=part, lse_part=lse_part, splits=2, split_len=32)
    short_part, short_lse = OURS.partial_buffers(2, 4, 1, torch.device("cpu"))  # the buffers of another split count
    with pytest.raises(ValueError, match="contiguous"):
        OURS.attend_into(**inputs, o=good_o, lse=lse, o_part=short_part, lse_part=short_lse, splits=2, split_len=32)


def test_fused_merge_only_where_the_grid_is_resident(monkeypatch):
    """MERGE picks the in-kernel merge only for 2-128 splits whose whole grid fits one program per multiprocessor
    ("auto" from FUSED_MIN_SPLITS); anything else keeps the stage-2 kernel rather than risk a barrier waiting on a
    program that cannot be scheduled."""
    monkeypatch.setattr(OURS, "_sm_count", lambda device: 132)
    cpu = torch.device("cpu")
    auto, fused, kernel = {"MERGE": "auto"}, {"MERGE": "fused"}, {"MERGE": "kernel"}
    assert OURS.fused_ok(1, 64, 128, cpu, auto) and OURS.fused_ok(1, 128, 66, cpu, auto)
    assert not OURS.fused_ok(32, 64, 4, cpu, auto) and OURS.fused_ok(32, 64, 4, cpu, fused)
    assert not OURS.fused_ok(1, 64, 128, cpu, kernel)
    assert not OURS.fused_ok(1, 64, 1, cpu, fused)
    assert not OURS.fused_ok(1, 64, 133, cpu, fused) and not OURS.fused_ok(2, 64, 67, cpu, fused)
    assert not OURS.fused_ok(1, 64, 130, cpu, fused)  # resident, but past one merge tile


def test_gluon_stage1_is_skipped_where_it_cannot_run():
    """STAGE1 "gluon" (the default) needs a Hopper GPU: CPU tensors, fp32, a strided q or a tiny cache take the tl
    kernel, with the same results."""
    assert OURS.CONFIG["STAGE1"] == "gluon"
    inputs = _inputs(12, **RAGGED)
    assert not OURS.gluon_ok(inputs["q"], inputs["kv_cache"])
    ref_o, ref_lse = REF.forward(**inputs)
    o, lse = OURS.forward(**inputs, num_splits=2)
    assert rel_rms(o, ref_o) <= TIGHT and rel_rms(lse, ref_lse) <= TIGHT


def test_trace_tool_still_finds_its_anchors(tmp_path):
    """benchmarks/mla_trace.py patches timing stamps into a copy of the kernel; a kernel edit that moves its anchor
    text must fail here rather than on the GPU lease."""
    import importlib.util

    path = KERNELS.parent / "benchmarks" / "mla_trace.py"
    spec_ = importlib.util.spec_from_file_location("mla_trace_test", path)
    tool = importlib.util.module_from_spec(spec_)
    spec_.loader.exec_module(tool)
    traced = tool.traced_kernel(tmp_path)
    source = (tmp_path / "mla_traced.py").read_text()
    assert source.count("_mark(merge[0], WG, ") == 11 and source.count("_mark(merge[0], HALF, ") == 2
    assert all(f"WG: gl.constexpr = {wg}" in source for wg in (0, 1))
    assert traced._SYNC_GROUPS >= tool.TRACE_AT + 2 * len(tool.MARKS) * 132


def test_compare_tool_poisons_only_what_nothing_may_read_and_converts_tables_to_csr():
    """benchmarks/mla_compare.py (the device comparison) on CPU tensors: its NaN poison leaves the oracle unchanged
    for a paged and a contiguous cache, its kernel check finds the NaN a wrong page would bring in, and the CSR it
    hands FlashInfer names each row's used pages in order."""
    import importlib.util

    path = KERNELS.parent / "benchmarks" / "mla_compare.py"
    spec_ = importlib.util.spec_from_file_location("mla_compare_test", path)
    tool = importlib.util.module_from_spec(spec_)
    spec_.loader.exec_module(tool)
    for params in ({**PAGED, "page_size": 16}, RAGGED):
        inputs = _inputs(50, **params)
        ref = REF.forward(**inputs)
        tool._poison(inputs)
        assert torch.isnan(inputs["kv_cache"]).any()
        o, lse = OURS.forward(**inputs)
        assert rel_rms(o, ref[0]) <= TIGHT and rel_rms(lse, ref[1]) <= TIGHT
    inputs = _inputs(51, **PAGED, page_size=16)
    tool._poison(inputs)
    spare = _spare_pages(inputs)
    assert torch.isnan(inputs["kv_cache"][spare]).all()
    wrong = {**inputs, "block_table": inputs["block_table"].clone()}
    wrong["block_table"][1, 0] = int(spare[0])  # row 1 reads a spare page where its first page should be
    o, _ = OURS.forward(**wrong)
    assert torch.isnan(o[1]).any()
    table, lens = inputs["block_table"], inputs["cache_seqlens"]
    indptr, indices = tool.csr_pages(table, lens, 16)
    for b in range(3):
        pages = indices[indptr[b]:indptr[b + 1]]
        assert torch.equal(pages, table[b, :pages.numel()]) and pages.numel() == -(-int(lens[b]) // 16)
