"""The model: a small CNN for 8x8x1 images, split over two devices by `pinning.layers`."""

import keras


def build_model(input_shape, num_classes, seed=0, filters=16):
    """A functional CNN returning logits (no softmax: the loss takes `from_logits`).

    Pinpoint passes `input_shape` (one example, no batch dimension), `num_classes` and `seed`
    because the signature names them; `filters` comes from `train.model_args`. The layer names
    are the keys of `pinning.layers` in config.yaml.
    """

    # One seed per layer: the same seed everywhere would give layers of equal shape equal weights.
    def init(i):
        return keras.initializers.GlorotUniform(seed=seed + i)

    inputs = keras.Input(shape=tuple(input_shape), name="image")
    x = keras.layers.Conv2D(filters, 3, padding="same", activation="relu", kernel_initializer=init(0), name="conv_1")(
        inputs
    )
    x = keras.layers.Conv2D(
        2 * filters, 3, padding="same", activation="relu", kernel_initializer=init(1), name="conv_2"
    )(x)
    x = keras.layers.MaxPooling2D(2, name="pool")(x)
    x = keras.layers.Flatten(name="flatten")(x)
    x = keras.layers.Dense(64, activation="relu", kernel_initializer=init(2), name="dense")(x)
    logits = keras.layers.Dense(num_classes, kernel_initializer=init(3), name="head")(x)
    return keras.Model(inputs, logits, name="digits_cnn")
