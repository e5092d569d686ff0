"""An emulated Kubernetes API server that behaves like NVIDIA's GPU Operator on a seeded fleet (no Django)."""

from simulator.core import Simulator, SimulatorConfig

__all__ = ["Simulator", "SimulatorConfig"]
