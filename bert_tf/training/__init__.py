"""Distribution strategy, optimizer + schedule, and the reusable custom training loop."""
