"""`pinpoint trace` and `train.entrypoint`: the user's own training code, unchanged, with capture on.

`gpus` makes the program's GPU names mean emulated GPUs, `recorder` records what the runtime
executed (tf.functions, eager ops, Session.run), `analysis` turns that into placement.json,
`program` runs a script or module as `python` would, `session` ties them to the run folder and
MLflow. See docs/trace.md.
"""
