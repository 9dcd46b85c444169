"""hp-train's learning rate at every step against TorchTitan's schedule, computed here
independently: TorchTitan's lr lambda (torchtitan/components/optimizer/lr_scheduler.py,
LRSchedulersContainer.Config.build) driven by PyTorch's LambdaLR, stepped after each
optimizer step as TorchTitan's trainer steps it, from the same [lr_scheduler] keys.

    lr_schedule_reference.py BIN_DIR WORK_DIR

For each case hp-train trains a tiny Llama for a few steps on one process and logs every
step's lr to metrics.jsonl; each must equal the reference (relative 1e-14). Cases: every
decay_type with decay right after warm-up (TorchTitan's decay_ratio None, hp-train's 1) and
with a stable phase, no warm-up, no decay, a warm-up longer than the run, a decay_ratio
whose step count rounds a half, and a min_lr_factor.
"""
import json
import math
import os
import subprocess
import sys

import torch


def torchtitan_lambda(warmup_steps, decay_ratio, decay_type, min_lr_factor, training_steps):
    """TorchTitan's build(): the phases, then linear_warmup_stable_decay as a function of
    LambdaLR's count (0 before the first optimizer step)."""
    total_steps = training_steps
    warmup_steps = min(int(warmup_steps), total_steps)
    if decay_ratio is not None:
        decay_steps = round(total_steps * decay_ratio)
        if warmup_steps + decay_steps > total_steps:
            decay_steps = total_steps - warmup_steps
    else:
        decay_steps = total_steps - warmup_steps
    stable_steps = total_steps + 1 - warmup_steps - decay_steps

    def lr_lambda(current_step):
        warmup_stable_steps = warmup_steps + stable_steps
        if current_step < warmup_steps:
            return float((current_step + 1) / warmup_steps)
        if current_step < warmup_stable_steps:
            return 1.0
        progress = float(current_step + 1 - warmup_stable_steps) / decay_steps
        if decay_type == "linear":
            adjustment = 1 - progress
        elif decay_type == "sqrt":
            adjustment = 1 - math.sqrt(progress)
        else:
            adjustment = 0.5 * (1.0 + math.cos(math.pi * progress))
        return min_lr_factor + (1 - min_lr_factor) * adjustment

    return lr_lambda


def reference_lrs(lr, steps, case):
    """The lr each of `steps` optimizer steps runs at under LambdaLR, as in TorchTitan's loop."""
    param = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([param], lr=lr)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, torchtitan_lambda(case["warmup_steps"], case["decay_ratio"], case["decay_type"], case["min_lr_factor"],
                               steps))
    out = []
    for _ in range(steps):
        out.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    return out


# decay_ratio None is TorchTitan's default; hp-train spells it 1.
CASES = {
    "linear_no_stable": dict(warmup_steps=3, decay_ratio=None, decay_type="linear", min_lr_factor=0.0),
    "sqrt_no_stable": dict(warmup_steps=3, decay_ratio=None, decay_type="sqrt", min_lr_factor=0.0),
    "cosine_no_stable": dict(warmup_steps=3, decay_ratio=None, decay_type="cosine", min_lr_factor=0.1),
    "linear_stable": dict(warmup_steps=2, decay_ratio=0.5, decay_type="linear", min_lr_factor=0.0),
    "sqrt_stable": dict(warmup_steps=2, decay_ratio=0.5, decay_type="sqrt", min_lr_factor=0.2),
    "cosine_stable": dict(warmup_steps=2, decay_ratio=0.5, decay_type="cosine", min_lr_factor=0.1),
    "ratio_one_clamped": dict(warmup_steps=4, decay_ratio=1.0, decay_type="linear", min_lr_factor=0.0),
    "no_warmup": dict(warmup_steps=0, decay_ratio=None, decay_type="cosine", min_lr_factor=0.0),
    "no_decay": dict(warmup_steps=3, decay_ratio=0.0, decay_type="cosine", min_lr_factor=0.1),
    "warmup_longer_than_run": dict(warmup_steps=15, decay_ratio=None, decay_type="linear", min_lr_factor=0.0),
    "ratio_rounds_half_to_even": dict(warmup_steps=1, decay_ratio=0.25, decay_type="sqrt", min_lr_factor=0.5),
}
STEPS = 10
LR = 3e-3


def hp_train_lrs(bin_dir, work, name, case):
    dump = os.path.join(work, name)
    ratio = 1.0 if case["decay_ratio"] is None else case["decay_ratio"]
    cmd = [os.path.join(bin_dir, "hp-train"), "--parallelism.tensor_parallel_degree", "1",
           "--model.dim", "32", "--model.n_layers", "1", "--model.n_heads", "2", "--model.vocab_size", "64",
           "--model.multiple_of", "16", "--model.max_seq_len", "16", "--training.seq_len", "8",
           "--training.batch_size", "2", "--training.steps", str(STEPS), "--training.lr", repr(LR),
           "--lr_scheduler.warmup_steps", str(case["warmup_steps"]), "--lr_scheduler.decay_ratio", repr(ratio),
           "--lr_scheduler.decay_type", case["decay_type"],
           "--lr_scheduler.min_lr_factor", repr(case["min_lr_factor"]),
           "--training.log_freq", "1", "--validation.enable", "false", "--checkpoint.enable", "false",
           "--metrics.enable_plot", "false", "--metrics.peak_tflops", "1", "--job.dump_folder", dump]
    run = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if run.returncode != 0:
        sys.stdout.write(run.stdout)
        raise SystemExit("FAILED: hp-train exited with %d for case %s" % (run.returncode, name))
    with open(os.path.join(dump, "metrics", "metrics.jsonl")) as f:
        records = [json.loads(line) for line in f if line.strip()]
    return [r["lr"] for r in records], run.stdout


def main():
    bin_dir, work = sys.argv[1], sys.argv[2]
    os.makedirs(work, exist_ok=True)
    failed = False
    for name, case in CASES.items():
        got, out = hp_train_lrs(bin_dir, work, name, case)
        want = reference_lrs(LR, STEPS, case)
        bad = len(got) != len(want) or any(not math.isclose(g, w, rel_tol=1e-14, abs_tol=0) for g, w in zip(got, want))
        schedule = next((line for line in out.splitlines() if "learning rate" in line), "(no schedule line)")
        print("%-26s %s  %s" % (name, "FAIL" if bad else "ok  ", schedule.strip()))
        if bad:
            failed = True
            for step, (g, w) in enumerate(zip(got, want), 1):
                print("  step %2d: hp-train %.17g  TorchTitan %.17g" % (step, g, w))
            if len(got) != len(want):
                print("  hp-train logged %d steps, expected %d" % (len(got), len(want)))
    if failed:
        raise SystemExit("FAILED: hp-train's learning rates differ from TorchTitan's schedule")
    print("every step's lr equals TorchTitan's schedule in %d cases" % len(CASES))


if __name__ == "__main__":
    main()
