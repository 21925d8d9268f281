"""kfp component: the validated config -> cluster_spec.json, manifests/, feasibility (pinpoint.provision)."""

from typing import NamedTuple

from kfp.dsl import Artifact, Output


def provision_cluster(
    config_yaml: str,
    run_dir: str,
    parent_run_id: str,
    variant: dict,
    cluster_spec: Output[Artifact],
) -> NamedTuple("ProvisionOutputs", [("config_digest", str), ("run_dir", str)]):
    """Provision the run folder; return the config digest (the key later steps check) and the
    run folder. A non-empty `variant` ({"name": ..., "train": {...overrides}}) derives a sweep
    variant from the config: name '<name>-<variant>', folder '<run_dir>/<variant>'."""
    import shutil
    from collections import namedtuple
    from pathlib import Path

    import yaml

    from pinpoint.config import config_from_dict
    from pinpoint.runfolder import CLUSTER_SPEC
    from pinpoint.steps.provision import provision_step

    data = yaml.safe_load(config_yaml)
    out = Path(run_dir)
    if variant:
        label = str(variant.get("name", ""))
        if not label:
            fail(f"variant: got {variant!r}; give every sweep variant a 'name'")
        for section, overrides in variant.items():
            if section != "name":
                merged = dict(data.get(section) or {})
                merged.update(overrides)
                data[section] = merged
        data["name"] = f"{data['name']}-{label}"
        out = out / label
    cfg = run_step(config_from_dict, data, "config_yaml")
    # The digest of the config provision wrote (its namespace resolved), which the train step checks.
    digest = run_step(provision_step, cfg, out, parent_run_id=parent_run_id or None)["config_digest"]
    shutil.copyfile(out / CLUSTER_SPEC, cluster_spec.path)
    cluster_spec.metadata["config_digest"] = digest
    cluster_spec.metadata["run_dir"] = str(out)
    outputs = namedtuple("ProvisionOutputs", ["config_digest", "run_dir"])
    return outputs(digest, str(out))
