"""fairsim's simulator, in layers that only import downward: `apps` (commands) -> `report`
(run folder, console) -> `metrics` (pure functions of a run's tables) -> `engines` (the runner,
step models, dispatchers) -> `core` (request state, queue, timeline, the policy seam)."""
