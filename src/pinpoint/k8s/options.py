"""What the launch step is given (LaunchOptions) and what it created (Created): shared by the
launcher (pinpoint.k8s.launch) and the watcher (pinpoint.k8s.watch)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

from pinpoint.config import DEADLINE_S, UNSCHEDULABLE_GRACE_S


@dataclass
class LaunchOptions:
    poll_seconds: float = 2.0
    timeout_seconds: float = float(DEADLINE_S)  # launch_training: cluster.deadline_s
    unschedulable_grace_seconds: float = UNSCHEDULABLE_GRACE_S  # launch_training: cluster.unschedulable_grace_s
    image_pull_grace_seconds: float = 30.0
    # Up to this many pods every pod's log is streamed; above, the chief's and each failed pod's
    # (the requests per poll stay constant: 1,024 workers would be 1,024 log reads per poll).
    stream_all_logs_up_to: int = 8
    failed_create_grace_seconds: float = 60.0  # FailedCreate Events (quota...) tolerated this long
    operator_grace_seconds: float = 120.0  # a TFJob without status and pods after this: no operator
    max_restarts: int | None = None  # per replica; None: not enforced; launch_training: train.max_restarts
    retry_attempts: int = 5  # per API call, on 429/5xx/timeouts/connection errors
    retry_base_seconds: float = 0.5  # backoff: base, 2*base, 4*base...
    request_timeout_seconds: float = 30.0
    # The pod running this step (created objects get an ownerReference to it); None: none.
    # launch_training: $HOSTNAME when a service-account namespace file exists.
    owner_pod: str | None = None
    keep: bool = False  # leave the objects for debugging (they are still listed)
    log: Callable[[str], None] = field(default=lambda line: print(line, flush=True))
    clock: Callable[[], float] = time.monotonic


@dataclass(frozen=True)
class Created:
    kind: str
    name: str
    namespace: str
    api_version: str
    uid: str = ""
    primary: bool = False  # its completion means the run is done (the TFJob, the chief's Job)
    created_at: float = 0.0
