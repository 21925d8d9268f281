"""TensorFlow's executed graphs as data: what a call ran, op by op, and the op vocabulary.

The lowest room of placement/: nothing here runs TensorFlow or reads a profile. `ops` names
TensorFlow's ops (the one place that spells them); `captured` holds the graphs a call left;
`steps` cuts one training step out of them; `shapes` and `resources` follow tensors through them;
`dumps` reads the graphs TensorFlow dumps for a program run under `pinpoint trace`.
"""
