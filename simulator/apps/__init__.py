"""The commands, one subpackage each: `run` (fairsim), `sweeps` (aggregation, replications,
notebooks), `capacity` (fairsim-capacity), `live` (fairsim-serve), `measure` (fairsim-bench,
fairsim-compare, fairsim-calibrate), `papers` (the papers' tables and the validation report),
`data` (fairsim-data, fairsim-trace-stats), `sim2real` (fairsim-fit, fairsim-sim2real);
`common` is what every command shares: how a command ends, the Hydra job harness, the asyncio
loop. The Python API they use is `simulator.api`."""
