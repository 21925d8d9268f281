"""Compiled pipelines: golden YAML, kfp round trip, GPU/scheduling/secret/caching/retry settings."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from pinpoint.config import DEFAULT_RUNS_CLAIM
from tests.conftest import REPO

pytestmark = pytest.mark.unit

GOLDEN = REPO / "tests" / "data" / "golden"
GOLDEN_CONFIG = GOLDEN / "gpu_config.yaml"
REGENERATE = (
    ".venv/bin/python -m pipelines.compile --out tests/data/golden --config tests/data/golden/gpu_config.yaml "
    "--no-config-default"
)


def _normalize(text: str) -> str:
    # The SDK version is the only field kfp stamps that is not ours (pinned in the lock anyway).
    return re.sub(r"sdkVersion: kfp-[0-9.a-z]+", "sdkVersion: kfp", text)


def _docs(path: Path) -> tuple[dict, dict]:
    """(pipeline spec, platform spec) of a compiled file."""
    docs = list(yaml.safe_load_all(path.read_text()))
    spec = docs[0]
    platform = docs[1]["platforms"]["kubernetes"]["deploymentSpec"]["executors"] if len(docs) > 1 else {}
    return spec, platform


@pytest.fixture(scope="module")
def compiled(tmp_path_factory) -> Path:
    from pipelines.compile import compile_all

    out = tmp_path_factory.mktemp("compiled")
    compile_all(out, GOLDEN_CONFIG, embed_config=False)
    return out


def test_the_config_is_embedded_as_the_default_and_round_trips(tmp_path):
    from pinpoint.config import config_from_dict, load_config
    from pipelines.compile import compile_all

    for path in compile_all(tmp_path, GOLDEN_CONFIG):
        spec, _ = _docs(path)
        params = spec["root"]["inputDefinitions"]["parameters"]
        default = params["config_yaml"]["defaultValue"]
        assert config_from_dict(yaml.safe_load(default)) == load_config(GOLDEN_CONFIG)


@pytest.mark.parametrize("name", ["training_pipeline.yaml", "placement_sweep.yaml"])
def test_compiled_yaml_matches_golden(compiled, name):
    fresh, golden = _normalize((compiled / name).read_text()), _normalize((GOLDEN / name).read_text())
    assert fresh == golden, f"{name} differs from the golden copy; if the change is intended, run: {REGENERATE}"


@pytest.mark.parametrize("name", ["training_pipeline.yaml", "placement_sweep.yaml"])
def test_golden_loads_back_and_recompiles(tmp_path, name):
    from kfp.components import load_component_from_file

    from pipelines.compile import _compile

    loaded = load_component_from_file(str(GOLDEN / name))
    assert loaded.name in ("pinpoint-training", "pinpoint-placement-sweep")
    assert "config_yaml" in loaded.component_spec.inputs
    # Round trip: the loaded pipeline compiles again to the same DAG, executors and components.
    again = tmp_path / name
    _compile(loaded, again)
    original, _ = _docs(GOLDEN / name)
    rebuilt, _ = _docs(again)
    for key in ("root", "components", "deploymentSpec"):
        assert rebuilt[key] == original[key], key


def test_gpu_scheduling_and_resources_on_the_train_step(compiled):
    spec, platform = _docs(compiled / "training_pipeline.yaml")
    train = spec["deploymentSpec"]["executors"]["exec-train"]["container"]
    assert train["image"] == "registry.example/pinpoint-gpu:0.1.0"
    assert train["resources"]["accelerator"]["resourceType"] == "nvidia.com/gpu"
    assert train["resources"]["accelerator"]["resourceCount"] == "4"
    assert train["resources"]["resourceMemoryLimit"] == "32Gi"
    k8s = platform["exec-train"]
    assert k8s["nodeSelector"]["labels"] == {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB", "pool": "gpu"}
    assert k8s["tolerations"] == [{"effect": "NoSchedule", "key": "nvidia.com/gpu", "operator": "Exists"}]
    assert any(m["mountPath"] == "/dev/shm" for m in k8s["emptyDirMounts"])
    # GPUs only where training happens.
    for other in ("exec-provision-cluster", "exec-report"):
        assert "accelerator" not in spec["deploymentSpec"]["executors"][other]["container"].get("resources", {})
        assert "nodeSelector" not in platform[other]
    # Every step shares the run folder through the PVC.
    for executor in platform.values():
        assert executor["pvcMount"][0]["mountPath"] == "/runs"
        assert executor["pvcMount"][0]["constant"] == DEFAULT_RUNS_CLAIM


def test_no_stray_top_level_keys(compiled):
    """kfp's own header spills multi-line defaults into the document; ours must not."""
    for path in compiled.glob("*.yaml"):
        spec, _ = _docs(path)
        assert set(spec) == {"components", "deploymentSpec", "pipelineInfo", "root", "schemaVersion", "sdkVersion"}


def test_caching_and_retries(compiled):
    spec, _ = _docs(compiled / "training_pipeline.yaml")
    tasks = spec["root"]["dag"]["tasks"]
    # Training is never served from a cache; provision is (its inputs are the config text).
    assert tasks["train"]["cachingOptions"] == {}
    assert tasks["provision-cluster"]["cachingOptions"] == {"enableCache": True}
    assert tasks["report"]["cachingOptions"] == {}
    # Retries only where a rerun is safe; the launcher restarts training from checkpoints itself.
    assert tasks["provision-cluster"]["retryPolicy"]["maxRetryCount"] == 2
    assert tasks["report"]["retryPolicy"]["maxRetryCount"] == 2
    assert "retryPolicy" not in tasks["train"]


def test_mlflow_credentials_come_from_the_secret_never_the_yaml(tmp_path, monkeypatch):
    from pipelines.compile import compile_all

    sentinels = {
        "MLFLOW_TRACKING_USERNAME": "sentinel-user-7f3a",
        "MLFLOW_TRACKING_PASSWORD": "sentinel-password-91bc",
        "MLFLOW_TRACKING_TOKEN": "sentinel-token-55d0",
    }
    for key, value in sentinels.items():
        monkeypatch.setenv(key, value)
    compile_all(tmp_path, GOLDEN_CONFIG)
    for path in tmp_path.glob("*.yaml"):
        text = path.read_text()
        for value in sentinels.values():
            assert value not in text, f"{value} leaked into {path.name}"
        spec, platform = _docs(path)
        # No executor sets a credential as a literal env var ...
        for executor in spec["deploymentSpec"]["executors"].values():
            env_names = {e["name"] for e in executor["container"].get("env", [])}
            assert not env_names & set(sentinels), env_names
        # ... they come from the Secret, by name and key only.
        for name, executor in platform.items():
            (secret,) = executor["secretAsEnv"]
            assert secret["secretName"] == "mlflow-credentials"
            assert {k["envVar"] for k in secret["keyToEnv"]} == {
                "MLFLOW_TRACKING_URI", "MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD"
            }
            assert set(secret) <= {"secretName", "keyToEnv", "optional", "secretNameParameter"}


def test_tracking_uri_with_credentials_is_refused(tmp_path):
    from pinpoint.config import load_config
    from pinpoint.errors import ConfigError
    from pipelines.settings import settings_from_config

    text = GOLDEN_CONFIG.read_text().replace(
        "http://mlflow.mlflow.svc:5000", "http://alice:hunter2@mlflow.mlflow.svc:5000"
    )
    (tmp_path / "c.yaml").write_text(text)
    with pytest.raises(ConfigError) as err:
        settings_from_config(load_config(tmp_path / "c.yaml"))
    message = str(err.value)
    assert "\n" not in message and "tracking.uri" in message and "hunter2" not in message


def test_multi_worker_config_launches_through_kubernetes(tmp_path):
    from pinpoint.config import load_config
    from pipelines.compile import compile_training
    from pipelines.settings import settings_from_config

    text = GOLDEN_CONFIG.read_text().replace("strategy: mirrored", "strategy: multi_worker_mirrored")
    text = text.replace("  chief: 1\n", "  chief: 1\n  workers: 1\n")
    (tmp_path / "c.yaml").write_text(text)
    from pinpoint.errors import ConfigError

    # The TFJob's pods and the pipeline's steps must share the run folder: a PVC is required.
    with pytest.raises(ConfigError, match="cluster.runs_volume_claim"):
        settings_from_config(load_config(tmp_path / "c.yaml"))
    (tmp_path / "c.yaml").write_text(text.replace("  chief: 1\n", "  chief: 1\n  runs_volume_claim: shared-runs\n"))
    settings = settings_from_config(load_config(tmp_path / "c.yaml"))
    assert settings.runs_pvc == "shared-runs"
    assert settings.launch == "kubernetes" and settings.gpu_count == 0
    spec, platform = _docs(compile_training(settings, tmp_path / "p.yaml"))
    train_task = spec["root"]["dag"]["tasks"]["train"]
    assert train_task["inputs"]["parameters"]["launch"]["runtimeValue"]["constant"] == "kubernetes"
    # The controller pod needs no GPU: the TFJob's pods request them.
    assert "accelerator" not in spec["deploymentSpec"]["executors"]["exec-train"]["container"].get("resources", {})
    assert "tolerations" not in platform["exec-train"]


def test_local_pipeline_has_no_kubernetes_settings(tmp_path):
    from pipelines.compile import compile_training
    from pipelines.settings import local_settings

    path = compile_training(local_settings(), tmp_path / "local.yaml")
    assert len(list(yaml.safe_load_all(path.read_text()))) == 1


def test_compile_cli_writes_both_pipelines(tmp_path):
    out = tmp_path / "sub" / "training_pipeline.yaml"
    proc = subprocess.run(
        [sys.executable, "-m", "pinpoint.cli", "compile", "--out", str(out), "--config", str(REPO / "configs/demo.yaml")],
        capture_output=True, text=True, cwd=REPO, timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert out.is_file() and (out.parent / "placement_sweep.yaml").is_file()
    assert not list(out.parent.glob(".*compiling*"))


def test_compile_cli_bad_config_is_one_line(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "pipelines.compile", "--out", str(tmp_path), "--config", str(tmp_path / "missing.yaml")],
        capture_output=True, text=True, cwd=REPO, timeout=120,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and "Traceback" not in proc.stderr
    assert not list(tmp_path.glob("*.yaml"))


def test_the_steps_secret_is_the_configs_mlflow_secret(tmp_path):
    """settings_from_config names the Secret cluster.mlflow_secret (the one the training pods read);
    None: no secretAsEnv at all."""
    from pinpoint.config import load_config
    from pipelines.compile import compile_training
    from pipelines.settings import settings_from_config

    text = GOLDEN_CONFIG.read_text().replace("  chief: 1\n", "  chief: 1\n  mlflow_secret: team-mlflow\n")
    (tmp_path / "c.yaml").write_text(text)
    settings = settings_from_config(load_config(tmp_path / "c.yaml"))
    assert settings.mlflow_secret == "team-mlflow"
    _, platform = _docs(compile_training(settings, tmp_path / "p.yaml"))
    assert {e["secretAsEnv"][0]["secretName"] for e in platform.values()} == {"team-mlflow"}
    (tmp_path / "n.yaml").write_text(text.replace("mlflow_secret: team-mlflow", "mlflow_secret: null"))
    settings = settings_from_config(load_config(tmp_path / "n.yaml"))
    assert settings.mlflow_secret == ""
    _, platform = _docs(compile_training(settings, tmp_path / "pn.yaml"))
    assert [name for name, e in platform.items() if "secretAsEnv" in e] == []


def test_the_steps_and_the_pods_read_the_same_secret_keys():
    from pinpoint.provision.podenv import MLFLOW_SECRET_KEYS
    from pipelines import settings, tasks

    assert settings.MLFLOW_SECRET_KEYS is MLFLOW_SECRET_KEYS and tasks.MLFLOW_SECRET_KEYS is MLFLOW_SECRET_KEYS


def test_one_name_for_each_default():
    """The image, the run-folder claim and the MLflow Secret have one default each, the config's,
    wherever a pipeline or a test needs one; pipelines/settings.py re-declares no cluster field."""
    import dataclasses
    import inspect

    from components import build_components
    from pinpoint import __version__
    from pinpoint.config import DEFAULT_IMAGE, ClusterConfig
    from pipelines.settings import PipelineSettings, local_settings
    from tests.conftest import CPU_IMAGE

    cluster = ClusterConfig()
    assert cluster.image == DEFAULT_IMAGE == f"pinpoint-cpu:{__version__}"
    assert inspect.signature(build_components).parameters["image"].default == DEFAULT_IMAGE
    assert local_settings().image == DEFAULT_IMAGE
    assert CPU_IMAGE == f"localhost/{DEFAULT_IMAGE}"  # podman's name of the same local image
    assert f"TAG=${{TAG:-{__version__}}}" in (REPO / "docker" / "build.sh").read_text()  # what make images tags
    for config in REPO.glob("configs/*.yaml"):
        assert "pinpoint-cpu:" not in config.read_text(), config  # the default, not a second spelling
    # Compiled without a config: the default cluster's claim and Secret.
    default = PipelineSettings(kubernetes=True)
    assert (default.runs_pvc, default.mlflow_secret) == (DEFAULT_RUNS_CLAIM, cluster.mlflow_secret)
    assert [f.name for f in dataclasses.fields(PipelineSettings)] == [
        "cluster", "launch", "kubernetes", "default_config_yaml", "default_run_dir"]
