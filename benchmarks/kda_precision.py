"""Where kernels/kda/kda_chunked.py's o error comes from: a CPU model of its arithmetic, fp64 but for its roundings.

Each rounding of the kernel (a bf16 store, a bf16 or tf32 tensor-core operand) is one named step of the model, and
the model's o is compared the way the evaluator compares the kernel's: in bf16, with the fp64 oracle's o rounded to
bf16 too. Switching one step off at a time shows what each costs; the presets are the designs the kernel has
shipped. On 2026-12-01 the model put the 2026-11-30 kernel at 4.27e-3 on held-out H1, where the H200 measured
4.29e-3 (benchmarks/RESULTS.md, KDA, issue 19).

    PYTHONPATH=. python benchmarks/kda_precision.py [--preset NAME ...] [--without STEP ...] [--seeds 3]

Prints one row per (shape, seed, design): o and final-state rel_rms. CPU only; a minute or two per design.
"""

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kernels.kda import reference  # noqa: E402

STEPS = ("kg", "gamma_k", "qg", "akk_ops", "aqk_ops", "aqk_store", "m", "w", "beta_v", "u", "s", "x", "v_new", "o")
"""Every rounding the kernel makes, in the order the prep and the scan make them."""
PRESETS = {
    # the 2026-11-30 kernel: bf16 operands everywhere, beta V rounded before the product with M
    "2026-11-30": {"aqk_ops": "bf16", "beta_fold": False},
    # issue 19: Aqk from one tf32 product, beta folded into M's columns
    "tf32_aqk": {"aqk_ops": "tf32", "beta_fold": True},
    # the same with Aqk's remainder stored for a second product in the scan (kernel aqk_lo)
    "tf32_aqk_lo": {"aqk_ops": "tf32", "beta_fold": True, "aqk_lo": True},
    # three bf16 products for Aqk (kernel aqk_ops 1): near-exact operands
    "split_aqk": {"aqk_ops": "exact", "beta_fold": True},
    # tf32_aqk with U = M V formed in the scan, unrounded (kernel m_scan 1)
    "m_scan1": {"aqk_ops": "tf32", "beta_fold": True, "m_scan": 1},
    # tf32_aqk with V' = M (V - (Gamma K) S) in the scan, the difference x rounded to bf16 (kernel m_scan 2)
    "m_scan2": {"aqk_ops": "tf32", "beta_fold": True, "m_scan": 2},
}
HELD_OUT = {
    "H1": {"B": 2, "T": 1000, "H": 4, "K": 128, "V": 128},
    "H2": {"B": 1, "T": 4097, "H": 8, "K": 128, "V": 128},
    "H3": {"B": 2, "T": 1024, "H": 4, "K": 128, "V": 128, "gate": "lower_bound"},
    "H4": {"B": 3, "T": 777, "H": 20, "K": 128, "V": 128, "gate": "mild"},
}


def to_bf16(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.bfloat16).to(torch.float64)


def to_tf32(x: torch.Tensor) -> torch.Tensor:
    """Round to nearest on 10 stored mantissa bits, as cvt.rna.tf32.f32 does."""
    mant, exp = torch.frexp(x)
    return torch.ldexp(torch.round(mant * 2.0**11) / 2.0**11, exp)


def model(inp: dict, design: dict, without: frozenset = frozenset(), chunk: int = 64):
    """The kernel's o and final state under one design, with the steps in `without` done exactly.

    The anchoring (the chunk start, or 16-row blocks past REACH) changes which numbers get rounded but not how
    much (every factor stays a normal number), so the model anchors every 16-row block at the row before it,
    which keeps every factor finite in bf16 for any gate the task draws.
    """
    ops = design["aqk_ops"]

    def rnd(step: str, x: torch.Tensor, how: str = "bf16") -> torch.Tensor:
        if step in without or how == "exact":
            return x
        return to_tf32(x) if how == "tf32" else to_bf16(x)

    q, k, v, g, beta, scale, h0 = (inp[n] for n in ("q", "k", "v", "g", "beta", "scale", "initial_state"))
    B, T, H, K = q.shape
    V = v.shape[-1]
    n = -(-T // chunk)
    qc, kc, vc, gc = (reference._chunks(x, 0, n, chunk) for x in (q, k, v, g))
    bc = reference._chunks(beta.unsqueeze(-1), 0, n, chunk)
    G = gc.cumsum(2)
    g_end = G[:, :, -1:]
    kg = rnd("kg", kc * (g_end - G).exp())
    gamma_k = rnd("gamma_k", kc * G.exp())
    qg = rnd("qg", qc * scale * G.exp())
    akk = torch.zeros(*G.shape[:2], chunk, chunk, dtype=torch.float64)
    aqk = torch.zeros_like(akk)
    for i in range(chunk // 16):
        rows = slice(16 * i, 16 * i + 16)
        anchor = G[:, :, 16 * i - 1:16 * i] if i else torch.zeros_like(G[:, :, :1])
        row_f = (G[:, :, rows] - anchor).exp()
        col = kc * (anchor - G).clamp(max=80.0).exp()  # past the block's own columns: masked, kept finite
        akk[:, :, rows] = rnd("akk_ops", kc[:, :, rows] * row_f) @ rnd("akk_ops", col).transpose(-1, -2)
        q_rows = rnd("aqk_ops", qc[:, :, rows] * scale * row_f, ops)
        aqk[:, :, rows] = q_rows @ rnd("aqk_ops", col, ops).transpose(-1, -2)
    strict = torch.ones(chunk, chunk, dtype=torch.bool).tril(-1)
    lower = (akk * bc).masked_fill(~strict, 0.0)
    aqk = aqk.masked_fill(strict.T, 0.0)
    aqk_hi = rnd("aqk_store", aqk)
    aqk_lo = rnd("aqk_store", aqk - aqk_hi) if design.get("aqk_lo") else torch.zeros_like(aqk)
    eye = torch.eye(chunk, dtype=torch.float64)
    inv = torch.linalg.solve_triangular(eye + lower, eye.expand_as(lower), upper=False, unitriangular=True)
    if design["beta_fold"]:
        m = rnd("m", inv * bc.transpose(-1, -2))
        w, u = rnd("w", m @ gamma_k), rnd("u", m @ vc)
    else:
        m = rnd("m", inv)
        w, u = rnd("w", m @ rnd("gamma_k", bc * kc * G.exp())), rnd("u", m @ rnd("beta_v", bc * vc))
    state = torch.zeros(B * H, K, V, dtype=torch.float64)
    if h0 is not None:
        state = h0.reshape(B * H, K, V).double()
    o = torch.empty(B * H, n, chunk, V, dtype=torch.float64)
    decay = g_end.exp().transpose(-1, -2)
    m_scan = design.get("m_scan", 0)
    for i in range(n):
        s_op = rnd("s", state)
        if m_scan == 2:
            v_new = rnd("v_new", m[:, i] @ rnd("x", vc[:, i] - gamma_k[:, i] @ s_op))
        elif m_scan == 1:
            v_new = rnd("v_new", m[:, i] @ vc[:, i] - w[:, i] @ s_op)
        else:
            v_new = rnd("v_new", u[:, i] - w[:, i] @ s_op)
        o[:, i] = qg[:, i] @ s_op + aqk_hi[:, i] @ v_new + aqk_lo[:, i] @ v_new
        state = state * decay[:, i] + kg[:, i].transpose(-1, -2) @ v_new
    o = o.reshape(B, H, n * chunk, V)[:, :, :T].transpose(1, 2)
    return rnd("o", o), state.reshape(B, H, K, V)


def rel_rms(out: torch.Tensor, ref: torch.Tensor) -> float:
    return float((out - ref).pow(2).mean().sqrt() / ref.pow(2).mean().sqrt())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", action="append", choices=sorted(PRESETS), help="designs (default: all)")
    ap.add_argument("--without", action="append", default=[], choices=STEPS,
                    help="also run each preset with this step exact (repeatable: one row per step)")
    ap.add_argument("--shapes", default=",".join(HELD_OUT), help="comma list of " + ", ".join(HELD_OUT))
    ap.add_argument("--seeds", type=int, default=1)
    args = ap.parse_args()
    for name in args.shapes.split(","):
        for seed in range(args.seeds):
            inp = reference.make_inputs({**HELD_OUT[name], "dtype": "bfloat16"}, seed, "cpu")
            ref_o, ref_s = reference.chunked(**inp)
            ref_o = to_bf16(ref_o)
            for preset in args.preset or list(PRESETS):
                for step in [None, *args.without]:
                    o, s = model(inp, PRESETS[preset], frozenset([step] if step else []))
                    label = preset + (f" without {step}" if step else "")
                    print(f"{name} seed {seed} {label:32s} o {rel_rms(o, ref_o):.3e}  state {rel_rms(s, ref_s):.3e}",
                          flush=True)


if __name__ == "__main__":
    main()
