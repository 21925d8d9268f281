"""System metrics of this process's node (CPU, memory, disk, network; GPU when present), sampled
with psutil (and NVML) like MLflow's own monitors, under MLflow's names, but written through the
spool, so an outage loses none of them (and the training process never imports MLflow for them).

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
        self._ready = threading.Event()  # monitors built: from now on stop() waits for a last sample
        self._thread: threading.Thread | None = None
        self._step = 0

    def _monitors(self):
        monitors = [_CpuMemory(), _Disk(), _Network()]
        gpus = _Gpus.open()
        if gpus is not None:
            monitors.append(gpus)
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
        self._ready.set()
        if self._stop.is_set():
            return  # stopped while MLflow's monitors were being imported: nothing sampled yet
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
        if self._thread is not None and self._ready.is_set():
            self._thread.join(5)  # its last sample goes into the run before the run ends


class _Monitor:
    """Collect samples between two logs; log their mean (MLflow's aggregation)."""

    def __init__(self):
        self._samples: dict[str, list[float]] = {}

    def add(self, name: str, value: float) -> None:
        self._samples.setdefault(name, []).append(float(value))

    def aggregate_metrics(self) -> dict[str, float]:
        return {k: round(sum(v) / len(v), 1) for k, v in self._samples.items() if v}

    def clear_metrics(self) -> None:
        self._samples.clear()


class _CpuMemory(_Monitor):
    def collect_metrics(self) -> None:
        import psutil

        self.add("cpu_utilization_percentage", psutil.cpu_percent())
        mem = psutil.virtual_memory()
        self.add("system_memory_usage_megabytes", mem.used / 1e6)
        self.add("system_memory_usage_percentage", mem.used / mem.total * 100)


class _Disk(_Monitor):
    def collect_metrics(self) -> None:
        import psutil

        disk = psutil.disk_usage(os.sep)
        self.add("disk_usage_percentage", disk.percent)
        self.add("disk_usage_megabytes", disk.used / 1e6)
        self.add("disk_available_megabytes", disk.free / 1e6)


class _Network(_Monitor):
    """Megabytes received/sent since the sampler started (MLflow's definition)."""

    def __init__(self):
        import psutil

        super().__init__()
        io = psutil.net_io_counters()
        self._base = (io.bytes_recv, io.bytes_sent)
        self._last: dict[str, float] = {}

    def collect_metrics(self) -> None:
        import psutil

        io = psutil.net_io_counters()
        self._last = {"network_receive_megabytes": (io.bytes_recv - self._base[0]) / 1e6,
                      "network_transmit_megabytes": (io.bytes_sent - self._base[1]) / 1e6}

    def aggregate_metrics(self) -> dict[str, float]:
        return dict(self._last)


class _Gpus(_Monitor):
    """Utilization and memory of each NVIDIA GPU (NVML), when the library is present."""

    def __init__(self, nvml, handles):
        super().__init__()
        self._nvml, self._handles = nvml, handles

    @classmethod
    def open(cls):
        try:
            import pynvml

            pynvml.nvmlInit()
            handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
        except Exception:  # noqa: BLE001 - no NVIDIA library or driver: no GPU metrics
            return None
        return cls(pynvml, handles) if handles else None

    def collect_metrics(self) -> None:
        for i, h in enumerate(self._handles):
            mem = self._nvml.nvmlDeviceGetMemoryInfo(h)
            self.add(f"gpu_{i}_memory_usage_percentage", mem.used / mem.total * 100)
            self.add(f"gpu_{i}_memory_usage_megabytes", mem.used / 1e6)
            self.add(f"gpu_{i}_utilization_percentage", self._nvml.nvmlDeviceGetUtilizationRates(h).gpu)
