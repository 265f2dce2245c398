"""The reproduction of the OLED-MoE paper, explained: its setup, a ladder of factors from it to ours, the trace
properties OLED relies on, and every numeric claim beside ours with the factor that moves it (``dllm-reproduce``).

Layered above the simulator (it runs :func:`sim.run.simulate`), torch-free. Modules: :mod:`.setups` (what a run
replays, on what, with which OLED), :mod:`.jobs` (runs, cached and resumable), :mod:`.claims` (the paper's claims
and how each is computed), :mod:`.sensitivity` (trace properties swept), :mod:`.report` (REPRODUCTION.md and its
figures), ``__main__`` (the command).
"""
