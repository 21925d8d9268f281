"""The pipeline's steps as the CLI and the kfp components run them: each does its work through
the library below it and records it in its MLflow step run (the only modules here that both
compute and track)."""
