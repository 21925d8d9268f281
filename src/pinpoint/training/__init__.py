"""The training engine. `pinpoint train` runs training.command.train_command: one process
(training.run -> training.loop.controller -> training.loop.trainer's Trainer), a local cluster
(training.cluster.launcher) or one task of a cluster (training.cluster.task)."""
