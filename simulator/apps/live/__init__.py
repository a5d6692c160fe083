"""`fairsim-serve`: the command (`serve`), the OpenAI-compatible HTTP server that drives a live
session with the wall clock (`server`), and its Prometheus metrics (`metrics`)."""
