"""MLA decode task: oracle inputs, seed and our split-KV kernel under the Triton CPU interpreter."""

import math

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


def test_empty_splits_are_never_merged(monkeypatch):
    """Row 0 has length 1, so splits 1-3 are empty there; NaN scratch would leak into o or lse if merged."""
    monkeypatch.setitem(OURS.CONFIG, "BLOCK_N", 32)
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
