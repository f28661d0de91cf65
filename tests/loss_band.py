#!/usr/bin/env python3
"""tests/loss_band.py F32_METRICS BF16_METRICS STEPS WINDOW MIN_FALL: the bf16-against-fp32
training band of tests/test_bf16_train.sh (which derives it), shared with
tests/test_emu_train.sh. With fall = mean of steps 1..WINDOW minus mean of the last WINDOW
steps: the fp32 run falls by more than MIN_FALL (else the check is void), the bf16 run's
last-WINDOW mean lies within 0.1 of the fp32 fall of the fp32 run's, and the bf16 run
falls by at least 0.9 of the fp32 fall. Exit 1 with the figures when it does not hold."""
import json
import sys


def losses(path):
    return {r["step"]: r["loss"] for r in map(json.loads, open(path)) if "loss" in r}


def main():
    f, b = losses(sys.argv[1]), losses(sys.argv[2])
    steps, w, min_fall = int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5])
    if not (sorted(f) == sorted(b) == list(range(1, steps + 1))):
        sys.exit("expected steps 1..%d in both runs, got %d and %d" % (steps, len(f), len(b)))
    mean = lambda d, a, z: sum(d[s] for s in range(a, z + 1)) / (z - a + 1)
    first, last = (1, w), (steps - w + 1, steps)
    fall_f = mean(f, *first) - mean(f, *last)
    fall_b = mean(b, *first) - mean(b, *last)
    diff = abs(mean(b, *last) - mean(f, *last))
    print("fp32 %.4f -> %.4f (fall %.4f); bf16 %.4f -> %.4f (fall %.4f); |end diff| %.4f <= band %.4f"
          % (mean(f, *first), mean(f, *last), fall_f, mean(b, *first), mean(b, *last), fall_b, diff, 0.1 * fall_f))
    if fall_f <= min_fall:
        sys.exit("the float32 run fell only %.4f <= %.4f: the check is void" % (fall_f, min_fall))
    if diff > 0.1 * fall_f:
        sys.exit("final losses differ by %.4f > 0.1 x %.4f" % (diff, fall_f))
    if fall_b < 0.9 * fall_f:
        sys.exit("bf16 fell %.4f < 0.9 x %.4f" % (fall_b, fall_f))


if __name__ == "__main__":
    main()
