"""Requests: the validated `Trace` schema and seeded synthetic workload generators."""

from traces.arrivals import Gamma, LinearRamp, OnOff, Phase, Piecewise, Poisson, Uniform
from traces.closed_loop import ClosedLoop
from traces.lengths import Empirical, Fixed, LogNormal, UniformInt
from traces.schema import Trace, TraceError
from traces.synthetic import ClientSpec, SyntheticWorkload
from traces.vtc_suites import ArtifactSuite, VTCRealTrace, load_vtc_real

__all__ = [
    "ArtifactSuite",
    "VTCRealTrace",
    "load_vtc_real",
    "ClientSpec",
    "ClosedLoop",
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
