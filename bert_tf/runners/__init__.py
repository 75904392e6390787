"""The library side of the fine-tuning scripts: one `run(config)` per task family."""
