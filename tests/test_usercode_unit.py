"""Where user code and files are looked up (config paths, PINPOINT_CODE_DIR) and how a user
callable is imported and called, without TensorFlow."""

from __future__ import annotations

import sys

import pytest

from pinpoint.config import load_config
from pinpoint.errors import ConfigError
from tests.conftest import make_config

pytestmark = pytest.mark.unit


def _write(path, train):
    return make_config("u", train={"strategy": "none", **train}, path=path)


def test_code_dir_defaults_to_the_config_folder_and_relative_paths_resolve_against_it(tmp_path):
    cfg = load_config(_write(tmp_path / "proj" / "c.yaml", {"model": "pkg.m:build", "data": "tfrecord:data/*.rec",
                                                             "features": {"x": {}, "label": {"dtype": "int64"}}}))
    assert cfg.train.code_dir == str(tmp_path / "proj")
    assert cfg.train.data == f"tfrecord:{tmp_path / 'proj' / 'data' / '*.rec'}"
    rel = load_config(_write(tmp_path / "proj" / "d.yaml", {"model": "pkg.m:build", "code_dir": "../src"}))
    assert rel.train.code_dir == str(tmp_path / "src")


def test_a_builtin_config_gets_no_code_dir_so_its_digest_does_not_depend_on_where_it_lives(tmp_path):
    a = load_config(_write(tmp_path / "a" / "c.yaml", {"model": "mlp"}))
    b = load_config(_write(tmp_path / "b" / "c.yaml", {"model": "mlp"}))
    assert a.train.code_dir is None and a.digest() == b.digest()


def test_the_run_folders_copy_of_a_user_config_keeps_its_digest(tmp_path):
    from pinpoint.config import config_to_yaml

    cfg = load_config(_write(tmp_path / "proj" / "c.yaml", {"model": "pkg.m:build"}))
    copy = tmp_path / "runs" / "u" / "config.yaml"
    copy.parent.mkdir(parents=True)
    copy.write_text(config_to_yaml(cfg))
    assert load_config(copy).digest() == cfg.digest()


def test_pinpoint_code_dir_wins_over_train_code_dir(tmp_path, monkeypatch):
    from pinpoint.usercode import add_code_dir, code_dir

    cfg = load_config(_write(tmp_path / "proj" / "c.yaml", {"model": "pkg.m:build"}))
    image_copy = tmp_path / "opt-code"
    image_copy.mkdir()
    monkeypatch.setenv("PINPOINT_CODE_DIR", str(image_copy))
    monkeypatch.setattr(sys, "path", list(sys.path))
    assert code_dir(cfg) == str(image_copy)
    add_code_dir(cfg)
    assert sys.path[0] == str(image_copy)


def test_a_callable_is_imported_from_code_dir_and_given_only_what_it_names(tmp_path, monkeypatch):
    from pinpoint.usercode import call, load_callable

    (tmp_path / "proj" / "pkg").mkdir(parents=True)
    (tmp_path / "proj" / "pkg" / "__init__.py").write_text("")
    (tmp_path / "proj" / "pkg" / "m.py").write_text("def build(width, seed=0):\n    return (width, seed)\n")
    cfg = load_config(_write(tmp_path / "proj" / "c.yaml", {"model": "pkg.m:build"}))
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.delitem(sys.modules, "pkg", raising=False)
    monkeypatch.delitem(sys.modules, "pkg.m", raising=False)
    fn = load_callable(cfg, "train.model", "pkg.m:build")
    assert call(fn, "train.model", "pkg.m:build", {"width": 8}, {"seed": 3, "num_classes": 10}, "train.model_args") == (8, 3)
    with pytest.raises(ConfigError, match=r"train.model: got 'pkg.m:nope'; module 'pkg.m' has no attribute 'nope'.*build"):
        load_callable(cfg, "train.model", "pkg.m:nope")
    with pytest.raises(ConfigError, match=r"the callable raised TypeError: .*width"):
        call(fn, "train.model", "pkg.m:build", {}, {}, "train.model_args")


def test_preflight_refuses_a_glob_without_files_before_anything_is_built(tmp_path):
    from pinpoint.usercode import preflight

    cfg = load_config(_write(tmp_path / "c.yaml", {"data": "csv:none/*.csv"}))
    with pytest.raises(ConfigError, match=r"train.data: got 'csv:.*none/\*.csv'; no file matches"):
        preflight(cfg)
