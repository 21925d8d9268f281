"""The pieces of a Keras program a plan moves as one, by layer path: what op rows are attributed
to (placement.opgraph.LayerMatcher) and what `pinpoint plan` groups."""

from __future__ import annotations

from collections.abc import Iterable

from pinpoint.tfcompat.api import child_layers


def model_units(model) -> tuple[str, ...]:
    """A model's layers by path: its own layers, and inside a nested keras.Model (a functional
    backbone) its layers; a layer with sublayers of its own (an attention block) is one piece."""
    import keras

    out: list[str] = []

    def walk(layer, prefix: str) -> None:
        for child in child_layers(layer):
            path = f"{prefix}{child.name}"
            if isinstance(child, keras.layers.InputLayer):
                continue  # no ops: nothing to place
            if isinstance(child, keras.Model) and child_layers(child):
                walk(child, path + "/")
            else:
                out.append(path)

    walk(model, "")
    return tuple(out)


def program_units(layers: Iterable) -> tuple[str, ...]:
    """The pieces of a traced program, from every Keras layer it created: the units of each model
    no other layer holds, then each other layer no layer holds (a custom loop's bare layers), by
    name; layers held by another (a block's sublayers, a model's layers) are in their holder's."""
    import keras

    layers = [x for x in layers if not isinstance(x, keras.layers.InputLayer)]
    held: set[int] = set()

    def hold(layer) -> None:
        for child in child_layers(layer):
            if id(child) not in held:
                held.add(id(child))
                hold(child)

    for layer in layers:
        hold(layer)
    out: list[str] = []
    for layer in (x for x in layers if id(x) not in held):
        if isinstance(layer, keras.Model) and child_layers(layer):
            out += model_units(layer)
        else:
            out.append(layer.name)
    return tuple(dict.fromkeys(out))
