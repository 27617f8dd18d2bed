"""KDA task: oracle, seed and our chunked kernel under the Triton CPU interpreter (fp32, small odd shapes)."""

import math
import os

import pytest
import torch

from task_modules import KERNELS, load, spec

REF = load("kda", "reference")
SEED = load("kda", "seed")
OURS = load("kda", "kda_chunked")
BASE = load("kda", "baseline")
TASK = spec("kda")
TOL = TASK["tolerance"]["value"]
# fp32 in the interpreter is exact to rounding, far tighter than the bf16-calibrated task tolerance, so an
# anchoring, padding or masking slip cannot hide under it.
TIGHT = 2e-5


def rel_rms(out: torch.Tensor, ref: torch.Tensor) -> float:
    out, ref = out.double(), ref.double()
    assert torch.isfinite(out).all(), "non-finite output"
    return ((out - ref).pow(2).mean().sqrt() / ref.pow(2).mean().sqrt()).item()


def _inputs(seed: int = 0, **params) -> dict:
    return REF.make_inputs({"dtype": "float32", **params}, seed, "cpu")


def test_task_toml_matches_folder_and_covers_edge_cases():
    assert TASK["name"] == (KERNELS / "kda").name
    assert TASK["outputs"] == ["o", "final_state"]
    cuda = {s["name"] for s in TASK["shapes"]["cuda"]}
    assert cuda == {f"K{i}" for i in range(1, 8)}
    held = [s["params"] for s in TASK["shapes"]["heldout"]]
    assert any(p["T"] % 64 and p["T"] % 16 for p in held), "held-out needs a T off the chunk grid"
    assert any(p.get("gate") == "lower_bound" for p in held), "held-out needs the all g = -5 gate"
    assert any(p["B"] * p["H"] < 132 for p in held), "held-out needs fewer heads than SMs"
    assert all(p.get("h0", True) for p in held), "held-out shapes carry an initial state"


def test_make_inputs_is_deterministic_and_in_contract():
    a = _inputs(3, B=1, T=20, H=2, K=16, V=16)
    b = _inputs(3, B=1, T=20, H=2, K=16, V=16)
    for key in ("q", "k", "v", "g", "beta", "initial_state"):
        assert torch.equal(a[key], b[key])
    assert torch.allclose(a["k"].norm(dim=-1), torch.ones(1), atol=1e-5)
    assert float(a["g"].max()) < 0 and float(a["g"].min()) >= -5
    assert _inputs(0, B=1, T=5, H=1, K=16, V=16, h0=False)["initial_state"] is None
    assert torch.all(_inputs(0, B=1, T=5, H=1, K=16, V=16, gate="lower_bound")["g"] == -5)


@pytest.mark.parametrize("oracle", ["forward", "forward_recurrent"])
def test_oracle_matches_one_hand_step(oracle):
    inp = _inputs(1, B=1, T=1, H=1, K=16, V=16)
    o, s = getattr(REF, oracle)(**inp)
    S = inp["initial_state"][0, 0].double() * inp["g"][0, 0, 0].double().exp()[:, None]
    k, v, q = inp["k"][0, 0, 0].double(), inp["v"][0, 0, 0].double(), inp["q"][0, 0, 0].double()
    S = S + inp["beta"][0, 0, 0].double() * torch.outer(k, v - S.T @ k)
    assert torch.allclose(s[0, 0].double(), S, atol=1e-6)
    assert torch.allclose(o[0, 0, 0].double(), S.T @ (q * inp["scale"]), atol=1e-6)


# fp64 against fp64: the chunked form differs from the recurrence only by rounding (about 4e-16 seen)
EXACT = 1e-12


@pytest.mark.parametrize("params, chunk", [
    ({"B": 1, "T": 1, "H": 2, "K": 16, "V": 16}, None),
    ({"B": 1, "T": 37, "H": 2, "K": 16, "V": 32}, None),
    ({"B": 2, "T": 150, "H": 3, "K": 32, "V": 16, "gate": "lower_bound"}, None),
    ({"B": 2, "T": 130, "H": 1, "K": 16, "V": 16, "gate": "mild", "h0": False}, None),
    ({"B": 1, "T": 100, "H": 2, "K": 16, "V": 16, "gate": "mild"}, 16),
    ({"B": 3, "T": 64, "H": 1, "K": 32, "V": 16, "h0": False}, None),
])
def test_chunked_oracle_matches_the_recurrence(params, chunk):
    """Odd T, T below one chunk, T = 1, whole chunks, h0 on and off, the g = -5 and mild gates, K != V, B > 1, and
    short chunks (many of them, each boundary a hand-off of the state)."""
    inp = _inputs(6, **params)
    ro, rs = REF.recurrence(**inp)
    o, s = REF.chunked(**inp, chunk=chunk)
    assert ro.dtype == o.dtype == s.dtype == torch.float64
    assert rel_rms(o, ro) < EXACT and rel_rms(s, rs) < EXACT


def test_chunked_oracle_shortens_its_chunks_for_steep_gates():
    """exp(-G) of one chunk must stay inside fp64's range: 64 tokens of g = -20 would span 1280 nats, so the chunk
    shrinks (to 16 here); one token past 600 nats runs the recurrence instead. Both stay exact."""
    inp = _inputs(7, B=1, T=90, H=1, K=16, V=16, gate="lower_bound")
    inp["g"] = inp["g"] * 4.0
    assert REF._chunk_len(inp["g"]) == 16
    ro, rs = REF.recurrence(**inp)
    o, s = REF.chunked(**inp)
    assert rel_rms(o, ro) < EXACT and rel_rms(s, rs) < EXACT
    inp["g"][0, 5, 0, 3] = -700.0
    assert REF._chunk_len(inp["g"]) == 0
    o, s = REF.chunked(**inp)
    assert rel_rms(o, REF.recurrence(**inp)[0]) < EXACT


def test_oracle_forward_is_the_chunked_form_in_task_dtypes():
    inp = REF.make_inputs({"B": 1, "T": 70, "H": 2, "K": 16, "V": 16, "dtype": "bfloat16"}, 8, "cpu")
    o, s = REF.forward(**inp)
    co, cs = REF.chunked(**inp)
    assert o.dtype == torch.bfloat16 and s.dtype == torch.float32
    assert torch.equal(o, co.to(torch.bfloat16)) and torch.equal(s, cs.float())


@pytest.mark.parametrize("params", [
    {"B": 1, "T": 37, "H": 2, "K": 16, "V": 16},
    {"B": 2, "T": 23, "H": 1, "K": 32, "V": 16, "gate": "lower_bound", "h0": False},
])
def test_seed_matches_oracle(params):
    inp = _inputs(0, **params)
    o, s = SEED.forward(**inp)
    ro, rs = REF.forward(**inp)
    assert rel_rms(o, ro) < TIGHT and rel_rms(s, rs) < TIGHT


@pytest.mark.parametrize("aqk", [{"aqk_ops": 0}, {"aqk_ops": 1}, {"aqk_ops": 2, "aqk_lo": 1}, {"aqk_lo": 0}])
@pytest.mark.parametrize("params", [
    {"B": 1, "T": 1, "H": 2, "K": 16, "V": 16},
    {"B": 1, "T": 65, "H": 2, "K": 16, "V": 32, "gate": "lower_bound"},
    {"B": 2, "T": 130, "H": 1, "K": 32, "V": 32, "gate": "mild", "h0": False},
])
def test_chunked_matches_oracle(params, aqk):
    """Every Aqk precision mode: one bf16 product, three (split operands), tf32 with the remainder stored for the
    scan, and the shipped CONFIG."""
    inp = _inputs(0, **params)
    o, s = OURS.kda_chunked(**inp, **aqk)
    ro, rs = REF.forward(**inp)
    assert o.shape == ro.shape and o.dtype == inp["v"].dtype and s.dtype == torch.float32
    assert rel_rms(o, ro) < TIGHT and rel_rms(s, rs) < TIGHT


def test_chunked_accumulates_over_k_slices():
    """BK below K runs the preparation's K loop more than once; it must match the single-slice result."""
    inp = _inputs(2, B=1, T=100, H=1, K=32, V=16, gate="mild")
    ro, rs = REF.forward(**inp)
    o, s = OURS.kda_chunked(**inp, BK=16, BVP=16)
    assert rel_rms(o, ro) < TIGHT and rel_rms(s, rs) < TIGHT


@pytest.mark.parametrize("params", [
    {"B": 1, "T": 100, "H": 2, "K": 32, "V": 16, "gate": "lower_bound"},
    {"B": 2, "T": 70, "H": 1, "K": 32, "V": 32, "gate": "mild", "h0": False},
])
def test_two_k_slices_at_the_gate_bound_and_partial_chunks_match_oracle(params):
    """Two K slices, all g = -5 (largest column factors) and a partial chunk, with and without h0."""
    inp = _inputs(4, **params)
    ro, rs = REF.forward(**inp)
    o, s = OURS.kda_chunked(**inp, BK=16, BVP=16)
    assert rel_rms(o, ro) < TIGHT and rel_rms(s, rs) < TIGHT


@pytest.mark.parametrize("params", [
    {"B": 1, "T": 37, "H": 2, "K": 16, "V": 16},
    {"B": 1, "T": 130, "H": 1, "K": 16, "V": 16, "gate": "lower_bound"},
    {"B": 1, "T": 150, "H": 2, "K": 32, "V": 16, "gate": "lower_bound"},
])
def test_one_k_slice_matches_oracle(params):
    """BK = K, one slice (the default BK 32 covers K <= 32 in one): a chunk shorter than 64 rows, and three
    chunks with g = -5 and h0, the last off the 16-row grid, where exponent slips show first."""
    inp = _inputs(5, **params)
    ro, rs = REF.forward(**inp)
    o, s = OURS.kda_chunked(**inp)
    assert rel_rms(o, ro) < TIGHT and rel_rms(s, rs) < TIGHT


@pytest.mark.parametrize("gate", ["lower_bound", "mild"])
def test_default_slices_at_k64_match_oracle(gate):
    """K = 64 with CONFIG: two 32-column K slices, while W = M (Gamma K) is formed in one 64-column slice (the
    slice widths differ on purpose: 32-column W products went wrong on the H200), with a partial chunk."""
    inp = _inputs(6, B=1, T=100, H=2, K=64, V=32, gate=gate)
    ro, rs = REF.forward(**inp)
    o, s = OURS.kda_chunked(**inp)
    assert OURS.CONFIG["BK"] == 32
    assert rel_rms(o, ro) < TIGHT and rel_rms(s, rs) < TIGHT


@pytest.mark.parametrize("cfg", [{"m_scan": 0}, {"m_scan": 1}, {"m_scan": 1, "far_split": 1, "BK": 16},
                                 {"m_scan": 2}, {"m_scan": 2, "prep_split": 1, "aqk_lo": 1},
                                 {"m_scan": 2, "far_split": 1, "prep_split": 1}])
def test_m_applied_in_the_scan_matches_oracle(cfg):
    """Where M is applied (U and W from the prep; U = M V in the scan; V' = M (V - (Gamma K) S) in the scan): a
    partial last chunk (the scan's V rows past T must read as zero), one chunk reaching REACH (the second path),
    h0, K != V and two V-blocks of the scan."""
    inp = _inputs(11, B=1, T=150, H=2, K=32, V=64, gate="mild")
    inp["g"][:, 72:128] = -5.0
    ro, rs = REF.forward(**inp)
    o, s = OURS.kda_chunked(**inp, BV=32, **cfg)
    assert rel_rms(o, ro) < TIGHT and rel_rms(s, rs) < TIGHT


PREP_LAYOUTS = [{"far_split": 1}, {"prep_split": 1}, {"far_split": 1, "prep_split": 1, "wy_warps": 8},
                {"prep_order": 1}, {"far_split": 1, "prep_warps": 8, "prep_nreg": 128},
                {"far_split": 1, "prep_split": 1, "prep_order": 1, "BK": 16}, {"inv_mem": 0},
                {"inv_mem": 0, "prep_split": 1, "far_split": 1, "BK": 16}]


@pytest.mark.parametrize("layout", PREP_LAYOUTS)
def test_prep_layouts_match_config_bit_for_bit(layout):
    """far_split (the second path in its own launch, for flagged chunks only), prep_split (M, W and U in a kernel
    of their own, L through memory), prep_order (heads-fastest grid) and inv_mem (the diagonal blocks of the
    inverse in registers instead of through a scratch slot) change no rounding: o and the final state
    equal CONFIG's bit for bit, on chunks of both paths (chunk 1 decays at g = -5 from row 8 on, so its rows 16 on
    reach REACH; chunks 0 and 2 do not), with a partial last chunk and two K slices in the last layout."""
    inp = _inputs(9, B=2, T=170, H=2, K=32, V=16, gate="mild")
    inp["g"][:, 72:128] = -5.0
    per_chunk = [(-inp["g"][:, c:c + 64].cumsum(1) / math.log(2.0)).max() for c in (0, 64, 128)]
    assert float(per_chunk[1]) >= float(OURS.REACH.value) > max(float(per_chunk[0]), float(per_chunk[2]))
    base = dict(BK=16) if layout.get("BK") else {}
    o1, s1 = OURS.kda_chunked(**inp, **base)
    o2, s2 = OURS.kda_chunked(**inp, **layout)
    assert torch.equal(o1, o2) and torch.equal(s1, s2)
    ro, rs = REF.forward(**inp)
    assert rel_rms(o2, ro) < TIGHT and rel_rms(s2, rs) < TIGHT


def test_far_split_launches_what_it_needs():
    """far_split adds the flagged second launch and prep_split the _kda_wy kernel; CONFIG launches two kernels."""
    inp = _inputs(0, B=1, T=40, H=1, K=16, V=16)
    OURS.kda_chunked(**inp)
    assert set(OURS.LAUNCHED) == {"prep", "scan"}
    OURS.kda_chunked(**inp, far_split=1, prep_split=1)
    assert set(OURS.LAUNCHED) == {"prep", "prep_far", "wy", "scan"}


@pytest.mark.parametrize("name", ["BKK", "fsub_t", "inv_dots", "post_mask", "prep_maxnreg", "anchor_sums"])
def test_chunked_rejects_unknown_launch_parameters(name):
    """Removed experiments (fsub_t is now the only path; the others lost on the H200) must fail loudly, in one
    line, rather than be silently ignored by a benchmark or a tuner that still passes them."""
    inp = _inputs(0, B=1, T=4, H=1, K=16, V=16)
    with pytest.raises(TypeError, match="unknown launch parameters") as err:
        OURS.kda_chunked(**inp, **{name: 1})
    assert name in str(err.value) and "\n" not in str(err.value)


def test_chunked_is_causal_inside_a_chunk():
    """Changing tokens from p on leaves o[:p] untouched, bit for bit (no look-ahead anchor, FLA #1240)."""
    params = {"B": 1, "T": 80, "H": 2, "K": 16, "V": 16}
    inp = _inputs(0, **params)
    other = _inputs(1, **params)
    p = 40  # rows 32..39 share a 16-row sub-chunk and a 64-row chunk with the changed rows
    alt = {key: (val.clone() if torch.is_tensor(val) else val) for key, val in inp.items()}
    for key in ("q", "k", "v", "g", "beta"):
        alt[key][:, p:] = other[key][:, p:]
    o1, _ = OURS.forward(**inp)
    o2, _ = OURS.forward(**alt)
    assert torch.equal(o1[:, :p], o2[:, :p])
    assert not torch.allclose(o1[:, p:], o2[:, p:])


def test_chunked_path_choice_is_causal():
    """A row's products are taken around the chunk start or, once its decay reaches REACH, around 16-row anchors;
    each row's own decay picks. Making the later tokens decay at the g = -5 bound sends them (and the chunk) down
    the second path, and must leave o before them bit for bit."""
    params = {"B": 1, "T": 64, "H": 1, "K": 16, "V": 16, "gate": "mild"}
    inp = _inputs(3, **params)
    p = 24  # rows 16..23 share a 16-row block with rows that change path
    alt = dict(inp, g=inp["g"].clone())
    alt["g"][:, p:] = -5.0
    reach = (-alt["g"][0, :, 0].cumsum(0) / math.log(2.0)).amax(-1)  # per row, the largest log2 decay
    assert float(reach[-1]) >= float(OURS.REACH.value) > float(reach[p - 1]), "the probe must cross REACH after p"
    o1, _ = OURS.forward(**inp)
    o2, _ = OURS.forward(**alt)
    assert torch.equal(o1[:, :p], o2[:, :p])
    assert rel_rms(o2, REF.forward(**alt)[0]) < TIGHT


def test_ignoring_the_initial_state_fails_the_check():
    # the mild gate keeps h0 alive to the last token, so both outputs must notice it
    inp = _inputs(0, B=1, T=37, H=2, K=16, V=16, gate="mild")
    ro, rs = REF.forward(**inp)
    o, s = OURS.forward(**{**inp, "initial_state": None})
    assert rel_rms(o, ro) > TOL and rel_rms(s, rs) > TOL


def test_chunked_rejects_unsupported_head_dims():
    inp = _inputs(0, B=1, T=4, H=1, K=16, V=16)
    inp["q"] = inp["k"] = torch.zeros(1, 4, 1, 24)
    with pytest.raises(ValueError, match="powers of two"):
        OURS.forward(**inp)


def test_baseline_is_pinned_fla_and_right_where_it_runs_or_says_why_not():
    """Where FLA runs (a CUDA machine with it installed) its output must match the oracle on an odd shape; where
    it cannot, calling it must fail in one line that says why, rather than with a NoneType call."""
    assert BASE.NAME == "fla.chunk_kda"
    assert os.environ.get("FLA_FLASH_KDA") == "0" and os.environ.get("FLA_TILELANG") == "0"
    if BASE.available():
        inp = REF.make_inputs({"B": 1, "T": 100, "H": 2, "K": 128, "V": 128, "dtype": "bfloat16"}, 0, "cuda")
        o, s = BASE.forward(**inp)
        ro, rs = REF.forward(**inp)
        assert rel_rms(o, ro) < TOL and rel_rms(s, rs) < TOL
    else:
        with pytest.raises(RuntimeError, match="fla.chunk_kda is unavailable here: ") as err:
            BASE.forward(**_inputs(0, B=1, T=4, H=1, K=16, V=16))
        assert "\n" not in str(err.value)


def test_seed_declares_tunables_it_uses():
    assert set(SEED.CONFIG) == set(SEED.TUNABLES)
    assert all(SEED.CONFIG[k] in SEED.TUNABLES[k] for k in SEED.CONFIG)


@pytest.mark.parametrize("cfg, name", [({"m_scan": 3}, "m_scan"), ({"m_scan": 4}, "m_scan"),
                                       ({"inv_mem": 2}, "inv_mem")])
def test_chunked_rejects_forms_it_has_no_kernel_for(cfg, name):
    """M is applied in the prep or by one of the scan's two forms, the diagonal blocks go through registers or a
    scratch slot; any other value is refused in one line."""
    with pytest.raises(ValueError, match=name) as err:
        OURS.kda_chunked(**_inputs(0, B=1, T=4, H=1, K=16, V=16), **cfg)
    assert "\n" not in str(err.value)
