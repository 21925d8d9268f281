"""Which namespace a run's objects live in: the config's, else the namespace of the pod running
the step (a Kubeflow profile's namespace, where its service account may create objects), else
'default' outside a cluster."""

from __future__ import annotations

from pathlib import Path

from pinpoint.errors import ConfigError

# Mounted into every pod with a service-account token (the kfp steps' pods included).
SA_NAMESPACE_FILE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
DEFAULT_NAMESPACE = "default"


def pod_namespace(path: Path | None = None) -> str | None:
    """The namespace of the pod this process runs in, or None outside a pod."""
    try:
        return (path or SA_NAMESPACE_FILE).read_text().strip() or None
    except OSError:
        return None


def namespace_of(cluster, path: Path | None = None) -> str:
    """cluster.namespace if set, else the pod's, else 'default'. In a pod, a configured namespace
    other than the pod's is refused: the step's service account can only act in its own."""
    pod = pod_namespace(path)
    if cluster.namespace and pod and cluster.namespace != pod:
        raise ConfigError(
            f"cluster.namespace: got {cluster.namespace!r} but this step runs in namespace {pod!r}, where its "
            f"service account has its permissions; remove cluster.namespace or set it to {pod!r}"
        )
    return cluster.namespace or pod or DEFAULT_NAMESPACE


def with_namespace(cfg, path: Path | None = None):
    """The config with cluster.namespace resolved (what provision writes to the run folder)."""
    ns = namespace_of(cfg.cluster, path)
    if ns == cfg.cluster.namespace:
        return cfg
    return cfg.model_copy(update={"cluster": cfg.cluster.model_copy(update={"namespace": ns})})
