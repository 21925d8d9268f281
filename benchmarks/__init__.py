"""`make bench`: Pinpoint measured side by side with Keras `model.fit` on the same machine.

Every measured run is its own process (`python -m benchmarks.worker SPEC`), because the logical
device layout is fixed once per process. The parent (`python -m benchmarks.run`) interleaves the
A and B runs of each comparison (A B A B ...), so both sides see the same machine load, and
reports the median with min and max of each figure and of each same-round ratio.
"""
