"""Models users train, as user code for the benchmark's configs (`train.code_dir: benchmarks`):
keras.applications MobileNetV2 and ResNet50 without weights on 32x32 RGB images, and the images.
Imported as the top-level module `real_models` by Pinpoint and the Keras peer alike."""

from __future__ import annotations

SIDE = 32
CLASSES = 10
EXAMPLES = 512


def images(n: int = EXAMPLES, side: int = SIDE, classes: int = CLASSES, seed: int = 0):
    """Random 32x32 RGB images with integer labels (the step time does not depend on the values)."""
    import numpy as np
    import tensorflow as tf

    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, side, side, 3)).astype("float32")
    y = rng.integers(0, classes, size=n).astype("int64")
    return tf.data.Dataset.from_tensor_slices((x, y))


def mobilenetv2(input_shape, num_classes, alpha: float = 1.0):
    import keras

    return keras.applications.MobileNetV2(input_shape=input_shape, alpha=alpha, weights=None, classes=num_classes,
                                          classifier_activation=None)


def resnet50(input_shape, num_classes):
    import keras

    return keras.applications.ResNet50(input_shape=input_shape, weights=None, classes=num_classes,
                                       classifier_activation=None)
