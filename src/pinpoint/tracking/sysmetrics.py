"""System metrics of this process's node (CPU, memory, disk, network; GPU when present), sampled
with MLflow's own monitors but written through the spool, so an outage loses none of them.

"Per node" means per chief process here: only the chief opens runs, so the other tasks of a
multi-worker job are not sampled (on Kubernetes each task runs in its own pod/node).
Metric names follow MLflow's log_system_metrics=True: system/[<node_id>/]<name>.
"""

from __future__ import annotations

import os
import threading


class SystemMetricsSampler:
    def __init__(self, run, *, node_id: str | None = None, interval: float | None = None):
        self.run = run
        self.node_id = node_id
        env = os.environ.get("MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL")
        self.interval = float(interval or env or 10.0)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._step = 0

    def _monitors(self):
        from mlflow.system_metrics.metrics.cpu_monitor import CPUMonitor
        from mlflow.system_metrics.metrics.disk_monitor import DiskMonitor
        from mlflow.system_metrics.metrics.network_monitor import NetworkMonitor

        monitors = [CPUMonitor(), DiskMonitor(), NetworkMonitor()]
        try:
            from mlflow.system_metrics.metrics.gpu_monitor import GPUMonitor

            monitors.append(GPUMonitor())
        except Exception:  # noqa: BLE001, S110 - no NVIDIA library: no GPU metrics
            pass
        return monitors

    def start(self) -> None:
        try:
            import psutil  # noqa: F401  (MLflow's monitors need it)
        except ImportError:
            from pinpoint.tracking.spool import warn

            warn("psutil is not installed; MLflow system metrics are off")
            return
        self._thread = threading.Thread(target=self._loop, name="pinpoint-sysmetrics", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        monitors = self._monitors()
        prefix = "system/" + (f"{self.node_id}/" if self.node_id else "")
        while True:
            for m in monitors:
                m.collect_metrics()
            stopping = self._stop.wait(self.interval)
            values = {}
            for m in monitors:
                values.update(m.aggregate_metrics())
                m.clear_metrics()
            if values:
                self.run.log_metrics({prefix + k: v for k, v in values.items()}, step=self._step)
                self._step += 1
            if stopping:
                return

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
