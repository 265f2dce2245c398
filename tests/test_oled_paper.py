"""OLED's paper switches (policies/oled.py PAPER_SWITCHES): each on a crafted case where the paper's rule and the
project's decide differently, and each side checked against its definition."""

from __future__ import annotations

import numpy as np
import pytest

from dllm_offload_sim.policies.base import CostHints, ForwardInfo, PolicyContext, PolicyError
from dllm_offload_sim.policies.dispatch import split_misses
from dllm_offload_sim.policies.oled import PAPER_SWITCHES, OLEDPolicy
from dllm_offload_sim.policies.residency import ResidencyDriver
from dllm_offload_sim.policies.select import proportional_slots
from dllm_offload_sim.traces.schema import DENOISE, PREFILL
from dllm_offload_sim.wiring.build import make_policy, policy_config

from simkit import tiny_topology

NAN = float("nan")


class Run:
    """Drives one OLEDPolicy through the ResidencyDriver over hand-made forwards; records each layer's plan."""

    def __init__(
        self, cache: int, n_layers: int = 1, n_experts: int = 8, costs: CostHints | None = None, **kw
    ):
        topo = tiny_topology(n_moe=n_layers, n_experts=n_experts, top_k=1)
        ctx = PolicyContext(topology=topo, cache=cache, costs=costs or CostHints.constant())
        self.policy = OLEDPolicy(**{"layer_adapt": False, "coop": False, **kw})
        self.driver = ResidencyDriver(self.policy, ctx)
        self.driver.start()
        self.n = 0
        self.plans = []

    def forward(self, experts_per_layer, phase=DENOISE, prev=None, own=None, weights=None):
        """One forward: ``experts_per_layer[j]`` is the expert each token row routes to at MoE layer j (top-1)."""
        rows = len(experts_per_layer[0])
        prev = np.full(rows, NAN, np.float32) if prev is None else np.asarray(prev, np.float32)
        own = np.full(rows, NAN, np.float32) if own is None else np.asarray(own, np.float32)
        info = ForwardInfo(
            index=self.n,
            phase=phase,
            n_tokens=rows,
            prev_confidence=prev,
            own_confidence=own,
            masked=np.ones(rows, bool),
        )
        self.driver.begin_forward(info)
        plans = []
        for j, experts in enumerate(experts_per_layer):
            ids = np.asarray(experts, np.int64)[:, None]
            w = (
                np.ones((rows, 1), np.float32)
                if weights is None
                else np.asarray(weights, np.float32)[:, None]
            )
            active, tokens = np.unique(ids, return_counts=True)
            plan = self.driver.decide(info, j, ids, w, active, tokens.astype(np.int64))
            self.driver.end_layer(j, plan)
            plans.append(plan)
        self.driver.end_forward(info)
        self.n += 1
        self.plans.append(plans)
        return plans

    def resident(self, j=0):
        return set(self.driver.resident[j])


def test_every_switch_has_the_projects_side_as_the_default_and_oled_paper_sets_the_papers():
    import inspect

    defaults = {k: v.default for k, v in inspect.signature(OLEDPolicy).parameters.items()}
    pcfg = policy_config("oled_paper")
    for name, (ours, paper) in PAPER_SWITCHES.items():
        assert defaults[name] == ours, name
        assert pcfg[name] == paper, name
    cfg = make_policy(pcfg)
    assert cfg.reads_own_confidence
    assert cfg.stale_order == "id" and cfg.window and not cfg.prefill_in_stats and cfg.resize_at_layer_end
    assert cfg.rho == "paper" and cfg.min_capacity_frac == 0.0 and cfg.max_shift == 0
    for name in ("oled", "oled_priority", "oled_priority_layeradapt"):
        pcfg = policy_config(name)
        assert all(pcfg[k] == ours for k, (ours, _) in PAPER_SWITCHES.items()), name
    ours = make_policy(policy_config("oled"))
    assert not ours.reads_own_confidence and ours.stale_order == "recency" and not ours.window


@pytest.mark.parametrize(
    "name,value",
    [
        ("confidence", "next"),
        ("stale_order", "lfu"),
        ("statistics", "mean"),
        ("resize_at", "never"),
        ("rho", "measured"),
    ],
)
def test_a_switch_outside_its_values_is_refused_by_name(name, value):
    with pytest.raises(PolicyError, match=name):
        OLEDPolicy(**{name: value})


def test_confidence_previous_or_current_decides_which_expert_stays():
    # two rows route to experts 1 and 2, both copied into a one-slot layer. Forward i-1 was sure of row 0, forward i
    # itself is sure of row 1: the project's rule keeps expert 1, the paper's c_t^i keeps expert 2
    kept = {}
    for side in ("previous", "current"):
        r = Run(cache=1, confidence=side)
        r.forward([[1, 2]], prev=[0.9, 0.1], own=[0.1, 0.9])
        kept[side] = r.resident()
    assert kept == {"previous": {1}, "current": {2}}


def test_own_confidence_reaches_only_a_policy_that_reads_it():
    seen = []

    class Spy(OLEDPolicy):
        def begin_forward(self, fwd):
            seen.append(fwd.own_confidence)
            super().begin_forward(fwd)

    for side in ("previous", "current"):
        r = Run(cache=1, confidence=side)
        r.policy.__class__ = Spy
        r.forward([[1, 2]], prev=[0.9, 0.1], own=[0.1, 0.9])
    assert seen[0] is None and seen[1].tolist() == pytest.approx([0.1, 0.9])


def test_current_confidence_without_the_forwards_own_is_a_clear_error():
    r = Run(cache=1, confidence="current")
    info = ForwardInfo(
        index=0, phase=DENOISE, n_tokens=1, prev_confidence=np.ones(1, np.float32), masked=np.ones(1, bool)
    )
    with pytest.raises(PolicyError, match="own confidence"):
        r.driver.begin_forward(info)


def test_stale_order_recency_or_id():
    # experts 1, 5, 3 are used one forward each (in that order) and stay; then expert 6 is copied into the full
    # three-slot layer: two of the stale three stay. By recency 3 and 5 (the last used); by id 1 and 3
    kept = {}
    for side in ("recency", "id"):
        r = Run(cache=3, stale_order=side)
        for e in (1, 5, 3, 6):
            r.forward([[e]])
        kept[side] = r.resident()
    assert kept == {"recency": {6, 3, 5}, "id": {6, 1, 3}}


def _adapt_run(side: dict, forwards, cache=4, interval=2, n_experts=8):
    """Two MoE layers of ``n_experts`` experts, LayerAdapt every ``interval`` decode forwards; returns the run and each
    forward's capacities."""
    r = Run(
        cache=cache,
        n_layers=2,
        n_experts=n_experts,
        layer_adapt=True,
        adapt_interval=interval,
        **{"min_capacity_frac": 0.0, **side},
    )
    caps = []
    for phase, layers in forwards:
        r.forward(layers, phase=phase)
        caps.append(r.driver.caps.copy())
    return r, caps


# three decode forwards whose layers swap their demand and hits; the fourth starts with the reallocation
STAT_FORWARDS = [
    (DENOISE, [[0, 1, 2, 3], [0]]),
    (DENOISE, [[0, 1, 2, 3], [0]]),
    (DENOISE, [[0], [0, 1, 2, 3]]),
    (DENOISE, [[0], [0]]),
]


def test_statistics_ema_or_window_weigh_the_layers_by_their_definitions():
    caps, runs = {}, {}
    for side in ("ema", "window"):
        runs[side], c = _adapt_run({"statistics": side, "smoothing": 0.5}, STAT_FORWARDS, interval=4)
        caps[side] = c[3].tolist()
    # activation ratio a (active of 8) and utilisation u (hits over the 4 slots) of the three forwards, per layer
    plans = runs["ema"].plans[:3]
    a = np.array([[len(p.view.active) for p in f] for f in plans], float) / 8
    u = np.array([[p.n_hits for p in f] for f in plans], float) / 4
    ema_a, ema_u = a[0].copy(), u[0].copy()
    for i in (1, 2):  # EMA with factor 0.5, starting at the first value
        ema_a, ema_u = 0.5 * ema_a + 0.5 * a[i], 0.5 * ema_u + 0.5 * u[i]
    assert caps["ema"] == proportional_slots(ema_a * ema_u, 8, 1, 8).tolist()
    assert caps["window"] == proportional_slots(a.mean(0) * u.mean(0), 8, 1, 8).tolist()
    assert caps["ema"] != caps["window"]


def test_prefill_in_stats_decides_whether_a_prefill_skews_the_capacities():
    # a prefill activates all 8 experts of layer 0 and two of layer 1; then the two layers decode alike
    fwds = (
        [(PREFILL, [list(range(8)), [0, 1] * 4])]
        + [(DENOISE, [[0, 1], [0, 1]])] * 2
        + [(DENOISE, [[0], [0]])]
    )
    caps = {side: _adapt_run({"prefill_in_stats": side}, fwds)[1][-1].tolist() for side in (True, False)}
    assert caps[False] == [4, 4]  # denoising alone: the layers are alike
    assert caps[True][0] > caps[True][1]  # the prefill's activation lifts layer 0


def test_min_capacity_frac_floor_or_none():
    # layer 1 never hits (a new expert each forward), so its weight a * u is 0: at Cache 8 the 25% floor keeps
    # 2 of its slots, without a floor it keeps the one slot every layer keeps
    fwds = [(DENOISE, [[0, 1], [i]]) for i in range(2, 5)] + [(DENOISE, [[0], [5]])]
    caps = {
        f: _adapt_run({"min_capacity_frac": f}, fwds, cache=8, n_experts=16)[1][-1].tolist()
        for f in (0.25, 0.0)
    }
    assert caps == {0.25: [14, 2], 0.0: [15, 1]}


def test_resize_at_forward_start_or_layer_end():
    # layer 0 hits its four residents, layer 1 keeps missing: the reallocation at the third forward's start shrinks
    # layer 1 to one slot. Trimmed at the forward's start it loses one of the two experts the forward then hits;
    # shrunk at its own end it hits both this forward and holds one afterwards
    fwds = [
        (DENOISE, [[0, 1, 2, 3], [0]]),
        (DENOISE, [[0, 1, 2, 3], [1]]),
        (DENOISE, [[0, 1, 2, 3], [0, 1]]),
        (DENOISE, [[0, 1, 2, 3], [0, 1]]),
    ]
    hits, caps = {}, {}
    for side in ("forward_start", "layer_end"):
        r, c = _adapt_run({"resize_at": side}, fwds, interval=3)
        hits[side] = [f[1].n_hits for f in r.plans]
        caps[side] = [x.tolist() for x in c]
    assert caps["forward_start"][2] == [7, 1] and hits["forward_start"][2] == 1
    assert caps["layer_end"][2] == [4, 4] and caps["layer_end"][3] == [7, 1] and hits["layer_end"][2] == 2


def test_rho_curve_or_paper_splits_the_misses_differently():
    # CPU: 1 ms per call plus 0.1 ms per token; a copy 2 ms. Four misses of 2 tokens each, no swaps.
    # curve: c = cpu(2) = 1.2 ms, rho = 1.2 / 3.2 -> round(1.5) = 2 copies;
    # paper: n-bar tau = 2 x cpu(1) = 2.2 ms, rho = 2.2 / 4.2 -> round(2.1) = 2 ... so use 6 misses:
    # curve round(6 x 0.375) = 2, paper round(6 x 0.524) = 3
    costs = CostHints.constant(h2d=2e-3, cpu_per_token=1e-4, cpu_fixed=1e-3)
    n_gpu = {}
    for side in ("curve", "paper"):
        r = Run(cache=8, n_experts=16, coop=True, max_swaps=0, rho=side, costs=costs)
        r.policy.n_bar[2] = 2.0  # the offline n-bar, which the paper's rule does not read
        (plan,) = r.forward([[e for e in range(6) for _ in range(2)]])
        n_gpu[side] = len(plan.to_gpu)
    assert n_gpu == {"curve": 2, "paper": 3}


def test_max_shift_keeps_or_moves_the_transfer_budget():
    # two misses, rho 0.5: stage 1 copies the higher-priority one. Expert 0 costs 5 ms on the CPU, expert 1 10 ms,
    # a copy 1 ms: with a shift of 1 both go to the GPU; with 0 the budget stays one copy and only a swap is allowed
    args = (np.array([0.6, 0.4]), np.array([5e-3, 1e-2]), 0.0, 1e-3, 1, 0.5, 2, 0.0, 4)
    assert split_misses(*args, 1).tolist() == [True, True]
    assert split_misses(*args, 0).tolist() == [False, True]


def test_the_docs_examples_run_oled_paper_and_one_switch_through_the_simulator():
    """docs/policies.md: ``dllm-sim policy=oled_paper cache=40`` and ``dllm-sim policy=oled cache=40
    policy.stale_order=id`` on the default trace (two requests of it here)."""
    from test_configs import _compose

    from dllm_offload_sim.sim.app import run_table

    rows = {}
    for overrides in (["policy=oled_paper"], ["policy=oled", "policy.stale_order=id"], ["policy=oled"]):
        cfg = _compose(*overrides, "cache=40", "trace.requests=[0,1]", "sim.per_forward=false")
        t = run_table(cfg, progress=False)
        rows[overrides[-1]] = float(t.tpot_ms.iloc[0])
        assert t.profile.iloc[0] == "h100-mini"
    assert len(set(rows.values())) == 3  # the paper's reading, one switch of it, and the project's all differ
