"""Models built from Keras layers with stable names (the keys of ``train.pinning.layers``).

A :class:`PinnedModel` is a plain stack of layers; each pinned layer is built (its variables
created) and called under ``tf.device(device)``, so with layers on different devices the
activations cross devices between them (model parallelism, visible as _Send/_Recv pairs).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import keras
import tensorflow as tf

from pinpoint.errors import ConfigError


class PinnedModel(keras.Model):
    """A sequential stack whose layers may each run on their own device."""

    def __init__(self, stack: Sequence[keras.layers.Layer], layer_devices: Mapping[str, str], **kw):
        super().__init__(**kw)
        self.stack = list(stack)
        self.layer_devices = dict(layer_devices)

    def build_all(self, input_shape) -> None:
        """Create every variable now, each pinned layer's under its device."""
        shape = (None,) + tuple(input_shape)
        for layer in self.stack:
            device = self.layer_devices.get(layer.name)
            if device:
                with tf.device(device):
                    layer.build(shape)
            else:
                layer.build(shape)
            shape = layer.compute_output_shape(shape)
        self.built = True

    def call(self, x, training=False):
        for layer in self.stack:
            device = self.layer_devices.get(layer.name)
            if device:
                # The activation is copied to `device` here: a cross-device edge.
                with tf.device(device):
                    x = layer(x, training=training)
            else:
                x = layer(x, training=training)
        return x


class AttentionBlock(keras.layers.Layer):
    """Pre-norm transformer block: self-attention and an MLP, both residual."""

    def __init__(self, dim: int, heads: int, seed: int, **kw):
        super().__init__(**kw)
        self.dim = dim
        self.norm1 = keras.layers.LayerNormalization(name="norm1")
        self.attn = keras.layers.MultiHeadAttention(
            heads, dim // heads, name="attn", kernel_initializer=keras.initializers.GlorotUniform(seed)
        )
        self.norm2 = keras.layers.LayerNormalization(name="norm2")
        self.mlp1 = keras.layers.Dense(2 * dim, activation="gelu", name="mlp1",
                                       kernel_initializer=keras.initializers.GlorotUniform(seed + 1))
        self.mlp2 = keras.layers.Dense(dim, name="mlp2",
                                       kernel_initializer=keras.initializers.GlorotUniform(seed + 2))

    def build(self, input_shape):
        self.norm1.build(input_shape)
        self.attn.build(input_shape, input_shape)
        self.norm2.build(input_shape)
        self.mlp1.build(input_shape)
        self.mlp2.build(input_shape[:-1] + (2 * self.dim,))
        self.built = True

    def call(self, x, training=False):
        h = self.norm1(x)
        x = x + self.attn(h, h, training=training)
        return x + self.mlp2(self.mlp1(self.norm2(x)))

    def compute_output_shape(self, input_shape):
        return input_shape


class TokenEmbedding(keras.layers.Layer):
    """Split a flat feature vector into tokens, project them and add learned positions."""

    def __init__(self, tokens: int, dim: int, seed: int, **kw):
        super().__init__(**kw)
        self.tokens, self.dim, self.seed = tokens, dim, seed
        self.proj = keras.layers.Dense(dim, name="proj", kernel_initializer=keras.initializers.GlorotUniform(seed))

    def build(self, input_shape):
        width = input_shape[-1] // self.tokens
        self.proj.build((None, self.tokens, width))
        self.pos = self.add_weight(
            shape=(self.tokens, self.dim), name="pos",
            initializer=keras.initializers.RandomNormal(stddev=0.02, seed=self.seed + 7),
        )
        self.built = True

    def call(self, x):
        x = tf.reshape(x, (-1, self.tokens, x.shape[-1] // self.tokens))
        return self.proj(x) + self.pos

    def compute_output_shape(self, input_shape):
        return (input_shape[0], self.tokens, self.dim)


def _dense(units, name, seed, activation=None):
    return keras.layers.Dense(
        units, activation=activation, name=name,
        kernel_initializer=keras.initializers.GlorotUniform(seed),
        bias_initializer="zeros",
    )


def _layers(name: str, features: int, num_classes: int, seed: int) -> list[keras.layers.Layer]:
    if name == "mlp":
        return [
            _dense(128, "dense_1", seed, "relu"),
            _dense(64, "dense_2", seed + 1, "relu"),
            _dense(num_classes, "head", seed + 2),
        ]
    if name == "cnn":
        side = math.isqrt(features)
        if side * side != features:
            raise ConfigError(
                f"config error: train.model: got 'cnn' but the data has {features} features, "
                "not a square image; use model 'mlp' or 'transformer'"
            )
        init = lambda s: keras.initializers.GlorotUniform(seed + s)
        return [
            keras.layers.Reshape((side, side, 1), name="reshape"),
            keras.layers.Conv2D(16, 3, padding="same", activation="relu", name="conv_1", kernel_initializer=init(0)),
            keras.layers.Conv2D(32, 3, padding="same", activation="relu", name="conv_2", kernel_initializer=init(1)),
            keras.layers.MaxPooling2D(2, name="pool"),
            keras.layers.Flatten(name="flatten"),
            _dense(64, "dense_1", seed + 2, "relu"),
            _dense(num_classes, "head", seed + 3),
        ]
    if name == "transformer":
        tokens = 8 if features % 8 == 0 else features
        return [
            TokenEmbedding(tokens, 32, seed, name="embed"),
            AttentionBlock(32, 4, seed + 10, name="block_0"),
            AttentionBlock(32, 4, seed + 20, name="block_1"),
            keras.layers.GlobalAveragePooling1D(name="pool"),
            _dense(num_classes, "head", seed + 30),
        ]
    raise ConfigError(f"config error: train.model: got {name!r}; use one of mlp, cnn, transformer")


def layer_names(name: str, features: int = 64, num_classes: int = 10) -> list[str]:
    return [layer.name for layer in _layers(name, features, num_classes, 0)]


def build_model(
    name: str,
    input_shape: tuple[int, ...],
    num_classes: int,
    layer_devices: Mapping[str, str] | None = None,
    *,
    seed: int = 0,
) -> PinnedModel:
    """Build (and create the variables of) model `name`; `layer_devices`: layer -> physical device."""
    layer_devices = dict(layer_devices or {})
    features = int(math.prod(input_shape))
    stack = _layers(name, features, num_classes, seed)
    valid = [layer.name for layer in stack]
    for layer in layer_devices:
        if layer not in valid:
            raise ConfigError(
                f"config error: train.pinning.layers.{layer}: no layer named {layer!r} in model "
                f"'{name}'; valid names: {', '.join(valid)}"
            )
    model = PinnedModel(stack, layer_devices, name=name)
    model.build_all((features,))
    return model
