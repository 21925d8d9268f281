"""A GradientTape training loop that splits two layers over two GPUs with `tf.device`."""
