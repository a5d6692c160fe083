"""What every command shares: how a command ends (`command`), the Hydra job harness that runs,
records and resumes jobs and sweeps (`hydra_jobs`), the asyncio loop (`event_loop`) and the
user's tokenizer hook (`tokenizer`)."""
