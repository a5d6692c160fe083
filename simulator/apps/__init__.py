"""Applications: the `fairsim` command and its siblings, sweeps, aggregation, capacity search,
the papers' tables, notebook execution."""
