"""The offloading runtime's primitives on a real device: expert slots, copies, grouped GPU calls, CPU experts, replay."""
