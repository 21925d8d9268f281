"""tf.distribute as Pinpoint uses it, for its own loop and for a traced program alike: the one
strategy factory (`strategies`) and the placer's rule for emulated GPUs (`emulation`). Below both
`trace` and `training`, so neither imports the other for it."""
