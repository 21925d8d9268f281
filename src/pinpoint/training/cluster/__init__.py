"""A local cluster's processes: the `launcher` (one `pinpoint train --task` process per task,
restarts), `supervise` (starting, watching, stopping them), one `task` of a cluster (TF_CONFIG),
and the `faults` the tests inject."""
