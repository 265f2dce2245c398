"""What one rung of the reproduction replays: a trace, a host, an OLED reading, a warm-up, and the policy runs the
paper's claims need on it.

The factor ladder starts at the paper's setup (:data:`PAPER`: its testbeds estimated from their specifications,
paper-calibrated traces of 1,024 new tokens, OLED as the paper writes it, a dummy warm-up) and changes one factor at
a time toward the project's validated setup (the H100 profile, the real trace of 128 new tokens, OLED as the project
reads it). Branches change one factor of a rung without continuing from it: the ends of the testbed's assumptions,
the H200 profile, a cold start.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field, replace

from dllm_offload_sim.policies.oled import PAPER_SWITCHES

MODELS = ("mini", "flash")
CACHES = (40, 100)  # the paper's two budgets (§5.2)
GAP_CACHES = (20, 40, 60, 80, 100)  # Fig. 13's capacities, for the gap to the ideal cache bound
BASELINES = ("moe_infinity", "finemoe", "ktransformers")  # the paper's three systems (§5.1)
LADDER = ("naive_lru", "oled_priority", "oled_priority_layeradapt", "oled")  # Fig. 15a's rungs
OLED_FAMILY = LADDER[1:]
# the switches each OLED rung can feel: Priority's, then LayerAdapt's, then Coop's
RELEVANT_SWITCHES = {
    "oled_priority": ("confidence", "stale_order"),
    "oled_priority_layeradapt": (
        "confidence",
        "stale_order",
        "statistics",
        "prefill_in_stats",
        "min_capacity_frac",
        "resize_at",
    ),
    "oled": tuple(PAPER_SWITCHES),
}
TOKENS_TOTAL = {"mini": 3072, "flash": 2048}  # new tokens replayed per model and rung (requests x length)
REAL_REQUESTS = 6  # requests of the shipped real trace (all of them)


@dataclass(frozen=True)
class HardwareSpec:
    """A host: a shipped measured profile (``h100``, ``h200``) or the paper's ``testbed`` at some assumptions."""

    name: str
    testbed_at: tuple = ()  # (assumption, value) pairs for the testbed (costmodel.testbed); () = central values

    def label(self) -> str:
        if self.name != "testbed":
            return self.name.upper()
        return "paper testbed" + "".join(f", {k} {v:g}" for k, v in self.testbed_at)


@dataclass(frozen=True)
class TraceSpec:
    """A trace of one model: ``paper`` (synthetic, the paper's statistics), ``small-trained`` (synthetic, the shipped
    real traces' statistics), or ``real`` (the shipped collected trace; mini only)."""

    kind: str
    model: str
    new_tokens: int
    n_requests: int
    seed: int = 0
    knobs: tuple = ()  # (SynthConfig field, value) on top of the calibration


@dataclass(frozen=True)
class PolicySpec:
    """A policy config of ``conf/policy/`` with overrides of its fields."""

    name: str
    overrides: tuple = ()  # (field, value) pairs


@dataclass(frozen=True)
class Job:
    """One simulation: a policy at a cache on a trace and a host."""

    trace: TraceSpec
    hardware: HardwareSpec
    policy: PolicySpec
    cache: int
    warmup: bool

    def key(self) -> str:
        return hashlib.sha1(json.dumps(asdict(self), sort_keys=True, default=str).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Setup:
    """One rung (or branch) of the ladder."""

    name: str  # short id (a file-safe word)
    change: str  # what differs from the rung it starts from
    hardware: HardwareSpec
    trace_kind: str  # paper | real (flash: small-trained, no real flash trace exists)
    new_tokens: int
    paper_switches: frozenset  # OLED switches on the paper's side (PAPER_SWITCHES)
    warmup: bool = True
    parent: str | None = None  # the rung it starts from (None: the paper's setup)
    branch: bool = False  # a side step: the ladder does not continue from it

    def trace(
        self, model: str, tokens_total: dict = TOKENS_TOTAL, real_requests: int = REAL_REQUESTS
    ) -> TraceSpec:
        """The trace this rung replays for ``model``: ``tokens_total[model]`` new tokens in requests of
        ``new_tokens`` (the real trace: its first ``real_requests`` requests of 128)."""
        kind = self.trace_kind if (self.trace_kind != "real" or model == "mini") else "small-trained"
        if kind == "real":  # the shipped collected trace, as the main job replays it
            return TraceSpec("real", model, 128, real_requests)
        return TraceSpec(kind, model, self.new_tokens, max(2, tokens_total[model] // self.new_tokens))

    def policy(self, name: str) -> PolicySpec:
        if name not in RELEVANT_SWITCHES:
            return PolicySpec(name)
        on = [s for s in RELEVANT_SWITCHES[name] if s in self.paper_switches]
        return PolicySpec(name, tuple((s, PAPER_SWITCHES[s][1]) for s in on))

    def jobs(
        self,
        models=MODELS,
        caches=CACHES,
        gap_caches=GAP_CACHES,
        tokens_total: dict = TOKENS_TOTAL,
        real_requests: int = REAL_REQUESTS,
    ) -> list[Job]:
        """Every run the claims read on this rung."""
        out = []
        for m in models:
            tr = self.trace(m, tokens_total, real_requests)

            def job(p, c):
                out.append(Job(tr, self.hardware, self.policy(p), c, self.warmup))

            for c in caches:
                for p in (*LADDER, *BASELINES, "belady"):
                    job(p, c)
            for c in gap_caches:
                if c not in caches:
                    job("oled", c)
                    job("belady", c)
            job("full_residency", caches[0])
        return out


ALL_SWITCHES = frozenset(PAPER_SWITCHES)
PAPER = Setup(
    "paper",
    "the paper's setup: its testbeds (estimated), paper-calibrated traces of 1,024 new tokens, "
    "OLED as the paper writes it, a dummy warm-up",
    HardwareSpec("testbed"),
    "paper",
    1024,
    ALL_SWITCHES,
)


def ladder(testbed_ends: dict[str, tuple[float, float]] | None = None) -> list[Setup]:
    """The rungs in order, then the branches. ``testbed_ends``: assumption -> (low, high) for the testbed's branches
    (costmodel.testbed; the defaults are the mini testbed's)."""
    if testbed_ends is None:
        from dllm_offload_sim.costmodel.testbed import paper_testbed

        tb = paper_testbed("mini")
        testbed_ends = {
            k: (tb.assumptions()[k].low, tb.assumptions()[k].high)
            for k in ("cpu_mem_gbps", "pcie_gbps", "gpu_efficiency")
        }
    rungs = [PAPER]

    def step(name, change, **kw):
        prev = rungs[-1]
        rungs.append(replace(prev, name=name, change=change, parent=prev.name, **kw))

    step("h100", "host: the paper's testbed -> the validated H100 profile", hardware=HardwareSpec("h100"))
    step(
        "len128",
        "request length: 1,024 -> 128 new tokens (the same tokens in all: more requests)",
        new_tokens=128,
    )
    step(
        "real",
        "trace: paper-calibrated synthetic -> the real trace (mini: the shipped HumanEval trace of the small "
        "trained model; flash: the synthetic calibration to it)",
        trace_kind="real",
    )
    switches = set(ALL_SWITCHES)
    for s, (ours, paper) in PAPER_SWITCHES.items():
        switches.discard(s)
        step(f"oled_{s}", f"OLED {s}: {paper} -> {ours}", paper_switches=frozenset(switches))
    final = rungs[-1]
    branches = []
    for k, (lo, hi) in testbed_ends.items():
        for end, v in (("low", lo), ("high", hi)):
            # the CPU engine's speed is the least known: both ends; the others' unfavourable end
            if k != "cpu_mem_gbps" and end == "high":
                continue
            branches.append(
                replace(
                    PAPER,
                    name=f"paper_{k}_{end}",
                    change=f"paper testbed with {k} at its {end} end ({v:g})",
                    hardware=HardwareSpec("testbed", ((k, v),)),
                    parent=PAPER.name,
                    branch=True,
                )
            )
    branches.append(
        replace(
            rungs[1],
            name="h200",
            change="host: the H100 profile -> the shipped H200 profile (the main job's default before)",
            hardware=HardwareSpec("h200"),
            parent="h100",
            branch=True,
        )
    )
    branches.append(
        replace(
            final,
            name="cold",
            change="no dummy warm-up: every policy starts from an empty cache",
            warmup=False,
            parent=final.name,
            branch=True,
        )
    )
    return rungs + branches


@dataclass
class Plan:
    """Every job of a list of setups, deduplicated (rungs share the runs their changes do not touch)."""

    setups: list
    models: tuple = MODELS
    caches: tuple = CACHES
    gap_caches: tuple = GAP_CACHES
    tokens_total: dict = field(default_factory=lambda: dict(TOKENS_TOTAL))
    real_requests: int = REAL_REQUESTS
    by_setup: dict = field(init=False)

    def __post_init__(self):
        self.by_setup = {
            s.name: s.jobs(self.models, self.caches, self.gap_caches, self.tokens_total, self.real_requests)
            for s in self.setups
        }

    @classmethod
    def quick(cls, setups: list) -> "Plan":
        """The ladder on short traces, for tests and a first look: rungs of 1,024 tokens replay 128, mini only,
        two requests of each trace, Fig. 13 at three capacities."""
        short = [
            replace(s, new_tokens=min(s.new_tokens, 128) // (8 if s.new_tokens == 128 else 1)) for s in setups
        ]
        return cls(
            short,
            models=("mini",),
            gap_caches=(20, 40, 100),
            tokens_total={"mini": 256, "flash": 256},
            real_requests=2,
        )

    def unique_jobs(self) -> list[Job]:
        seen, out = set(), []
        for jobs in self.by_setup.values():
            for j in jobs:
                if j.key() not in seen:
                    seen.add(j.key())
                    out.append(j)
        return out
