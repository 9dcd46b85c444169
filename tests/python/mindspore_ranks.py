"""Launch MindSpore ranks on CPU for the MindSpore front end's tests.

MindSpore lives in a venv of its own (scripts/common.sh: hp_install_mindspore_venv), never in
the torch one: HyperParallel picks its MindSpore platform whenever MindSpore imports.
HP_MINDSPORE_PYTHON names its python; by default the venv that function makes. A launch is
MindSpore's own environment rendezvous: a scheduler process (MS_ROLE=MS_SCHED) and one worker
per rank (MS_ROLE=MS_WORKER, MS_NODE_ID), backend mccl; each costs 20-50 s of start-up and
teardown, so the tests batch every case into few launches.
"""

import json
import os
import socket
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
MINDSPORE_VERSION = "2.10.0"  # scripts/common.sh: HP_MINDSPORE_VERSION


def mindspore_python() -> str:
    """The MindSpore venv's python, or "" when there is none."""
    path = os.environ.get("HP_MINDSPORE_PYTHON") or os.path.join(
        os.path.expanduser("~"), ".cache", "hyper_parallel", f"mindspore-{MINDSPORE_VERSION}", "bin", "python")
    return path if os.path.exists(path) else ""


SKIP_REASON = ("no MindSpore venv (HP_MINDSPORE_PYTHON, or ~/.cache/hyper_parallel/mindspore-"
               f"{MINDSPORE_VERSION} made by scripts/common.sh's hp_install_mindspore_venv): the MindSpore "
               "front end is not tested")


def package_path() -> str:
    """PYTHONPATH for the package: the build tree's copy (with the AOT library) first."""
    build = os.environ.get("HP_BUILD_DIR", os.path.join(ROOT, "build"))
    return os.pathsep.join([os.path.join(build, "python"), os.path.join(ROOT, "python"), HERE])


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(script: str, world: int, out_dir: str, extra_env=None, timeout: float = 600) -> dict:
    """Run `script` on `world` ranks; returns {"results": [rank 0's json, ...], "seconds": wall}.

    Each rank writes out_dir/rank<r>.json; a rank that fails to, or a non-zero exit, raises
    with the ranks' output."""
    python = mindspore_python()
    env = dict(os.environ, MS_SCHED_HOST="127.0.0.1", MS_SCHED_PORT=str(_free_port()), MS_WORKER_NUM=str(world),
               PYTHONPATH=package_path() + os.pathsep + os.environ.get("PYTHONPATH", ""), HP_CASES_OUT=out_dir,
               GLOG_v="3", OMP_NUM_THREADS="1")
    env.pop("CUDA_HOME", None)  # MindSpore otherwise looks for a GPU plug-in and warns
    env.update(extra_env or {})
    start = time.time()
    sched = subprocess.Popen([python, "-c", "import mindspore as ms; ms.set_device('CPU'); "
                              "from mindspore.communication import init; init()"],
                             env=dict(env, MS_ROLE="MS_SCHED"), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                             cwd=out_dir)
    logs = [open(os.path.join(out_dir, f"rank{r}.log"), "w+") for r in range(world)]
    # In out_dir: MindSpore writes rank_<r>/ folders (graphs that failed to compile) where it runs.
    workers = [subprocess.Popen([python, script], env=dict(env, MS_ROLE="MS_WORKER", MS_NODE_ID=str(r)),
                                stdout=logs[r], stderr=subprocess.STDOUT, cwd=out_dir) for r in range(world)]
    try:
        codes = [w.wait(timeout=timeout) for w in workers]
        sched.wait(timeout=60)
    finally:
        for p in workers + [sched]:
            if p.poll() is None:
                p.kill()
    seconds = time.time() - start
    results, problems = [], []
    for r in range(world):
        logs[r].seek(0)
        text = "".join(line for line in logs[r] if "[WARNING]" not in line and "[INFO]" not in line)
        logs[r].close()
        path = os.path.join(out_dir, f"rank{r}.json")
        if codes[r] != 0 or not os.path.exists(path):
            problems.append(f"rank {r} exited {codes[r]}:\n{text[-4000:]}")
        else:
            with open(path) as f:
                results.append(json.load(f))
    if problems:
        raise AssertionError("\n".join(problems))
    return {"results": results, "seconds": seconds}


def write_results(results: dict) -> None:
    """In a rank: its results for the launcher."""
    from mindspore.communication import get_rank

    with open(os.path.join(os.environ["HP_CASES_OUT"], f"rank{get_rank()}.json"), "w") as f:
        json.dump(results, f)
    sys.stdout.flush()
