"""The simulator: engines, timelines, metrics, run folders and the `fairsim` command."""
