"""TensorFlow's profiler trace (XSpace) read back: kernel events, receives, the input pipeline's
elements, and the allocator's events. Reads files; runs nothing."""
