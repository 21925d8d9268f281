"""Scale of the Kubernetes path (issue 26.7): `pinpoint provision` time, the size of what it
writes, and the launch step's API requests per poll, at 16, 256 and 1,024 pods of a
parameter-server job, for the jobset flavour against the tfjob flavour (today's default) as the
peer.

One arm = one flavour at one size, in its own process (`benchmarks.worker`, kind "k8s_scale"):
provision into a fresh folder, then launch the manifests against FakeKubeApiServer (a FAKE API
server, tests/fakes/kube_api.py) in its "hang" scenario (every pod Running) for a fixed number of
watch polls. The launch step's clock is virtual (one second per reading), so the number of polls
does not depend on how fast the fake answers; requests per poll are counted from one pod list
to the next, after the third poll (every pod Running and streaming).
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

SIZES = (16, 256, 1024)
FLAVORS = ("jobset", "tfjob")
POLLS = 8


def topology(pods: int) -> dict:
    """parameter_server with `pods` tasks: 1 chief, 1 ps per 16 tasks (at most 64), the rest workers."""
    ps = min(64, max(1, pods // 16))
    return {"chief": 1, "ps": ps, "workers": pods - 1 - ps}


def _config(flavor: str, pods: int):
    from pinpoint.config import config_from_dict

    return config_from_dict({
        "name": f"scale-{pods}",
        "cluster": {**topology(pods), "flavor": flavor, "image": "registry.example.com/pinpoint-cpu:bench",
                    "runs_volume_claim": "runs", "namespace": "bench", "devices_per_worker": 1},
        "train": {"strategy": "parameter_server"},
        "tracking": {"enabled": False},
    })


class _VirtualClock:
    """One second per reading: the watch loop reads it once per poll."""

    def __init__(self):
        self.t = 0.0

    def __call__(self) -> float:
        self.t += 1.0
        return self.t


def measure(spec: dict) -> dict:
    from pinpoint.errors import TrainingFailed
    from pinpoint.k8s.launch import LaunchOptions, launch_manifests
    from pinpoint.provision import provision
    from pinpoint.provision.trainjob import runtime
    from tests.fakes.kube_api import FakeKubeApiServer

    flavor, pods = spec["flavor"], int(spec["pods"])
    cfg = _config(flavor, pods)
    out = Path(spec["out"]) / "claim" / cfg.name
    t0 = time.perf_counter()
    provision(cfg, out)
    provision_s = time.perf_counter() - t0
    manifests = sorted((out / "manifests").glob("*.yaml"))
    rec: dict = {
        "flavor": flavor, "pods": pods, "provision_s": provision_s,
        "manifest_bytes": sum(p.stat().st_size for p in manifests),
        "manifest_files": len(manifests),
        "cluster_spec_bytes": (out / "cluster_spec.json").stat().st_size,
    }
    rec["manifest_bytes_per_pod"] = rec["manifest_bytes"] / pods
    rec["cluster_spec_bytes_per_pod"] = rec["cluster_spec_bytes"] / pods
    with FakeKubeApiServer("hang") as fake:
        fake.add_runtime(runtime())
        opts = LaunchOptions(poll_seconds=0.0, timeout_seconds=float(POLLS), retry_base_seconds=0.01,
                             unschedulable_grace_seconds=1e9, operator_grace_seconds=1e9, log=lambda line: None,
                             clock=_VirtualClock())
        t0 = time.perf_counter()
        try:
            launch_manifests(fake.api_client(), out, cfg.name, "bench", opts)
        except TrainingFailed as err:
            if "did not finish within" not in str(err):
                raise
        rec["watch_s"] = time.perf_counter() - t0
        steady = fake.requests_per_poll()[3:]
    rec["polls_measured"] = len(steady)
    rec["requests_per_poll"] = statistics.median(steady) if steady else None
    rec["requests_per_poll_max"] = max(steady) if steady else None
    return rec


def comparison():
    """The bench's comparison (benchmarks.plan): one arm per flavour and size, one round."""
    from benchmarks.plan import Arm, Comparison

    arms = tuple(Arm(f"{f}-{n}", f"{f}, {n} pods", {"kind": "k8s_scale", "flavor": f, "pods": n})
                 for f in FLAVORS for n in SIZES)
    # run_s: one arm's process (Python start-up, provision, the fake API and the watch polls).
    return Comparison(key="k8s-scale", title="Kubernetes path at 16, 256 and 1,024 pods (parameter_server)",
                      arms=arms, repeats=1, run_s=11.3)


def section(results: dict) -> str:
    """The RESULTS.md section: a row per arm and the three targets of issue 26.7."""
    from benchmarks.table import markdown_table
    from benchmarks.targets import target

    runs = results.get("k8s-scale") or {}
    recs = {name: next((r for r in recs if "error" not in r), None) for name, recs in runs.items()}
    if not any(recs.values()):
        return "not run (`make bench BENCH_ARGS=\"--only k8s-scale\"`)\n"
    rows = []
    for f in FLAVORS:
        for n in SIZES:
            r = recs.get(f"{f}-{n}")
            if r is None:
                rows.append([f, str(n), "failed", "", "", "", "", ""])
                continue
            rows.append([f, str(n), f"{r['provision_s']:.2f}", f"{r['manifest_bytes']:,}",
                         f"{r['manifest_bytes_per_pod']:.0f}", f"{r['cluster_spec_bytes']:,}",
                         f"{r['cluster_spec_bytes_per_pod']:.0f}", f"{r['requests_per_poll']:g}"])
    table = markdown_table(["flavour", "pods", "provision s", "manifests bytes", "bytes / pod",
                            "cluster_spec.json bytes", "bytes / pod", "API requests per poll"], rows)

    def get(f, n, k):
        r = recs.get(f"{f}-{n}")
        return None if r is None else r[k]

    big, small = SIZES[-1], SIZES[0]
    lines = []
    worst = max((get(f, big, "provision_s") or 0.0) for f in FLAVORS)
    # One run per flavour and size: recorded against the target, not decided (benchmarks/targets.py).
    lines.append(f"- provision at {big:,} pods, target {target('k8s.provision_s')} s: {worst:.2f} s (the slower "
                 f"flavour, one run each): **recorded**")
    for f in FLAVORS:
        a, b = get(f, small, "manifest_bytes_per_pod"), get(f, big, "manifest_bytes_per_pod")
        c, d = get(f, small, "cluster_spec_bytes_per_pod"), get(f, big, "cluster_spec_bytes_per_pod")
        if None not in (a, b, c, d):
            lines.append(f"- {f}: bytes per pod at {big:,} / at {small} pods: manifests {b / a:.2f}, "
                         f"cluster_spec.json {d / c:.2f} (linear: about 1, not {big // small})")
    for f in FLAVORS:
        a, b = get(f, small, "requests_per_poll"), get(f, big, "requests_per_poll")
        if None not in (a, b):
            lines.append(f"- {f}: launch API requests per poll at {big:,} / at {small} pods = {b:g} / {a:g}: "
                         f"{'constant' if b == a else 'NOT constant'} (one run each: recorded)")
    return table + "\n" + "\n".join(lines) + "\n"
