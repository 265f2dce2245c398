"""What runs when, shared by the simulator and the GPU replay: a trace's requests batched into forwards
(:mod:`.batch`) and a MoE layer's expert calls on the GPU and the CPU (:mod:`.timeline`)."""
