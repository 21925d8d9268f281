"""The one seam between Pinpoint and TensorFlow's and Keras' private names.

Every private name Pinpoint reads, calls or patches is registered in `targets.TARGETS` (its module,
the signature Pinpoint relies on, what it is used for); patches go through `patches.Patches`,
which replaces only registered names and undoes them in reverse order; `check.require()` verifies
the registry against the installed TensorFlow when a command starts capturing or emulating, and
fails in one line naming TensorFlow's version and the target. `graphs` holds the one copy of
graph collection and of output-shape extraction. Importing this package does not import
TensorFlow (docs/trace.md#private-apis lists the targets).
"""
