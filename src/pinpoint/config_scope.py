"""Which config fields take effect on which training path; a field the user wrote on a path that
ignores it is refused in one line (why it does nothing there, and the fix).

The three paths: Pinpoint's loop with a built-in model (`train.model: mlp`), Pinpoint's loop
with the user's model (`train.model: package.module:callable`), and the user's own training
code (`train.entrypoint`). Only fields the user wrote are checked (pydantic's fields set): a
default never written is never refused. tests/test_config_scope.py walks every field of the
schema on each path and checks that it is refused here or read by the code of that path.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

BUILTIN, USER_MODEL, ENTRYPOINT = "built-in model", "user model", "entrypoint"
PATHS = (BUILTIN, USER_MODEL, ENTRYPOINT)
# How each path is named in a message: the field that chose it.
CHOSEN_BY = {BUILTIN: "a built-in train.model", USER_MODEL: "a user train.model", ENTRYPOINT: "train.entrypoint"}


class NoEffect(NamedTuple):
    paths: frozenset[str]  # the paths that ignore the field
    why: str  # why it does nothing there
    fix: str


def _entrypoint(why: str, fix: str) -> NoEffect:
    return NoEffect(frozenset({ENTRYPOINT}), why, fix)


_MODEL = _entrypoint("your code builds the model", "build it in your code (train.entrypoint_args for its "
                     "arguments), or remove it")
_DATA = _entrypoint("your code reads the data", "read it in your code (train.entrypoint_args for its "
                    "arguments), or remove it")
_COMPILE = _entrypoint("your code compiles the model", "pass it to model.compile in your code, or remove it")
_STEPS = _entrypoint("your code runs the steps", "pass it through train.entrypoint_args, or remove it")
_PLACE = _entrypoint("your code builds the model and places its ops", "put tf.device in your code, or remove it")
_SAMPLED = _entrypoint("Pinpoint samples your program's calls as `pinpoint trace` does",
                       "remove it (the sampled calls are chosen by the program's own calls)")
_MEASURED = _entrypoint("time and memory per device are measured on Pinpoint's own loop only",
                        "use train.model (Pinpoint's loop) to measure them, or remove it")

# Dotted field -> the paths where it has no effect. Every other field takes effect on every path.
NO_EFFECT: dict[str, NoEffect | tuple[NoEffect, ...]] = {
    "train.entrypoint_args": NoEffect(frozenset({BUILTIN, USER_MODEL}), "they are train.entrypoint's ctx.args",
                                      "set train.entrypoint, or remove them"),
    "train.model": _MODEL,
    "train.model_args": (NoEffect(frozenset({BUILTIN}), "the built-in models take no arguments",
                                  "use your own model (train.model: package.module:callable), or remove it"),
                         _MODEL),
    "train.data": _DATA,
    "train.data_args": _DATA,
    "train.features": _DATA,
    "train.label_column": _DATA,
    "train.num_classes": _DATA,
    "train.shuffle_buffer": _DATA,
    "train.synthetic_examples": _DATA,
    "train.loss": _COMPILE,
    "train.from_logits": _COMPILE,
    "train.metrics": _COMPILE,
    "train.optimizer": _COMPILE,
    "train.learning_rate": _COMPILE,
    "train.jit_compile": _COMPILE,
    "train.precision": _entrypoint("your code sets the dtype policy",
                                   "call keras.mixed_precision.set_global_policy in your code, or remove it"),
    "train.seed": _entrypoint("your code seeds its own randomness",
                              "call keras.utils.set_random_seed in your code, or remove it"),
    "train.batch_size": _STEPS,
    "train.steps": _STEPS,
    "train.checkpoint_every": _entrypoint("your code saves its checkpoints",
                                          "call ctx.save(step) (or use ctx.callbacks() with fit), or remove it"),
    "train.pinning.variables": _PLACE,
    "train.pinning.gradients": _PLACE,
    "train.pinning.layers": _PLACE,
    "train.pinning.layers_backward": _PLACE,
    "train.pinning.input": _PLACE,
    "placement.warmup_steps": _SAMPLED,
    "placement.sample_steps": _SAMPLED,
    "placement.timing": _MEASURED,
    "placement.memory": _MEASURED,
    "cluster.gpu_memory": _entrypoint("its fits verdict is made from placement.memory, measured on Pinpoint's "
                                      "own loop only", "use train.model (Pinpoint's loop), or remove it"),
}


class Unless(NamedTuple):
    """A field that does nothing on any path unless another field says so."""

    holds: Callable[[Any], bool]  # on the config: the field takes effect
    condition: str
    fix: str


# Dotted field -> the condition it needs to take effect (checked after the paths').
NEEDS: dict[str, Unless] = {
    "train.synthetic_examples": Unless(lambda cfg: cfg.train.data == "synthetic", "unless train.data is synthetic",
                                       "set train.data: synthetic, or remove it"),
    "train.data_args": Unless(lambda cfg: cfg.train.takes_data_args,
                              "unless train.data is a package.module:callable or an images: folder (they are "
                              "its arguments)", "point train.data at your callable or image folder, or remove them"),
    "train.pinning.layers_backward": Unless(lambda cfg: bool(cfg.train.pinning.layers),
                                            "without train.pinning.layers (it places the pinned layers' backward "
                                            "ops)", "pin layers with train.pinning.layers, or remove it"),
}


def path_of(train: Any) -> str:
    """The path a config's train section chooses."""
    if train.entrypoint:
        return ENTRYPOINT
    return USER_MODEL if ":" in train.model else BUILTIN


def given_fields(model: Any, prefix: str = "") -> list[str]:
    """The dotted fields the user wrote (nested sections walked), in the schema's order."""
    out = []
    for name in type(model).model_fields:
        if name not in model.model_fields_set:
            continue
        value = getattr(model, name)
        if hasattr(type(value), "model_fields"):
            out += given_fields(value, f"{prefix}{name}.")
        else:
            out.append(f"{prefix}{name}")
    return out


def no_effect(cfg: Any) -> tuple[str, Any, str] | None:
    """(field, value, 'has no effect with ...; fix') of the first written field the chosen path
    ignores, or None."""
    path = path_of(cfg.train)
    given = given_fields(cfg)
    found = [(field, rule) for field in given for rule in rules(field) if path in rule.paths]
    if not found:
        return _unmet(cfg, given)
    field, rule = found[0]
    value = _value(cfg, field)
    others = [f for f, _ in found[1:]]
    also = f"; {', '.join(others)} {'has' if len(others) == 1 else 'have'} no effect there either" if others else ""
    return field, value, f"has no effect with {CHOSEN_BY[path]} ({rule.why}); {rule.fix}{also}"


def _unmet(cfg: Any, given: list[str]) -> tuple[str, Any, str] | None:
    for field in given:
        need = NEEDS.get(field)
        if need and not need.holds(cfg):
            return field, _value(cfg, field), f"has no effect {need.condition}; {need.fix}"
    return None


def _value(cfg: Any, field: str) -> Any:
    for part in field.split("."):
        cfg = getattr(cfg, part)
    return cfg


def rules(field: str) -> tuple[NoEffect, ...]:
    rule = NO_EFFECT.get(field, ())
    return (rule,) if isinstance(rule, NoEffect) else rule


def refused_on(field: str, path: str) -> bool:
    return any(path in rule.paths for rule in rules(field))
