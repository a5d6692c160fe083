"""Many runs at once: `fairsim-aggregate` over a sweep's job folders, replications and their
statistics, executing the notebooks."""
