"""Lease 45's partial flash sweep (Cache 40, H100 host): each run's stored repeats against the simulator's prediction.

    dllm-synth --model flash --n-requests 1 --max-new-tokens 128 --out /tmp/flash_b16 --quiet
    python validation/h100-native/lease45/flash-partial/predict.py /tmp/flash_b16
    python validation/h100-native/lease45/flash-partial/predict.py /tmp/flash_b16 2.5e-4   # runtime.cpu_busy_gpu_s set

The sweep stopped when the lease's device time ran out: no run has its 3 repeats, so ``dllm-validate`` wrote no
fidelity table. The prediction is the one the validator would make (``validate.fidelity.plan_run``, with the decision
time the run's repeats were charged); the trace is ``dllm-synth``'s seeded flash trace, as the lease generated it.
"""
import glob
import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from dllm_offload_sim.costmodel import CostModel
from dllm_offload_sim.costmodel.profile import load_profile
from dllm_offload_sim.traces.reader import Trace
from dllm_offload_sim.validate.fidelity import plan_run
from dllm_offload_sim.wiring.build import make_policy, policy_config

here = Path(__file__).parent
trace = Trace.open(sys.argv[1])
profile = load_profile(here / "profile-flash.json")
if len(sys.argv) > 2:  # a what-if: the busy-GPU term the lease's profile predates, set by hand
    profile.runtime["cpu_busy_gpu_s"] = float(sys.argv[2])
cost = CostModel(profile)
for d in sorted(glob.glob(str(here / "runs" / "*_c40"))):
    name = Path(d).name[:-4]
    reps = [json.load(open(f)) for f in sorted(glob.glob(f"{d}/repeats/*.json"))]
    measured = [r["summary"]["tpot_ms"] for r in reps]
    plan = plan_run(trace, lambda n=name: make_policy(policy_config(n, [])), name, 40, cost, [0],
                    charge=tuple(reps[0]["charge"]))
    predicted = plan.sim.summary["tpot_ms"]
    print(f"{name:18s} TPOT predicted {predicted:6.1f} ms, measured {', '.join(f'{m:.1f}' for m in measured)} "
          f"({len(measured)} of 3 repeats; {(predicted / np.median(measured) - 1) * 100:+.1f}% against their median)")
    sim = plan.sim.per_forward
    sim = sim[sim.phase != 0]
    rep = pd.read_parquet(f"{d}/repeats/0_forwards.parquet")
    rep = rep[(rep.phase != 0) & rep.measured]
    both = sim.merge(rep[["forward", "cpu_path_s"]], on="forward", suffixes=("_predicted", "_measured"))
    if both.cpu_path_s_predicted.mean() > 0:
        print(f"{'':18s} CPU path per decode forward (repeat 0): predicted {both.cpu_path_s_predicted.mean() * 1e3:.1f} "
              f"ms, measured {both.cpu_path_s_measured.mean() * 1e3:.1f}")
