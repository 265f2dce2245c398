"""In-situ CPU expert cost of call7's CPU-path runs vs the profile's model (REPORT.md, finding 15).

Replays the simulator's decisions (same trace, policy, cache, profile) to get each forward's CPU calls
(layers with CPU experts), experts and tokens, and compares the replay's measured CPU compute per
forward (``measured_cpu_compute_s``) with what the profile's curve charges for those calls.

    python validate/results/h200_2026-12-03d/cpu_in_situ.py
"""
import numpy as np, pandas as pd
from hwprofile.cost_model import CostModel
from sim.run import simulate
from traces.reader import Trace
from policies.oled import OLEDPolicy
from policies.ideal import IdealPolicy
from policies.tide import TIDEPolicy
R = 'validate/results/h200_2026-12-03d/call7'
tr = Trace.open('traces/data/llada2_small_humaneval_b16')
cm = CostModel(f'{R}/profile-mini7.json')
fw = pd.read_parquet(f'{R}/fidelity_forwards.parquet')
X, Y, P = [], [], []
for name, make in (("oled", OLEDPolicy), ("ideal", IdealPolicy), ("tide", TIDEPolicy)):
    pol = make(); rec = {}
    orig = pol.decide
    def dec(view, orig=orig, rec=rec):
        d = orig(view)
        if len(d.to_cpu):
            tok = dict(zip(view.missed.tolist(), view.missed_tokens.tolist()))
            f = view.forward.index
            a = rec.setdefault(f, [0, 0, 0, 0.0])
            a[0] += 1; a[1] += len(d.to_cpu); a[2] += sum(tok[e] for e in d.to_cpu)
            a[3] += cm.cpu_call_overhead_s + sum(cm.cpu_expert_seconds(tok[e]) for e in d.to_cpu)
        return d
    pol.decide = dec
    simulate(tr, pol, 40, cm, requests=[0])
    m = fw[(fw.policy == name) & (fw.cache == 40)].reset_index(drop=True)
    for _, r in m.iterrows():
        calls, n, tok, pred = rec.get(int(r.forward), [0, 0, 0, 0.0])
        if n != r.to_cpu: continue
        if calls == 0: continue
        X.append([calls, n, tok, pred]); Y.append(r.measured_cpu_compute_s); P.append(name)
X, Y = np.array(X, float), np.array(Y)
for sel_name in ("oled", "ideal", "tide"):
    sel = np.array([p == sel_name for p in P])
    print(sel_name, "measured / profiled CPU compute:", round(Y[sel].sum() / X[sel, 3].sum(), 3), "per forward", round(Y[sel].mean()*1e3,1), "vs", round(X[sel,3].mean()*1e3,1), "ms; experts per call", round(X[sel,1].sum()/X[sel,0].sum(),1), "tokens per expert", round(X[sel,2].sum()/X[sel,1].sum(),2))
    extra = (Y[sel].sum() - X[sel, 3].sum()) / X[sel, 0].sum()
    print(f"    unexplained per CPU call: {extra * 1e3:.2f} ms")
pm = cm.profile.curves['cpu_expert']
print("profile: call overhead", pm['call_overhead_s']*1e3, "ms; per expert at 1/2/4 tokens", [round(v*1e3,3) for v in pm['seconds'][:3]], "+ dispatch", round(cm.cpu_dispatch_seconds(16)*1e3,3))
