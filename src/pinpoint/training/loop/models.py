"""Models: the built-ins (Keras layers with stable names, the keys of ``train.pinning.layers``)
and a user's own ``package.module:callable`` returning any keras.Model.

A :class:`PinnedModel` is a plain stack of layers; each pinned layer is built (its variables
created) and called under ``tf.device(device)``, so with layers on different devices the
activations cross devices between them (model parallelism, visible as _Send/_Recv pairs).
"""

from __future__ import annotations

import contextlib
import functools
import math
import weakref
from collections.abc import Mapping, Sequence

import keras
import tensorflow as tf

from pinpoint import layer_keys
from pinpoint.errors import ConfigError
from pinpoint.placement import model_units
from pinpoint.tfcompat.api import child_layers, keras_scope_path


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
                f"train.model: got 'cnn' but the data has {features} features, "
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
    raise ConfigError(f"train.model: got {name!r}; use one of mlp, cnn, transformer")


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
    if len(input_shape) > 1:  # the built-ins take flat feature vectors (e.g. streamed images)
        stack.insert(0, keras.layers.Flatten(name="flatten_input"))
    valid = [layer.name for layer in stack]
    pins = layer_keys.resolve_pins(layer_devices, valid, name)  # keys may be patterns: layer name -> key
    model = PinnedModel(stack, pins.by_path(), name=name)
    model.build_all(tuple(input_shape))
    return _remember(model, pins)


def output_units(cfg, data) -> int:
    """The built-ins' output width: the classes, or the label's width for binary/regression."""
    t = cfg.train
    if t.loss in ("sparse_categorical_crossentropy", "categorical_crossentropy") or not t.builtin_model:
        if data.num_classes is None:
            raise ConfigError(
                f"train.num_classes: got None; the data ({data.source}) does not tell how many "
                "classes there are; set train.num_classes"
            )
        return data.num_classes
    shape = data.label_spec.shape
    return int(shape[-1]) if shape.rank else 1


def make_model(cfg, data, layer_devices: Mapping[str, str]) -> keras.Model:
    """The configured model, built (variables created) in the caller's strategy/device scope."""
    t = cfg.train
    if t.builtin_model:
        if isinstance(data.input_shape, dict):
            raise ConfigError(
                f"train.model: got {t.model!r} but the data has several features "
                f"({', '.join(data.input_shape)}); built-in models take one tensor: use your own model"
            )
        return build_model(t.model, data.input_shape, output_units(cfg, data), layer_devices, seed=t.seed)
    return build_user_model(cfg, data, layer_devices)


def build_user_model(cfg, data, layer_devices: Mapping[str, str]) -> keras.Model:
    """Call the user's `package.module:callable` with train.model_args (plus input_shape,
    num_classes and seed where its signature names them); pin layers by their own names."""
    import inspect

    from pinpoint import usercode

    t = cfg.train
    fn = usercode.load_callable(cfg, "train.model", t.model)
    try:
        wants = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        wants = {}
    offered = {"input_shape": data.input_shape, "seed": t.seed}
    if "num_classes" in wants and "num_classes" not in t.model_args:
        offered["num_classes"] = output_units(cfg, data)
    with _pin_variables(layer_devices):
        model = usercode.call(fn, "train.model", t.model, t.model_args, offered, "train.model_args")
        if not isinstance(model, keras.Model):
            raise ConfigError(
                f"train.model: got {t.model!r}; the callable returned a {type(model).__name__}, "
                "not a keras.Model; return a functional, Sequential or subclassed keras.Model"
            )
        if not model.built:
            _build(model, data)
    layers = layer_paths_of(model)
    pins = layer_keys.resolve_pins(layer_devices, layers, t.model)
    for path, device in pins.by_path().items():
        _pin_call(layers[path], device)
    return _remember(model, pins)


# Each built model's resolved train.pinning.layers, for the placement's build (resolved once, here).
_PINS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _remember(model: keras.Model, pins: layer_keys.LayerPins) -> keras.Model:
    if pins.owner:
        _PINS[model] = pins
    return model


def remember_ps_pins(model: keras.Model, layer_devices: Mapping[str, str], name: str) -> keras.Model:
    """parameter_server: keep train.pinning.layers resolved against the built model (the
    placement's layer_pins and conformance), the model having been built unpinned."""
    return _remember(model, layer_keys.resolve_pins(layer_devices, layer_paths_of(model), name))


def layer_pins(model: keras.Model) -> layer_keys.LayerPins | None:
    """train.pinning.layers as resolved when `model` was built (None: no layer pinned)."""
    return _PINS.get(model)


def layer_paths_of(model: keras.Model) -> dict[str, keras.layers.Layer]:
    """{path: layer} for every layer, nested ones as 'outer/inner', in order (what the keys of
    train.pinning.layers are matched against)."""
    out: dict[str, keras.layers.Layer] = {}

    def walk(layer, prefix: str) -> None:
        for child in child_layers(layer):
            path = f"{prefix}{child.name}"
            out.setdefault(path, child)
            walk(child, path + "/")

    walk(model, "")
    return out


def layer_units(model: keras.Model) -> tuple[str, ...]:
    """The layers a plan moves as one piece, by path (placement.units.model_units)."""
    return model_units(model)


def _build(model: keras.Model, data) -> None:
    """Create a subclassed model's variables: call it once on a zero example."""
    def zeros(shape):
        return tf.zeros((1, *shape))

    shape = data.input_shape
    x = {k: zeros(v) for k, v in shape.items()} if isinstance(shape, dict) else zeros(shape)
    try:
        model(x, training=False)
    except Exception as err:  # noqa: BLE001 - the user's model failed on the data's shape
        from pinpoint.usercode import last_line

        raise ConfigError(
            f"train.model: got {model.name!r}; calling it on one example of shape {shape} "
            f"failed ({last_line(err)}); make the model take the data's features"
        ) from None


def _owner_device(layer_devices: Mapping[str, str]) -> str | None:
    """The device of the pinned layer creating a variable now (None: not a pinned layer's): Keras
    builds a layer inside a name scope of its own name, which names the owning layer here."""
    parts = keras_scope_path().split("/")
    for i in reversed(range(len(parts))):  # the innermost layer first, by name or nested path
        for key, device in layer_devices.items():
            if any(layer_keys.key_matches(key, "/".join(parts[j:i + 1])) for j in range(i + 1)):
                return device
    return None


@contextlib.contextmanager
def _pin_variables(layer_devices: Mapping[str, str], *, leave_colocated: bool = False):
    """Create each pinned layer's variables on its device, whatever the model's kind;
    leave_colocated: a variable created with `colocate_with` (an optimizer slot) is left to it."""
    if not layer_devices:
        yield
        return

    def creator(next_creator, **kwargs):
        colocated = leave_colocated and kwargs.get("colocate_with") is not None
        device = None if colocated else _owner_device(layer_devices)
        if device is None:
            return next_creator(**kwargs)
        with tf.device(device):
            return next_creator(**kwargs)

    with tf.variable_creator_scope(creator):
        yield


@contextlib.contextmanager
def ps_variable_pins(layer_devices: Mapping[str, str]):
    """parameter_server: create each pinned layer's variables on its ps task; enter it OUTSIDE
    strategy.scope().

    Why a creator below the strategy's: ParameterServerStrategyV2._create_variable_round_robin
    creates every variable inside its own `ops.device("/job:ps/task:<count % num_ps>")`, which
    overrides any tf.device the model is built under. A creator entered before strategy.scope()
    is the strategy creator's next_creator, so it runs inside that scope and its tf.device (the
    innermost) wins. TF's counter still counts the variable, so unpinned layers keep the
    round-robin slots they have without pins. Optimizer slots arrive with `colocate_with`
    (Keras' add_variable_from_reference): the strategy colocates them with their variable, and
    they are left alone here."""
    with _pin_variables(layer_devices, leave_colocated=True):
        yield


def _pin_call(layer: keras.layers.Layer, device: str) -> None:
    """Run the layer's forward pass under tf.device(device): its input is copied there."""
    call = layer.call

    @functools.wraps(call)
    def pinned(*args, **kwargs):
        with tf.device(device):
            return call(*args, **kwargs)

    layer.call = pinned
