"""Data: `fairsim-data` (`download`: list, fetch and verify public datasets) and
`fairsim-trace-stats` (`trace_stats`)."""
