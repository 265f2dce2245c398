"""``dllm-profile``: measure a hardware profile on this machine's GPU (or CPU with --device cpu).

Measuring needs torch (the ``gpu`` extra); ``--help`` and ``--refit`` do not, so they run from a plain install."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from dllm_offload_sim.profiler.summary import profile_summary
from dllm_offload_sim.costmodel.profile import CPU_ORDERINGS, DEFAULT_CPU_ORDERING
from dllm_offload_sim.traces.topology import topology_preset
from dllm_offload_sim.traces.cli import entry_point, missing_extra


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        prog="dllm-profile",
        description="Measure H2D, grouped GPU expert, CPU expert, non-expert layer and per-forward costs at "
        "LLaDA2 shapes with the runtime's own primitives, and the runtime's own host time per MoE "
        "layer (waiting for the routing, bookkeeping) and on its CPU path (a CPU call in the running "
        "replay, per demand copy issued beside one), and write a versioned profile file.",
        epilog="Example (on the GPU host): dllm-profile --model mini --name h200-mini "
        "--out costmodel/profiles/h200-mini.measured.json; without a GPU: dllm-profile --refit "
        "h200-mini --out h200-mini.refit.json",
    )
    p.add_argument(
        "--model", default="mini", help="a catalogue model or model file (docs/models.md; default mini)"
    )
    p.add_argument("--device", default=None, help="cuda or cpu (default: cuda where torch sees a GPU)")
    p.add_argument(
        "--name", default="", help="profile name (default <gpu>-<model>, e.g. h100-mini on an H100)"
    )
    p.add_argument(
        "--out",
        default=None,
        help="output file (default <name>.measured.json in this directory); an "
        "existing file is not replaced without --overwrite",
    )
    p.add_argument("--overwrite", action="store_true", help="replace --out where it exists")
    p.add_argument(
        "--cpu-threads",
        type=int,
        default=None,
        help="threads of the CPU expert engine (default: the engine's; torch's intra-op threads or "
        "one kt-kernel thread per core); the profile records it and the validator's replay uses "
        "the same",
    )
    p.add_argument(
        "--cpu-engine",
        choices=["auto", "torch", "kt"],
        default="auto",
        help="CPU expert engine to measure: kt (KTransformers' native kernels, kt-kernel), torch (the "
        "PyTorch reference) or auto (kt where installed); recorded in the profile, and the "
        "validator's replay runs the same",
    )
    p.add_argument(
        "--cpu-ordering",
        choices=CPU_ORDERINGS,
        default=DEFAULT_CPU_ORDERING,
        help="how the kt engine's calls are ordered with the GPU's work: host (the runtime's thread starts "
        "the native task after the routing and waits for it), stream (host functions on a CUDA "
        "stream of the engine's own) or direct (the runtime's thread runs the task itself once it "
        "has issued the layer's GPU work); default stream; recorded in the profile",
    )
    p.add_argument("--quick", action="store_true", help="a few points only (tests, smoke runs)")
    p.add_argument(
        "--refit",
        metavar="PROFILE",
        default=None,
        help="measure nothing: fit PROFILE's CPU expert curve again from the timed calls it stores "
        "(after a fix of the fit) and write it to --out (required)",
    )
    args = p.parse_args(argv)
    if args.refit is not None:
        return refit(args.refit, args.out)
    try:
        import torch

        from dllm_offload_sim.profiler.measure import CpuCurveError, default_profile_name, measure_profile
    except ModuleNotFoundError as e:
        print(missing_extra("dllm-profile (measuring)", e.name or "torch", "gpu"), file=sys.stderr)
        return 2
    if args.device is None:
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        topo = topology_preset(args.model)
    except Exception as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("error: --device cuda but no CUDA device is visible; use --device cpu", file=sys.stderr)
        return 2
    if args.cpu_threads is not None and args.cpu_threads < 1:
        print(f"error: --cpu-threads must be >= 1, got {args.cpu_threads}", file=sys.stderr)
        return 2
    name = args.name or default_profile_name(
        torch.cuda.get_device_name(args.device) if args.device.startswith("cuda") else None, topo.name
    )
    out = Path(args.out) if args.out else Path(f"{name}.measured.json")
    if out.exists() and not args.overwrite:  # checked before minutes of measuring
        print(f"error: {out} exists; pass --overwrite to replace it, or --out elsewhere", file=sys.stderr)
        return 2
    try:
        prof = measure_profile(
            topo,
            device=args.device,
            quick=args.quick,
            name=name,
            cpu_threads=args.cpu_threads,
            cpu_engine=args.cpu_engine,
            cpu_ordering=args.cpu_ordering,
            progress=lambda s: print(f"measuring {s} ...", flush=True),
        )
    except CpuCurveError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    prof.save(out)
    print(f"wrote {out}")
    for line in profile_summary(prof):
        print(line)
    return 0


def refit(path: str, out: str | None) -> int:
    """``--refit PROFILE --out NEW``: PROFILE's CPU curve fitted again (:mod:`profiler.refit`), written to NEW."""
    from dllm_offload_sim.costmodel.profile import ProfileError, load_profile
    from dllm_offload_sim.profiler.refit import refit_cpu_expert

    if not out:
        print(
            "error: --refit needs --out (the refitted profile's file; name PROFILE itself to replace it)",
            file=sys.stderr,
        )
        return 2
    try:
        prof = refit_cpu_expert(load_profile(path))
        prof.save(out)
    except (ProfileError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"wrote {out}")
    for line in profile_summary(prof):
        print(line)
    return 0


cli = entry_point(main)  # console entry point ``dllm-profile``


if __name__ == "__main__":
    cli()
