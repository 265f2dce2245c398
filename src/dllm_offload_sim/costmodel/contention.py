"""A CPU call and the demand copies beside it share host memory: when each of them ends.

The CPU expert engine streams the CPU experts' weights from host DRAM while the copy engine reads the copied
experts' weights from the same DRAM. While both run, each moves slower than alone: the CPU call by the factor
``1 + cpu_slowdown``, the copies by ``1 + copies_slowdown`` (profile ``runtime.cpu_slowdown_beside_copies`` and
``runtime.copies_slowdown_beside_cpu``, measured by ``dllm-profile``); whichever has work left once the other ends goes
on at its own speed. The simulator's closed form and its event loop both time a layer's two paths with
:func:`overlapped_ends`.
"""

from __future__ import annotations

from dataclasses import dataclass

# The probe that measured ``runtime.cpu_stall_per_copy_s`` in profiles before the slowdowns: a CPU call over this many
# experts of 1 token, beside this many demand copies that outlasted it; its value was the copies' delay over the
# call, per copy, so ``stall * copies`` is the delay over one call's length
STALL_PROBE_EXPERTS, STALL_PROBE_COPIES = 8, 24


@dataclass(frozen=True, slots=True)
class OverlapEnds:
    """When a layer's CPU call and its demand copies end, each slowed while the other ran beside it, and how much
    later than alone each ends."""

    cpu_end_s: float
    copies_end_s: float
    cpu_delay_s: float = 0.0
    copies_delay_s: float = 0.0


def overlapped_ends(
    cpu_start: float,
    cpu_end: float,
    copies_start: float,
    copies_end: float,
    cpu_slowdown: float,
    copies_slowdown: float,
) -> OverlapEnds:
    """The ends of a CPU call and a batch of copies that would run over ``[cpu_start, cpu_end]`` and
    ``[copies_start, copies_end]`` alone, when each runs ``1 + slowdown`` times slower while the other runs."""
    s = max(cpu_start, copies_start)
    rc, rh = cpu_end - s, copies_end - s  # the work left to each when both run, in seconds alone
    if rc <= 0 or rh <= 0 or (cpu_slowdown <= 0 and copies_slowdown <= 0):
        return OverlapEnds(cpu_end, copies_end)
    tc, th = rc * (1 + cpu_slowdown), rh * (1 + copies_slowdown)  # each one's rest at the shared speed
    if tc <= th:  # the CPU call ends first; the copies' rest runs alone
        cpu, copies = s + tc, s + tc + rh - tc / (1 + copies_slowdown)
    else:
        cpu, copies = s + th + rc - th / (1 + cpu_slowdown), s + th
    return OverlapEnds(cpu, copies, cpu - cpu_end, copies - copies_end)


def slowdown_from_stall(stall_per_copy_s: float, probe_call_s: float) -> float:
    """The shared slowdown that the old per-copy probe's ``stall_per_copy_s`` reads as: its copies outlasted its call
    (``probe_call_s`` alone), so they ran beside it for the call's whole length, and the delay it read over all of
    them (``stall * STALL_PROBE_COPIES``) is the copies' slowdown over that length."""
    if stall_per_copy_s <= 0 or probe_call_s <= 0:
        return 0.0
    return stall_per_copy_s * STALL_PROBE_COPIES / probe_call_s
