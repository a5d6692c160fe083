"""Measuring real endpoints with fairsim's metrics: `fairsim-bench` (`bench`, its HTTP client
`bench_client`), `fairsim-compare` (`compare`), `fairsim-calibrate` (`calibrate`)."""
