"""What-if (diagnosis, not a prediction the tool makes): the 2026-12-03e mini sweep's CPU-path policies
re-simulated with the sweep's own profile plus ``runtime.cpu_stall_per_copy_s`` = 50 us, the excess per
demand copy read off the sweep itself (REPORT.md finding 16), to see whether the model's form closes the
gap. The shipped profiles never carry a value read off a validation run; the profiler measures it.

    python validate/results/h200_2026-12-03e/stall_whatif.py
"""
import json
import tempfile

from hwprofile.cost_model import CostModel
from sim.app import make_policy, policy_config
from sim.run import simulate
from traces.reader import Trace
from validate.run_store import RunStore

R = "validate/results/h200_2026-12-03e"
STALL_S = 50e-6
rows = RunStore(f"{R}/mini").finished_rows()
trace = Trace.open("traces/data/llada2_small_humaneval_b16")
prof = json.load(open(f"{R}/profile-mini.json"))
prof["runtime"]["cpu_stall_per_copy_s"] = STALL_S
with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as fh:
    json.dump(prof, fh)
base, stall = CostModel(f"{R}/profile-mini.json"), CostModel(fh.name)
print(f"{'policy':14s} cache  measured  predicted (error)   with {STALL_S * 1e6:.0f} us/copy (error)")
for pol in ("oled", "ideal", "tide", "ktransformers", "lru"):
    for c in (20, 40, 100):
        t = rows[(rows.policy == pol) & (rows.cache == c) & (rows.metric == "tpot_ms")].iloc[0]
        a, b = (simulate(trace, make_policy(policy_config(pol)), c, cm, requests=[0]).summary["tpot_ms"]
                for cm in (base, stall))
        new = t.predicted * b / a
        print(f"{pol:14s} {c:5d} {t.measured:9.2f} {t.predicted:9.2f} ({100 * (t.predicted / t.measured - 1):+5.1f}%)"
              f" {new:9.2f} ({100 * (new / t.measured - 1):+5.1f}%)")
