"""Data: the pretraining TFRecord schema (one place), instance creation, input readers."""
