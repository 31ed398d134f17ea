"""Trace-driven simulation of the real scheduling engine in virtual time, and the POC report."""

from __future__ import annotations

from gpupool.sim.results import RunResult
from gpupool.sim.scenario import Scenario, load_scenario
from gpupool.sim.simulator import Simulation, simulate
from gpupool.sim.sources import JobSpec, SimInputError

__all__ = ["JobSpec", "RunResult", "Scenario", "SimInputError", "Simulation", "load_scenario", "simulate"]
