"""The training engine. `pinpoint train` runs training.command.train_command: one process
(training.tracked -> training.controller -> training.loop's Trainer), a local cluster
(training.launcher) or one task of a cluster (training.task)."""
