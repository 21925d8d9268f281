"""`train.pinning.layers` keys matched against a model's layer paths.

A key is a layer name (`block_1_expand`), a nested path (`backbone/block_3`: that layer and every
layer inside it), a glob pattern (`block_[1-8]_*`) or a regular expression (`re:^block_\\d+_add$`).
Names and globs are matched against a layer's path and against its own name; a regular expression
must match either of them in full. Pure string functions: the trainer (training.loop.models) pins the
layers they select, placement scores one conformance rule per key.
"""

from __future__ import annotations

import difflib
import fnmatch
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from pinpoint.errors import ConfigError

FIELD = "train.pinning.layers"
REGEX_PREFIX = "re:"
_GLOB_CHARS = set("*?[")


def field(key: str) -> str:
    """The config field an error about `key` names: train.pinning.layers.<key> for a plain name or
    path, train.pinning.layers for a pattern (its text is quoted after 'got')."""
    return f"{FIELD}.{key}" if re.fullmatch(r"[\w./-]+", key) else FIELD


def is_pattern(key: str) -> bool:
    return key.startswith(REGEX_PREFIX) or bool(_GLOB_CHARS & set(key))


def key_matches(key: str, path: str) -> bool:
    """Does `key` select the layer at `path` (e.g. 'backbone/block_3/conv')?"""
    name = path.rpartition("/")[2]
    if key.startswith(REGEX_PREFIX):
        rx = re.compile(key[len(REGEX_PREFIX):])
        return bool(rx.fullmatch(path) or rx.fullmatch(name))
    if is_pattern(key):
        return fnmatch.fnmatchcase(path, key) or fnmatch.fnmatchcase(name, key)
    if "/" in key:  # a nested path: the layer itself and everything inside it
        return path == key or path.startswith(key + "/")
    return name == key or path == key


def scope_regex(key: str, names: Iterable[str] | None = None) -> str:
    """A regular expression (unanchored) for one name-scope component of the layers `key`
    selects: `names` when known (the layers the key matched in the built model), else the key
    itself (a glob's wildcards stay inside one component)."""
    if names:
        return "|".join(re.escape(n) for n in sorted(set(names), key=lambda n: (-len(n), n)))
    if key.startswith(REGEX_PREFIX):
        return key[len(REGEX_PREFIX):].removeprefix("^").removesuffix("$")
    if "/" in key and not is_pattern(key):
        return re.escape(key)
    out, i = [], 0
    while i < len(key):
        c = key[i]
        if c == "*":
            out.append("[^/]*")
        elif c == "?":
            out.append("[^/]")
        elif c == "[" and "]" in key[i + 1:]:
            j = key.index("]", i + 1)
            body = key[i + 1:j]
            out.append("[" + ("^" + body[1:] if body.startswith("!") else body) + "]")
            i = j
        else:
            out.append(re.escape(c))
        i += 1
    return "".join(out)


def check_key(key: str) -> None:
    """A `re:` key must compile (checked with the config, before anything runs)."""
    if key.startswith(REGEX_PREFIX):
        try:
            re.compile(key[len(REGEX_PREFIX):])
        except re.error as err:
            raise ConfigError(f"{field(key)}: got {key!r}, not a regular expression ({err}); fix the pattern "
                              "after 're:'") from None


def resolve(keys: Iterable[str], paths: Iterable[str], model: str) -> dict[str, str]:
    """{layer path: key} for every layer some key selects. A layer selected by two keys, or a key
    that selects nothing, is a ConfigError naming the keys (and the closest layer names)."""
    paths = list(paths)
    owner: dict[str, str] = {}
    for key in keys:
        check_key(key)
        hits = [p for p in paths if key_matches(key, p)]
        if not hits:
            names = sorted({p.rpartition("/")[2] for p in paths} | set(paths))
            close = difflib.get_close_matches(key.removeprefix(REGEX_PREFIX), names, n=5, cutoff=0.5)
            listed = f"its layers: {', '.join(paths[:12])}" + (", ..." if len(paths) > 12 else "")
            hint = "; ".join(([f"closest: {', '.join(close)}"] if close else []) + ([listed] if not close or len(paths) <= 12 else []))
            raise ConfigError(f"{field(key)}: got {key!r}, which matches no layer of model '{model}'; use a layer "
                              f"name, a nested path, a glob or 're:REGEX' ({hint})")
        for p in hits:
            if p in owner and owner[p] != key:
                raise ConfigError(f"{field(key)}: got {key!r} and {owner[p]!r}, which both match layer "
                                  f"'{p}'; make the keys select disjoint layers")
            owner[p] = key
    return owner


def layers_by_key(owner: Mapping[str, str]) -> dict[str, list[str]]:
    """{key: [layer path, ...]} from resolve()'s {path: key}, in layer order."""
    out: dict[str, list[str]] = {}
    for path, key in owner.items():
        out.setdefault(key, []).append(path)
    return out


@dataclass(frozen=True)
class LayerPins:
    """`train.pinning.layers` resolved once against a built model: every pinned layer's path, the
    key that selected it and its device. Carried from the model's build to the placement's build
    (conformance, the per-layer table) and written to placement.json as `layer_pins`."""

    devices: Mapping[str, str]  # key -> device, as configured (the keys' order)
    owner: Mapping[str, str]  # layer path -> key, in layer order

    def device_of(self, path: str) -> str:
        return self.devices[self.owner[path]]

    def by_path(self) -> dict[str, str]:
        """{layer path: device}: placement.json's `layer_pins`."""
        return {path: self.devices[key] for path, key in self.owner.items()}

    def names_by_key(self) -> dict[str, list[str]]:
        """{key: [layer name, ...]}: the name scopes of the layers each key selected."""
        return {key: [p.rpartition("/")[2] for p in paths] for key, paths in layers_by_key(self.owner).items()}


def resolve_pins(devices: Mapping[str, str], paths: Iterable[str], model: str) -> LayerPins:
    """`resolve` kept with the devices: {key: device} against a model's layer paths."""
    return LayerPins(dict(devices), resolve(devices, paths, model))
