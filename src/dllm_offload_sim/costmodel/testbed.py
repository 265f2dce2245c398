"""The paper's testbeds (§5.1) as profiles: a measured profile carried to another host by published specifications.

The OLED-MoE paper ran LLaDA2.0-mini on an RTX 5090 and LLaDA2.0-flash on an RTX PRO 6000, each over PCIe 5.0 x16
beside a Xeon Platinum 8470Q with 25 dedicated cores. Nobody here can measure those hosts, so
:func:`estimate_testbed` starts from a profile measured on a lent host (the validated H100 one, whose runtime shares
the paper's software structure: Python hooks around grouped GPU calls, pinned copies, a CPU expert engine) and
changes only what the specifications say differs, each change a :class:`Assumed` quantity with its source and a
plausible range:

* **GPU memory bandwidth.** Every GPU curve (grouped expert calls, the layers' non-expert work, the per-forward
  work) gains the time to stream its weights at the testbed's bandwidth instead of the measured GPU's:
  ``t + bytes * (1 / bw_testbed - 1 / bw_measured)``, with both bandwidths the same fraction of their peaks. Launch
  and synchronisation costs, which the measured curves hold, are kept: the same runtime on the same CUDA stack.
* **PCIe.** The copy curve is refitted as the measured latency plus bytes over the testbed's pinned-copy bandwidth.
* **CPU.** A CPU expert streams its weights, so its costs scale with the memory bandwidth the engine reaches
  (:meth:`HardwareProfile.at_memory_bandwidth`): the measured host's bandwidth per engine thread times the
  testbed's dedicated cores, at most a share of the socket's peak.
* **Host terms** (the runtime's own steps per layer and forward) stay as measured.

``dllm-profile-estimate`` writes the two shipped testbed profiles (``rtx5090-mini.estimated.json``,
``rtxpro6000-flash.estimated.json``) at the central values; ``dllm-reproduce`` also runs each end of every range.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from dllm_offload_sim.costmodel.cost_model import fit_h2d
from dllm_offload_sim.costmodel.profile import HardwareProfile, load_profile
from dllm_offload_sim.traces.topology import BYTES_PER_DTYPE, ModelTopology, topology_preset


@dataclass(frozen=True)
class Assumed:
    """A quantity the paper's hosts have that nobody here measured: a central value, a plausible range, a source."""

    value: float
    low: float
    high: float
    unit: str
    source: str

    def __post_init__(self):
        if not self.low <= self.value <= self.high:
            raise ValueError(f"assumed value {self.value} outside its range [{self.low}, {self.high}]")


@dataclass(frozen=True)
class Testbed:
    """One of the paper's hosts, described by what differs from the measured host its profile starts from."""

    name: str  # the profile's machine name (rtx5090, rtxpro6000)
    model: str  # the model shape the paper ran on it (mini, flash)
    gpu: str
    cpu: str
    measured_from: str  # the shipped measured profile's machine (h100)
    gpu_peak_gbps: Assumed  # the testbed GPU's memory bandwidth, peak
    measured_gpu_peak_gbps: Assumed  # the measured GPU's, peak
    gpu_efficiency: Assumed  # the fraction of peak either GPU streams weights at
    pcie_gbps: Assumed  # pinned host-to-device copies
    cpu_mem_gbps: Assumed  # the memory bandwidth the CPU expert engine reaches on the testbed

    @property
    def profile_name(self) -> str:
        return f"{self.name}-{self.model}"

    def assumptions(self) -> dict[str, Assumed]:
        return {
            "gpu_peak_gbps": self.gpu_peak_gbps,
            "measured_gpu_peak_gbps": self.measured_gpu_peak_gbps,
            "gpu_efficiency": self.gpu_efficiency,
            "pcie_gbps": self.pcie_gbps,
            "cpu_mem_gbps": self.cpu_mem_gbps,
        }


H100_SXM_HBM3 = Assumed(
    3350.0,
    3350.0,
    3350.0,
    "GB/s",
    "NVIDIA H100 datasheet: H100 SXM 80GB HBM3, 3.35 TB/s (the lent hosts report 'NVIDIA H100 80GB HBM3')",
)
GDDR7_512BIT = Assumed(
    1792.0,
    1792.0,
    1792.0,
    "GB/s",
    "NVIDIA product pages: 512-bit GDDR7 at 28 Gbps, 1,792 GB/s "
    "(GeForce RTX 5090 and RTX PRO 6000 Blackwell alike)",
)
GPU_EFFICIENCY = Assumed(
    0.8,
    0.6,
    0.9,
    "of peak",
    "assumed: small grouped GEMMs stream weights at 60-90% of peak bandwidth; the same fraction on both GPUs",
)
PCIE5_X16 = Assumed(
    55.1,
    45.0,
    57.0,
    "GB/s",
    "PCIe 5.0 x16 carries 64 GB/s per direction (PCI-SIG); the lent H100 "
    "hosts' pinned copies fit 55.1 GB/s (h100-mini, h100-flash); 45-57 covers consumer and "
    "workstation boards",
)


def xeon_8470q_engine_gbps(measured_gbps: float, measured_threads: int) -> Assumed:
    """The CPU engine's memory bandwidth on the paper's 25 dedicated 8470Q cores, from the measured host's per thread."""
    # 8 channels of DDR5-4800, 8 bytes a transfer: 307.2 GB/s (Intel ARK, 8470Q)
    socket_peak = 8 * 4800e6 * 8 / 1e9
    cap = 0.8 * socket_peak
    central = min(measured_gbps / measured_threads * 25, cap)
    return Assumed(
        round(central, 1),
        round(measured_gbps, 1),
        round(cap, 1),
        "GB/s",
        f"Xeon Platinum 8470Q (Intel ARK): 8 channels of DDR5-4800, {socket_peak:.1f} GB/s a socket; the "
        f"paper's 25 dedicated cores at the measured host's {measured_gbps / measured_threads:.2f} GB/s "
        f"per engine thread ({measured_gbps:.1f} GB/s on {measured_threads} threads), at most 80% of the "
        f"socket's peak; low end: no faster than the measured host",
    )


def paper_testbeds() -> list[Testbed]:
    """Configuration A (RTX 5090, mini) and B (RTX PRO 6000, flash), from the shipped H100 profiles."""
    out = []
    for name, model, gpu in (
        ("rtx5090", "mini", "NVIDIA GeForce RTX 5090 32 GB"),
        ("rtxpro6000", "flash", "NVIDIA RTX PRO 6000 Blackwell 96 GB"),
    ):
        base = load_profile(f"h100-{model}")
        threads = int(base.curves["cpu_expert"].get("threads") or base.stamp.get("cpu_threads"))
        out.append(
            Testbed(
                name=name,
                model=model,
                gpu=gpu,
                cpu="Intel Xeon Platinum 8470Q, 25 dedicated cores",
                measured_from="h100",
                gpu_peak_gbps=GDDR7_512BIT,
                measured_gpu_peak_gbps=H100_SXM_HBM3,
                gpu_efficiency=GPU_EFFICIENCY,
                pcie_gbps=PCIE5_X16,
                cpu_mem_gbps=xeon_8470q_engine_gbps(base.cpu_curve_gbps(), threads),
            )
        )
    return out


def paper_testbed(model: str) -> Testbed:
    """The paper's testbed for ``model`` (mini or flash)."""
    for tb in paper_testbeds():
        if tb.model == model:
            return tb
    raise ValueError(f"the paper ran no testbed for model {model!r}; it ran mini and flash")


@dataclass(frozen=True)
class StreamedBytes:
    """Bytes of weights (and cache) each GPU curve streams, for one model shape."""

    expert: int  # one routed expert
    non_expert_weights: int  # a MoE layer's attention, gate and shared expert
    dense_weights: int  # a dense layer's attention and MLP
    kv_per_token: int  # K and V of one cached position, one layer
    lm_head: int  # the output projection, per forward

    @classmethod
    def of(cls, topo: ModelTopology) -> "StreamedBytes":
        dt = BYTES_PER_DTYPE[topo.dtype]
        attn = dt * topo.hidden * (2 * topo.n_heads + 2 * topo.n_kv_heads) * topo.head_dim
        gate = dt * topo.n_experts * topo.hidden
        return cls(
            expert=topo.expert_bytes,
            non_expert_weights=attn + gate + topo.n_shared_experts * topo.expert_bytes,
            dense_weights=attn + 3 * dt * topo.hidden * topo.dense_intermediate,
            kv_per_token=2 * topo.n_kv_heads * topo.head_dim * dt,
            lm_head=dt * topo.vocab_size * topo.hidden,
        )


def estimate_testbed(
    tb: Testbed,
    gpu_efficiency: float | None = None,
    pcie_gbps: float | None = None,
    cpu_mem_gbps: float | None = None,
) -> HardwareProfile:
    """``tb``'s profile: the measured one carried over at the central assumptions, or at the values given."""
    base = load_profile(f"{tb.measured_from}-{tb.model}")
    topo = topology_preset(tb.model)
    eff = tb.gpu_efficiency.value if gpu_efficiency is None else float(gpu_efficiency)
    pcie = tb.pcie_gbps.value if pcie_gbps is None else float(pcie_gbps)
    cpu = tb.cpu_mem_gbps.value if cpu_mem_gbps is None else float(cpu_mem_gbps)
    extra_s_per_byte = 1 / (eff * tb.gpu_peak_gbps.value * 1e9) - 1 / (
        eff * tb.measured_gpu_peak_gbps.value * 1e9
    )
    out = base.at_memory_bandwidth(cpu)
    b = StreamedBytes.of(topo)
    curves = out.curves
    for name in ("gpu_experts", "gpu_experts_device"):
        c = curves.get(name)
        if c:
            c["seconds"] = [
                [s + n * b.expert * extra_s_per_byte for s in row]
                for n, row in zip(c["experts"], c["seconds"])
            ]
    for name, weights in (("non_expert", b.non_expert_weights), ("dense_layer", b.dense_weights)):
        c = curves[name]
        c["seconds"] = [
            [s + (weights + kv * b.kv_per_token) * extra_s_per_byte for s, kv in zip(row, c["kv_len"])]
            for row in c["seconds"]
        ]
    c = curves["per_forward"]
    c["seconds"] = [s + b.lm_head * extra_s_per_byte for s in c["seconds"]]
    latency, _ = fit_h2d(base.h2d["bytes"], base.h2d["seconds"])
    out.h2d = {**out.h2d, "seconds": [latency + n / (pcie * 1e9) for n in out.h2d["bytes"]]}
    cpu_threads = 25
    out.curves["cpu_expert"]["threads"] = cpu_threads
    lines = "; ".join(
        f"{k} = {v.value:g} {v.unit} [{v.low:g}-{v.high:g}] ({v.source})" for k, v in tb.assumptions().items()
    )
    at = f"GPU efficiency {eff:g}, PCIe {pcie:g} GB/s, CPU engine {cpu:g} GB/s"
    return replace(
        out,
        name=tb.profile_name,
        status="estimated",
        stamp={
            **base.stamp,
            "gpu": f"{tb.gpu} (estimated)",
            "cpu_model": f"{tb.cpu} (estimated)",
            "cpu_threads": cpu_threads,
            "host": "paper testbed (estimated)",
            "measured_from": base.name,
        },
        notes=(
            f"The paper's testbed ({tb.gpu}, {tb.cpu}, PCIe 5.0 x16) estimated by "
            f"dllm_offload_sim/costmodel/testbed.py from the measured profile {base.name}, at {at}. "
            f"Assumptions: {lines}. Host terms (runtime) as measured on {base.name}."
        ),
        path="",
    )
