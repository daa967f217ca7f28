#!/usr/bin/env python3
"""The coefficients of the float GELU on both backends (kiln/tensor/activation_constants.h, kTail0 .. kTail8).

erfcx(z) = exp(z^2) erfc(z) is written as 2 t P(t) with t = 1 / (1 + z/2) and P a polynomial of degree 8, fitted to
minimise the largest relative error over z in [0, 9.5] (beyond that exp(-z^2) is below float's smallest normal).
The fit is a least-squares fit on Chebyshev points in t, reweighted toward the points of largest error (Lawson's
iteration) until the error is close to equioscillating; the best of the iterations is kept. The coefficients are then
rounded to float32 and the constant term moved by as few float32 steps as needed for P(1) = 1/2 exactly when summed
in float32 (t = 1 at x = 0: gelu'(0) = 1/2 exactly).

    python3 scripts/fit_normal_tail.py        # needs numpy and mpmath (pip install numpy mpmath)

Prints the largest relative error in float64 and with the float32 coefficients, then the coefficients from the
highest degree down, in the order of the Horner steps of tail_polynomial.
"""
import mpmath as mp
import numpy as np

DEGREE, Z_MAX, ITERATIONS, POINTS = 8, 9.5, 400, 6000


def main():
    mp.mp.dps = 30
    t_low = 1 / (1 + Z_MAX / 2)
    t = np.cos(np.linspace(0, np.pi, POINTS)) * (1 - t_low) / 2 + (1 + t_low) / 2
    z = 2 * (1 / t - 1)
    # P(t) = erfcx(z) / (2 t), in high precision.
    target = np.array([float(mp.erfc(mp.mpf(v)) * mp.exp(mp.mpf(v) ** 2)) for v in z]) / (2 * t)
    basis = np.vander(t, DEGREE + 1, increasing=True)
    weights = np.ones_like(t)
    best = None
    for _ in range(ITERATIONS):
        w = weights / target  # relative error
        coeffs, *_ = np.linalg.lstsq(basis * w[:, None], target * w, rcond=None)
        err = (basis @ coeffs - target) / target
        worst = np.max(np.abs(err))
        if best is None or worst < best[1]:
            best = (coeffs.copy(), worst)
        weights = weights * (np.abs(err) / worst + 1e-3) ** 0.3
        weights /= weights.max()
    coeffs, worst = best
    c32 = coeffs.astype(np.float32)

    def sum_at_one(c):  # Horner at t = 1 in float32: fma(p, 1, c) is p + c rounded once
        p = c[-1]
        for v in c[-2::-1]:
            p = np.float32(p + v)
        return p

    for steps in range(64):
        found = None
        for direction in (np.inf, -np.inf):
            c0 = c32[0]
            for _ in range(steps):
                c0 = np.nextafter(c0, np.float32(direction))
            trial = c32.copy()
            trial[0] = c0
            if sum_at_one(trial) == np.float32(0.5):
                found = trial
                break
        if found is not None:
            c32 = found
            break
    else:
        raise SystemExit("no constant term within 64 float32 steps gives P(1) = 1/2")
    err32 = np.max(np.abs((basis @ c32.astype(np.float64) - target) / target))
    print(f"largest relative error: {worst:.3e} (float64 coefficients), {err32:.3e} (float32)")
    for v in c32[::-1]:
        print(repr(float(v)))


if __name__ == "__main__":
    main()
