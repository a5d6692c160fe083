"""The core every layer shares: request state, the waiting queue, the timeline, the policy seam,
the service functions h and the counter log."""
