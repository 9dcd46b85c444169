#!/usr/bin/env python3
"""The fused kernel's exp polynomial (src/loss/kernel/cross_entropy_cpu_kernel_impl.h, exp_of_nonpositive):
e^r ~ 1 + r + r^2 q(r) on |r| <= ln 2 / 2 (the Cody-Waite remainder, with a little room for
n's rounding), q of degree 4 fitted by Remez' exchange to the least maximal *relative* error.
Fixing the two leading coefficients at 1 keeps the last two Horner steps exact-ish (an FMA
adding 1) and e^0 exactly 1. Prints the coefficients (highest first, as the kernel's Horner
steps take them), the fit's error, and the float32 Horner evaluation's worst error measured
against float64 on a dense grid (each step one rounding, as a fused FMA).

    ~/.cache/hyper_parallel/torch-2.15.0/bin/python scripts/exp_polynomial.py [DEGREE_OF_Q]
"""

import math
import sys

import numpy as np


def remez(degree, half_width, iterations=30):
    # q approximates f = (e^r - 1 - r) / r^2 with weight r^2 / e^r: then the weighted error of
    # q is the relative error of 1 + r + r^2 q(r) against e^r.
    f = lambda r: (np.expm1(r) - r) / (r * r)
    w = lambda r: r * r / np.exp(r)
    n = degree + 2
    ref = np.cos(np.linspace(math.pi, 0, n)) * half_width
    ref[np.abs(ref) < 1e-9] = 1e-9
    grid = np.linspace(-half_width, half_width, 200001)
    grid = grid[np.abs(grid) > 1e-12]
    for _ in range(iterations):
        a = np.zeros((n, n))
        for i, x in enumerate(ref):
            a[i, : degree + 1] = x ** np.arange(degree + 1)
            a[i, degree + 1] = (-1) ** i / w(x)
        coef = np.linalg.solve(a, f(ref))[: degree + 1]
        err = w(grid) * (np.polyval(coef[::-1], grid) - f(grid))
        # The new reference: the largest error of each run of one sign, n of them.
        cuts = np.flatnonzero(np.diff(np.sign(err))) + 1
        runs = np.split(np.arange(len(err)), cuts)
        ext = [run[np.argmax(np.abs(err[run]))] for run in runs]
        while len(ext) > n:
            ext = ext[1:] if abs(err[ext[0]]) < abs(err[ext[-1]]) else ext[:-1]
        ref = grid[ext]
    return coef, np.max(np.abs(err)), grid


def main():
    degree = int(sys.argv[1]) if len(sys.argv) > 1 else 4
    coef, fit_error, grid = remez(degree, math.log(2) / 2 * 1.0002)
    print("coefficients of q, highest first:", ", ".join(repr(float(c)) for c in coef[::-1]))
    print(f"fit: relative error {fit_error:.3g} ({fit_error * 2**23:.3f} float32 ulp at most)")
    r = grid.astype(np.float32)
    p = np.full_like(r, np.float32(coef[-1]))
    for c in list(coef[-2::-1]) + [1.0, 1.0]:
        p = (p.astype(np.float64) * r + np.float32(c)).astype(np.float32)
    rel = np.abs(p.astype(np.float64) / np.exp(r.astype(np.float64)) - 1)
    print(f"float32 Horner with fused FMAs: relative error {rel.max():.3g} ({rel.max() * 2**23:.3f} ulp at most)")


if __name__ == "__main__":
    main()
