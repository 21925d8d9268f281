"""The versions Pinpoint supports: the ranges pyproject.toml declares, the check that refuses a
TensorFlow (or Keras) outside them at start, and the `pinpoint --version` text.

Read from the installed distributions' metadata, not by importing them: the check runs before
every command and must not cost a TensorFlow import. The ends of each range are the versions the
tests run on: requirements.lock (`make test`) and requirements-compat.txt (`make test-compat`).
"""

from __future__ import annotations

from importlib import metadata

from pinpoint.errors import PinpointError

# Distribution -> the range pyproject.toml's dependencies declare (tests/test_package.py holds the
# two equal). TensorFlow's upper end is exclusive of the next minor: Pinpoint reaches into its
# private graph and placement APIs, which change between minors.
SUPPORTED = {
    "tensorflow": ">=2.16,<2.22",
    "keras": ">=3.15,<4",
    "mlflow": ">=3.17,<4",
}
# Refused at start when outside the range: what placement capture depends on. MLflow's API is
# stable enough that pip's resolution of the declared range is the guard.
CHECKED = ("tensorflow", "keras")
# The distribution names a library ships under; the first one installed is the one imported. The
# first is the one pyproject.toml declares: MLflow's client, mlflow-skinny (the full `mlflow`, the
# server and its UI, depends on the same version of it).
_ALIASES = {"tensorflow": ("tensorflow", "tensorflow-cpu", "tensorflow-intel", "tensorflow-macos"),
            "mlflow": ("mlflow-skinny", "mlflow")}


def distribution(name: str) -> str:
    """The distribution pyproject.toml and the locks name for library `name`."""
    return _ALIASES.get(name, (name,))[0]


class VersionError(PinpointError):
    """An installed TensorFlow or Keras outside the supported range."""


def installed(name: str) -> str | None:
    """The installed version of distribution `name` (or of a TensorFlow alias), None if absent."""
    for dist in _ALIASES.get(name, (name,)):
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return None


def in_range(version: str, spec: str) -> bool:
    """PEP 440: does `version` satisfy `spec` (e.g. '2.16.2' in '>=2.16,<2.22')? A pre-release
    of an in-range version counts (a TensorFlow rc a user tries is refused only outside the range)."""
    from packaging.specifiers import SpecifierSet

    return SpecifierSet(spec).contains(version, prereleases=True)


def check_version(name: str, version: str | None) -> None:
    """Raise VersionError (one line: the version found, the range, the pip command) unless
    `version` of distribution `name` is in SUPPORTED."""
    spec = SUPPORTED[name]
    if version is not None and in_range(version, spec):
        return
    got = f"got {version}" if version is not None else "got nothing (not installed)"
    raise VersionError(f'{name}: {got}; Pinpoint supports {name}{spec} — install a version in that range '
                       f'(pip install "{name}{spec}")')


def check_supported() -> None:
    """The start-up check: each CHECKED distribution installed and in its range."""
    for name in CHECKED:
        check_version(name, installed(name))


def version_text() -> str:
    """`pinpoint --version`: Pinpoint's version, then the versions of TensorFlow, Keras and MLflow
    it runs with and the range each is supported in."""
    from pinpoint import __version__

    lines = [f"pinpoint {__version__}"]
    for name, spec in SUPPORTED.items():
        lines.append(f"{name} {installed(name) or 'not installed'} (supported: {spec})")
    return "\n".join(lines)
