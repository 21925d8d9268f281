"""The only part of placement/ that drives TensorFlow's runtime: graph collection around a call,
the profiler, the allocator's peak, and the serving tasks' reporting thread. Everything it takes is handed on as
data to the rooms below."""
