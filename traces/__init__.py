"""Requests: the validated `Trace` schema, seeded synthetic workloads, trace-file loaders and
transforms, and built-in tenant mixes."""

from traces.arrivals import Diurnal, Gamma, LinearRamp, OnOff, Phase, Piecewise, Poisson, Uniform
from traces.closed_loop import ClosedLoop
from traces.inference_perf import InferencePerfWorkload
from traces.lengths import Empirical, Fixed, LogNormal, UniformInt
from traces.loaders import load, load_azure, load_mooncake, load_table, load_vidur, load_vtc_real
from traces.mixes import arena_like, servegen_like
from traces.multiapp import AbusiveUsers, AppSpec, MultiAppWorkload
from traces.prefix_mix import PrefixHeavyMix
from traces.replay import LengthsWorkload, Tenants, TraceWorkload
from traces.schema import Trace, TraceError
from traces.servegen import ServeGenPool
from traces.synthetic import ClientSpec, SyntheticWorkload
from traces.transforms import (
    AssignClients,
    ClientTimeout,
    FilterLengths,
    SampleRescale,
    ScaleTokens,
    ScaleToRate,
    Window,
    merge,
)
from traces.vtc_suites import ArtifactSuite, VTCRealTrace

__all__ = [
    "InferencePerfWorkload",
    "PrefixHeavyMix",
    "AbusiveUsers",
    "AppSpec",
    "MultiAppWorkload",
    "AssignClients",
    "ClientTimeout",
    "FilterLengths",
    "LengthsWorkload",
    "SampleRescale",
    "ScaleToRate",
    "ScaleTokens",
    "ServeGenPool",
    "Tenants",
    "TraceWorkload",
    "Window",
    "arena_like",
    "load",
    "load_azure",
    "load_mooncake",
    "load_table",
    "load_vidur",
    "merge",
    "servegen_like",
    "ArtifactSuite",
    "VTCRealTrace",
    "load_vtc_real",
    "ClientSpec",
    "ClosedLoop",
    "Diurnal",
    "Empirical",
    "Fixed",
    "Gamma",
    "LinearRamp",
    "LogNormal",
    "OnOff",
    "Phase",
    "Piecewise",
    "Poisson",
    "SyntheticWorkload",
    "Trace",
    "TraceError",
    "Uniform",
    "UniformInt",
]
