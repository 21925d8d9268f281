"""Apply PipelineSettings to kfp tasks: GPUs, scheduling, storage, secrets, caching, retries."""

from __future__ import annotations

from pipelines.settings import MLFLOW_SECRET_KEYS, RUNS_MOUNT, PipelineSettings


def configure_step(task, settings: PipelineSettings, *, display_name: str, cache: bool, retries: int = 0):
    """Every step: a name, the cache policy, retries and the shared Kubernetes settings."""
    task.set_display_name(display_name)
    # Caching: only steps whose outputs are a pure function of their inputs (the config text)
    # may be cached; a cached training step would skip training and reuse a stale folder.
    task.set_caching_options(enable_caching=cache)
    if retries:
        task.set_retry(num_retries=retries, backoff_duration="30s", backoff_factor=2.0)
    if settings.kubernetes:
        from kfp import kubernetes

        if settings.runs_pvc:
            kubernetes.mount_pvc(task, pvc_name=settings.runs_pvc, mount_path=RUNS_MOUNT)
        if settings.mlflow_secret:
            # Only the Secret's name and keys go into the compiled YAML; the kubelet injects the
            # values at run time. optional=True: a cluster without the Secret uses the config's URI
            # (KFP backend >= 2.15.0 honours it; older drivers refuse the field, see README.md).
            kubernetes.use_secret_as_env(
                task,
                secret_name=settings.mlflow_secret,
                secret_key_to_env=dict(MLFLOW_SECRET_KEYS),
                optional=True,
            )
        kubernetes.set_image_pull_policy(task, "IfNotPresent")
    return task


def configure_training(task, settings: PipelineSettings):
    """The training step: GPUs, node selector, tolerations and resources when it trains in-pod."""
    if settings.kubernetes:
        task.set_cpu_limit(settings.cluster.cpu)
        task.set_memory_limit(settings.cluster.memory)  # kfp takes Kubernetes quantities
    if settings.gpu_count:
        task.set_accelerator_type(settings.cluster.gpu_resource)
        task.set_accelerator_limit(settings.gpu_count)
    if settings.kubernetes:
        from kfp import kubernetes

        for key, value in settings.node_selector:
            kubernetes.add_node_selector(task, label_key=key, label_value=value)
        for t in settings.tolerations:
            kubernetes.add_toleration(task, key=t.key, operator=t.operator, value=t.value, effect=t.effect)
        if settings.shm_size:
            # The default 64 MiB /dev/shm is too small for NCCL's buffers between local GPUs.
            kubernetes.empty_dir_mount(
                task, volume_name="dshm", mount_path="/dev/shm", medium="Memory", size_limit=settings.shm_size
            )
    return task


def provision_and_train(comp, settings, *, config_yaml, run_dir, parent_run_id, variant, resume_from_run):
    """The provision -> train steps both pipelines share, with one cache/retry policy; returns
    the train task (its outputs: the run folder and placement.json)."""
    prov = comp.provision_cluster(
        config_yaml=config_yaml, run_dir=run_dir, parent_run_id=parent_run_id, variant=variant
    )
    # Provision writes files keyed only by the config text: safe to cache and to retry.
    configure_step(prov, settings, display_name="provision", cache=True, retries=2)
    tr = comp.train(
        run_dir=prov.outputs["run_dir"],
        config_digest=prov.outputs["config_digest"],
        parent_run_id=parent_run_id,
        launch=settings.launch,
        resume_from_run=resume_from_run,
    )
    # Never cached; no kfp retries: the launcher restarts the cluster from its checkpoints.
    configure_step(tr, settings, display_name="train", cache=False)
    configure_training(tr, settings)
    return tr
