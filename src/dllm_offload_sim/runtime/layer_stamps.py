"""When a replayed MoE layer's parts happened: the host's stamps and the GPU's timing events, read into one record
per layer (the validator's per-layer timeline, ``validate.layer_timeline``)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class LayerStamps:
    """When one replayed MoE layer's parts happened, in seconds from its forward's start. Host clock: the routing
    on the host, the policy's answer, the CPU call submitted (= answered without one), the last GPU work issued,
    the layer's host work done. GPU clock (from an event at the forward's start; NaN on a CPU device): the layer's
    non-expert work done (its routing computed), its CPU path's start and end (NaN without one) and its output
    complete (both paths joined); the CPU experts computed (a stream-ordered native call's task done, before its
    result's copy; NaN otherwise) and the layer's demand copies landed (NaN without copies)."""

    forward: int
    layer: int
    host_ready_s: float
    host_decided_s: float
    host_submitted_s: float
    host_issued_s: float
    host_end_s: float
    gpu_gate_s: float = float("nan")
    cpu_start_s: float = float("nan")
    cpu_end_s: float = float("nan")
    gpu_end_s: float = float("nan")
    to_gpu: int = 0
    to_cpu: int = 0
    cpu_computed_s: float = float("nan")
    copies_end_s: float = float("nan")


@dataclass
class LayerEvents:
    """One replayed MoE layer's timing events on the GPU's clock, read into its :class:`LayerStamps` once the forward is
    done: the routing computed, the output complete, the CPU path's (start, end), the CPU task done and the demand
    copies landed (None where the layer had none)."""

    stamps: LayerStamps
    gate: object
    end: object
    cpu_path: tuple | None = None
    cpu_computed: object | None = None
    copies: object | None = None

    def stamp(self, begin) -> None:
        """Fill the stamps with each event's seconds after ``begin`` (the forward's start event)."""
        at = lambda e: begin.elapsed_time(e) / 1e3  # noqa: E731
        st = self.stamps
        st.gpu_gate_s, st.gpu_end_s = at(self.gate), at(self.end)
        if self.cpu_path is not None:
            st.cpu_start_s, st.cpu_end_s = at(self.cpu_path[0]), at(self.cpu_path[1])
        if self.cpu_computed is not None:
            st.cpu_computed_s = at(self.cpu_computed)
        if self.copies is not None:
            st.copies_end_s = at(self.copies)
