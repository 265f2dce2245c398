"""Running the reproduction's simulations: traces made once, each job's result kept on disk, worker processes.

A job's result is ``WORK/runs/<job key>.json`` (the job, its fingerprint and its summary row), written atomically
once the simulation ends, so an interrupted ``dllm-reproduce`` resumes with the jobs it had not finished and a result
file is never a partial one. The fingerprint (:func:`fingerprint`) covers what the job's name does not: the
generator settings its trace is made with (or the shipped trace's files), the profile's contents, the policy's
config; a result whose fingerprint differs is run again. A synthetic trace is ``WORK/traces/<fingerprint>/``
(written atomically by the generator).
"""

from __future__ import annotations

import hashlib
import json
import os
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict
from functools import lru_cache
from pathlib import Path

from omegaconf import OmegaConf

from dllm_offload_sim.costmodel.cost_model import CostModel
from dllm_offload_sim.costmodel.profile import load_profile
from dllm_offload_sim.costmodel.testbed import estimate_testbed, paper_testbed
from dllm_offload_sim.reproduce.setups import HardwareSpec, Job, TraceSpec
from dllm_offload_sim.sim.run import simulate
from dllm_offload_sim.traces.atomic import atomic_write_json
from dllm_offload_sim.traces.reader import Trace
from dllm_offload_sim.traces.shipped import DEFAULT_TRACE, shipped_trace_path
from dllm_offload_sim.traces.synth import SynthConfig, calibrated_config, write_synthetic_trace
from dllm_offload_sim.wiring.build import make_policy, policy_config

# the summary columns a result keeps (sim.run's summary has them all)
KEPT = (
    "tpot_ms",
    "ttft_ms",
    "cache_util",
    "hit_rate",
    "h2d_gb",
    "cpu_experts",
    "effective_transfer_ratio",
    "decoded_tokens",
    "decode_forwards",
    "tokens_per_forward",
    "activations",
    "hits",
    "model",
    "profile",
)
# the generator's calibration of each synthetic trace kind, per model
CALIBRATION = {
    ("paper", "mini"): "paper-mini",
    ("paper", "flash"): "paper-flash",
    ("small-trained", "mini"): "small-trained",
    ("small-trained", "flash"): "small-trained",
}


def synth_config(spec: TraceSpec) -> SynthConfig:
    """The generator settings of a synthetic trace spec."""
    return calibrated_config(
        CALIBRATION[(spec.kind, spec.model)],
        model=spec.model,
        n_requests=spec.n_requests,
        max_new_tokens=spec.new_tokens,
        seed=spec.seed,
        **dict(spec.knobs),
    )


@lru_cache(maxsize=None)
def trace_fingerprint(spec: TraceSpec) -> str:
    """A digest of what makes the trace: the generator's settings, or the shipped trace's files."""
    if spec.kind == "real":
        folder = shipped_trace_path(DEFAULT_TRACE)
        return _digest(
            {
                f.name: hashlib.sha1(f.read_bytes()).hexdigest()
                for f in sorted(folder.iterdir())
                if f.is_file()
            }
        )
    return _digest(asdict(synth_config(spec)))


def trace_path(spec: TraceSpec, work: Path) -> Path:
    """The trace ``spec`` names: the shipped real one, or the synthetic one under ``work/traces`` (made if absent)."""
    if spec.kind == "real":
        if spec.model != "mini":
            raise ValueError(f"no real trace of {spec.model} is shipped; the real traces are mini's")
        return shipped_trace_path(DEFAULT_TRACE)
    out = Path(work) / "traces" / trace_fingerprint(spec)
    if not (out / "meta.json").is_file():
        write_synthetic_trace(synth_config(spec), out)
    return out


@lru_cache(maxsize=None)
def _profile_digest(hw: HardwareSpec, model: str) -> str:
    return _digest(cost_model(hw, model).profile.to_dict())


@lru_cache(maxsize=None)
def _policy_digest(name: str) -> str:
    return _digest(OmegaConf.to_container(policy_config(name)))


def fingerprint(job: Job) -> str:
    """A digest of everything a job's result depends on beyond its own fields (module docstring)."""
    return _digest(
        {
            "job": job.key(),
            "trace": trace_fingerprint(job.trace),
            "profile": _profile_digest(job.hardware, job.trace.model),
            "policy": _policy_digest(job.policy.name),
        }
    )


def _digest(obj) -> str:
    return hashlib.sha1(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:16]


def cost_model(hw: HardwareSpec, model: str) -> CostModel:
    """The cost model of host ``hw`` at ``model``'s shape."""
    if hw.name == "testbed":
        return CostModel(estimate_testbed(paper_testbed(model), **dict(hw.testbed_at)))
    return CostModel(load_profile(f"{hw.name}-{model}"))


def run_job(job: Job, path: str) -> dict:
    """Simulate one job on the trace at ``path``; returns its kept summary."""
    trace = Trace.open(path)
    ids = trace.request_ids[: job.trace.n_requests] if job.trace.kind == "real" else None
    cfg = policy_config(job.policy.name)
    for k, v in job.policy.overrides:
        cfg[k] = v
    pol = make_policy(cfg)
    r = simulate(
        trace,
        pol,
        job.cache,
        cost_model(job.hardware, job.trace.model),
        requests=ids,
        dummy_warmup=job.warmup,
    )
    return {k: r.summary[k] for k in KEPT}


def result_path(work: Path, job: Job) -> Path:
    return work / "runs" / f"{job.key()}.json"


def load_result(work: Path, job: Job) -> dict | None:
    """A finished job's summary, or None where it has not run, or its file holds another job or a result of other
    inputs (its fingerprint differs)."""
    p = result_path(work, job)
    if not p.is_file():
        return None
    d = json.loads(p.read_text())
    same = d.get("job") == json.loads(json.dumps(asdict(job), default=str)) and d.get(
        "fingerprint"
    ) == fingerprint(job)
    return d["summary"] if same else None


def _worker(job: Job, path: str, out: str) -> str:
    summary = run_job(job, path)
    atomic_write_json(out, {"job": asdict(job), "fingerprint": fingerprint(job), "summary": summary})
    return out


def run_jobs(jobs: list[Job], work: Path, n_workers: int = 1, progress=None) -> int:
    """Run every job without a result under ``work``; returns how many ran. ``progress``: a callable told each
    finished job (a tqdm bar's ``update``)."""
    work = Path(work)
    todo = [j for j in jobs if load_result(work, j) is None]
    if progress and len(jobs) > len(todo):
        progress(len(jobs) - len(todo))  # resumed
    paths = {}
    for j in todo:  # traces first, in this process (each is written once)
        if j.trace not in paths:
            paths[j.trace] = str(trace_path(j.trace, work))
    (work / "runs").mkdir(parents=True, exist_ok=True)
    if n_workers <= 1:
        for j in todo:
            _worker(j, paths[j.trace], str(result_path(work, j)))
            if progress:
                progress(1)
        return len(todo)
    # the slowest jobs first, so the pool does not end on one long job
    todo.sort(key=lambda j: (j.policy.name not in ("moe_infinity", "finemoe"), j.trace.model != "flash"))
    with ProcessPoolExecutor(max_workers=n_workers) as pool:
        futures = [pool.submit(_worker, j, paths[j.trace], str(result_path(work, j))) for j in todo]
        for f in as_completed(futures):
            f.result()
            if progress:
                progress(1)
    return len(todo)


def default_workers() -> int:
    return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1))
