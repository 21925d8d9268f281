"""Watch a launched run until it is done: its pods (logs, failures, restarts), its TFJob/Jobs'
status conditions and the Events of its workloads. Every failure is one TrainingFailed line.

GroupWatcher watches a JobSet or TrainJob, which restart the whole group themselves. What differs
between the flavours (done conditions, failure fixes, a missing controller, the container) comes
from the run's flavour class (pinpoint.provision.flavour).

Grace timers are keyed by pod UID: the Training Operator recreates a pod under the same name,
and a recreated pod starts a fresh timer (and its own log stream).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from datetime import datetime

from pinpoint.errors import TrainingFailed
from pinpoint.k8s.api import KubeApi, first_line
from pinpoint.k8s.options import Created, LaunchOptions
from pinpoint.provision.flavour import Flavour
from pinpoint.provision.jobset import GroupFlavour
from pinpoint.provision.names import INDEX_LABELS, INSTANCE_LABEL, JOBSET_NAME_LABEL, ROLE_LABEL
from pinpoint.provision.tasks import is_retryable_exit_code

IMAGE_PULL_REASONS = ("ImagePullBackOff", "ErrImagePull", "InvalidImageName", "ErrImageNeverPull")
FAILED_CREATE_REASONS = ("FailedCreate", "FailedCreatePod")
# Seconds of log re-read before the previous read (latency, clock steps); duplicates are dropped.
LOG_OVERLAP_SECONDS = 5

def failed_create(since: dict, key, events: list, all_pods: bool, now: float, grace: float, namespace: str):
    """(the latest FailedCreate event, "reason: message); fix") once `events` have lasted `grace`
    seconds with pods still missing; None before (the timer under `key` in `since` restarts
    whenever every pod exists or no event is left)."""
    if not events or all_pods:
        since.pop(key, None)
        return None
    if now - since.setdefault(key, now) < grace:
        return None
    latest = max(events, key=lambda e: str(e.last_timestamp or e.event_time or e.metadata.creation_timestamp or ""))
    message = first_line(latest.message)[:300]
    fix = (f"free or raise the ResourceQuota (`kubectl describe resourcequota -n {namespace}`) or request "
           "fewer resources per replica (cluster.*)") if "exceeded quota" in message else \
        "fix what the message names (quota, admission policy, service account)"
    return latest, f"{latest.reason}: {message}); {fix}"


@dataclass
class _LogStream:
    last: tuple[int, int] | None = None  # (epoch seconds, nanoseconds) of the last line printed
    read_at: float | None = None  # time.time() of the previous read
    done: bool = False


@dataclass
class _Replica:
    uids: list[str] = field(default_factory=list)
    restarts: dict[str, int] = field(default_factory=dict)  # uid -> containers' restartCount

    def count(self) -> int:
        return len(self.uids) - 1 + sum(self.restarts.values())


def parse_timestamp(text: str) -> tuple[int, int] | None:
    """RFC3339(Nano) -> (epoch seconds, nanoseconds); None if it is not one."""
    try:
        if text.endswith("Z"):
            text = text[:-1] + "+00:00"
        head, frac, offset = text[:19], "", text[19:]
        if offset.startswith("."):
            digits = len(offset) - len(offset[1:].lstrip("0123456789"))
            frac, offset = offset[1:digits], offset[digits:]
        seconds = int(datetime.fromisoformat(head + (offset or "+00:00")).timestamp())
        return seconds, int((frac + "000000000")[:9])
    except ValueError:
        return None


class Watcher:
    """Watch a TFJob or plain Jobs: pods, each replica's restarts, the workloads' conditions."""

    def __init__(self, api: KubeApi, name: str, opts: LaunchOptions, flavour: Flavour, workloads: list[Created],
                 expected_pods: int):
        self.api, self.name, self.opts, self.flavour = api, name, opts, flavour
        self.namespace = api.namespace
        self.workloads = workloads
        self.expected_pods = expected_pods
        self.streams: dict[str, _LogStream] = {}
        self.first_seen: dict[str, float] = {}  # pod uid -> when first seen
        self.failed_create_since: dict[str, float] = {}  # workload uid -> first FailedCreate seen
        self.replicas: dict[tuple[str, str], _Replica] = {}
        self.container = flavour.container  # whose log is streamed

    # ---- pods --------------------------------------------------------------------------
    def pods(self) -> list:
        pods = self.api.list_pods(f"{INSTANCE_LABEL}={self.name}")
        owners = {w.uid for w in self.workloads if w.uid}
        if not owners:
            return pods
        # Only this launch's pods: not those of a dead attempt still terminating.
        return [p for p in pods if any(ref.uid in owners for ref in p.metadata.owner_references or [])]

    @staticmethod
    def is_chief(pod, has_chief: bool) -> bool:
        """The chief, else worker 0; a TrainJob's pods (no role label) have it at completion index 0."""
        labels = pod.metadata.labels or {}
        role = labels.get(ROLE_LABEL)
        index = next((labels[k] for k in INDEX_LABELS if k in labels),
                     (pod.metadata.annotations or {}).get(INDEX_LABELS[1]))
        if role is None:
            return index == "0"
        return role == "chief" if has_chief else (role == "worker" and index == "0")

    def stream_logs(self, pod) -> None:
        """Print the lines of a started pod's log not printed yet, each prefixed with the pod name.
        Reads only the recent part (sinceSeconds) after the first read, and drops lines at or
        before the last timestamp printed for this pod UID."""
        if pod.status.phase not in ("Running", "Succeeded", "Failed"):
            return
        uid, name = pod.metadata.uid, pod.metadata.name
        stream = self.streams.setdefault(uid, _LogStream())
        if stream.done:
            return
        started = time.time()
        since = None
        if stream.read_at is not None:
            since = max(1, math.ceil(started - stream.read_at) + LOG_OVERLAP_SECONDS)
        text = self.api.read_log(name, self.container, since)
        if text is None:
            return  # not started yet (or already gone); the next poll retries
        stream.read_at = started
        complete = text.rsplit("\n", 1)[0] + "\n" if "\n" in text else ""
        for raw in complete.splitlines():
            stamp, _, line = raw.partition(" ")
            ts = parse_timestamp(stamp)
            if ts is None:
                ts, line = stream.last or (0, 0), raw
            elif stream.last is not None and ts <= stream.last:
                continue
            stream.last = ts
            self.opts.log(f"[{name}] {line}")
        stream.done = pod.status.phase in ("Succeeded", "Failed")

    def diagnose(self, pod, now: float) -> str | None:
        """One line if this pod shows a failure that will not fix itself, else None."""
        name, status = pod.metadata.name, pod.status
        age = now - self.first_seen.setdefault(pod.metadata.uid, now)
        for cs in status.container_statuses or []:
            waiting = cs.state.waiting if cs.state else None
            if waiting and waiting.reason in IMAGE_PULL_REASONS:
                if waiting.reason != "ErrImagePull" or age >= self.opts.image_pull_grace_seconds:
                    return (
                        f"pod {name}: image '{cs.image}' cannot be pulled ({waiting.reason}: "
                        f"{first_line(waiting.message)}); push it to a registry the cluster can reach or fix cluster.image"
                    )
            if waiting and waiting.reason == "CreateContainerConfigError":
                return f"pod {name}: container config error ({first_line(waiting.message)}); check the ConfigMap/Secret it mounts"
            for state in (cs.state, cs.last_state):
                term = state.terminated if state else None
                if term and term.reason == "OOMKilled":
                    return (
                        f"pod {name}: container {cs.name} was OOMKilled (memory limit {_memory_limit(pod)}); "
                        "raise cluster.memory or lower train.batch_size"
                    )
            term = cs.state.terminated if cs.state else None
            if term and term.exit_code != 0 and not is_retryable_exit_code(term.exit_code):
                return (
                    f"pod {name}: container {cs.name} exited with code {term.exit_code}"
                    f"{' (' + term.reason + ')' if term.reason and term.reason != 'Error' else ''}; see its log above"
                )
        for cond in status.conditions or []:
            if cond.type == "PodScheduled" and cond.status == "False" and cond.reason == "Unschedulable":
                if age >= self.opts.unschedulable_grace_seconds:
                    return (
                        f"pod {name}: cannot be scheduled for {age:.0f}s ({first_line(cond.message)}); "
                        "request fewer GPUs/CPU/memory per replica (cluster.*), fix node_selector/tolerations, or add nodes"
                    )
        if status.phase == "Failed" and not status.container_statuses:
            return f"pod {name}: failed ({status.reason or 'unknown'}: {first_line(status.message)})"
        return None

    def count_restarts(self, pods) -> str | None:
        """Restarts per replica (role, index): pods recreated (new UIDs) plus container restarts."""
        if self.opts.max_restarts is None:
            return None
        for pod in sorted(pods, key=lambda p: p.metadata.name):
            labels = pod.metadata.labels or {}
            role = labels.get(ROLE_LABEL, "worker")
            index = next((labels[k] for k in INDEX_LABELS if k in labels), None)
            if index is None:
                index = (pod.metadata.annotations or {}).get(INDEX_LABELS[1], pod.metadata.name)
            replica = self.replicas.setdefault((role, index), _Replica())
            uid = pod.metadata.uid
            if uid not in replica.uids:
                replica.uids.append(uid)
            restarts = sum(cs.restart_count or 0 for cs in pod.status.container_statuses or [])
            replica.restarts[uid] = max(replica.restarts.get(uid, 0), restarts)
            if replica.count() > self.opts.max_restarts:
                return (
                    f"pod {pod.metadata.name} ({role}:{index}): restarted {replica.count()} times, more than "
                    f"train.max_restarts={self.opts.max_restarts}; see its log above for why it keeps exiting with a "
                    "retryable code (>= 128), fix that or raise train.max_restarts"
                )
        return None

    # ---- workloads ------------------------------------------------------------------------
    def workload_state(self, now: float, pods) -> tuple[bool, str | None]:
        """(primary workload finished, failure line) from the TFJob/Jobs' status and Events."""
        from kubernetes.client.rest import ApiException

        done = False
        for w in self.workloads:
            try:
                obj = self.api.get(w.kind, w.name, w.namespace)
            except ApiException:  # 404
                return done, (f"kubernetes: {w.kind} {w.namespace}/{w.name} was deleted while running (by someone "
                              "else, or a TTL); rerun the step")
            conditions = [c for c in (obj.get("status") or {}).get("conditions") or [] if c.get("status") == "True"]
            types = {c.get("type"): c for c in conditions}
            ref = f"{w.kind} {w.namespace}/{w.name}"
            if "Failed" in types:
                c = types["Failed"]
                fix = self.flavour.failed_fix(c.get("reason"))
                return done, f"kubernetes: {ref} failed ({c.get('reason')}: {first_line(c.get('message'))}); {fix}"
            if w.primary and any(t in types for t in self.flavour.done_conditions):
                done = True
            age = now - w.created_at
            if not conditions and not pods and age >= self.opts.operator_grace_seconds:
                line = self.flavour.controller_missing(w.namespace, w.name, age)
                if line:
                    return done, line
            line = self._failed_create(w, now, pods)
            if line:
                return done, line
        return done, None

    def _failed_create(self, w: "Created", now: float, pods) -> str | None:
        if not w.uid:
            return None
        events = [e for e in self.api.list_events(w.uid) if e.reason in FAILED_CREATE_REASONS]
        return self._cannot_create(w.uid, events, now, pods, w.namespace, lambda _: f"{w.kind} {w.namespace}/{w.name}")

    def _cannot_create(self, key: str, events: list, now: float, pods, namespace: str, who) -> str | None:
        """The line for FailedCreate `events` that lasted the grace period; who(latest event) names the object."""
        found = failed_create(self.failed_create_since, key, events, len(pods) >= self.expected_pods, now,
                              self.opts.failed_create_grace_seconds, namespace)
        if found is None:
            return None
        latest, why = found
        return f"kubernetes: {who(latest)} cannot create its pods ({why}"

    # ---- the loop ---------------------------------------------------------------------------
    def wait(self) -> None:
        """Until the chief (or, without one, every worker) succeeded; raise TrainingFailed on a failure."""
        clock = self.opts.clock
        deadline = clock() + self.opts.timeout_seconds
        while True:
            now = clock()
            pods = self.pods()
            # A small run streams every pod's log; a large one the chief's and each failed pod's
            # once, so the requests per poll do not grow with the pods.
            every = self.expected_pods <= self.opts.stream_all_logs_up_to
            has_chief = any((p.metadata.labels or {}).get(ROLE_LABEL) == "chief" for p in pods)
            for pod in pods:
                if every or self.is_chief(pod, has_chief) or pod.status.phase == "Failed":
                    self.stream_logs(pod)
            for pod in pods:
                reason = self.diagnose(pod, now)
                if reason:
                    raise TrainingFailed(reason)
            reason = self.count_restarts(pods)
            if reason:
                raise TrainingFailed(reason)
            done, reason = self.workload_state(now, pods)
            if reason:
                raise TrainingFailed(reason)
            by_role: dict[str, list] = {}
            for pod in pods:
                by_role.setdefault((pod.metadata.labels or {}).get(ROLE_LABEL, "worker"), []).append(pod)
            primary = by_role.get("chief") or by_role.get("worker") or []
            if done or (primary and all(p.status.phase == "Succeeded" for p in primary)):
                return
            if now > deadline:
                raise TrainingFailed(
                    f"kubernetes: {self.name} did not finish within {self.opts.timeout_seconds:.0f}s "
                    f"(pods: {_phases(pods)}); raise cluster.deadline_s or look at the pod logs"
                )
            time.sleep(self.opts.poll_seconds)


def _memory_limit(pod) -> str:
    for c in pod.spec.containers if pod.spec else []:
        limits = (c.resources.limits if c.resources else None) or {}
        if "memory" in limits:
            return str(limits["memory"])
    return "unset"


def _phases(pods) -> str:
    return ", ".join(f"{p.metadata.name}={p.status.phase}" for p in pods) or "none created"


# ---- JobSet / TrainJob: the cluster restarts the group ------------------------------------------
JOBSET_UID_LABEL = "jobset.sigs.k8s.io/jobset-uid"
RESTART_ATTEMPT_LABEL = "jobset.sigs.k8s.io/restart-attempt"


class GroupWatcher(Watcher):
    """Watch a JobSet (or a TrainJob and the JobSet it instantiates). The JobSet controller restarts
    the whole group (failurePolicy); this reads the conditions and status.restarts, streams the
    chief's log across restarts (and each failed pod's log once), and diagnoses the pods of the
    current attempt. Requests per poll do not grow with the pods: one pod list by label selector,
    one get of the workload (a TrainJob: also its JobSet), the chief's log, one Event list."""

    flavour: GroupFlavour

    def __init__(self, api: KubeApi, name: str, opts: LaunchOptions, flavour: GroupFlavour, workloads: list[Created],
                 expected_pods: int):
        super().__init__(api, name, opts, flavour, workloads, expected_pods)
        self.workload = next(w for w in workloads if w.kind == flavour.kind)
        self.jobset_uid = self.workload.uid if flavour.is_jobset else None
        self.restarts = 0
        # A TrainJob's runtime's maxRestarts is a ceiling: train.max_restarts is enforced here
        # (a JobSet's own maxRestarts is exact).
        self.limit = None if flavour.enforces_max_restarts else opts.max_restarts

    def pods(self) -> list:
        pods = self.api.list_pods(f"{JOBSET_NAME_LABEL}={self.name}")
        if not self.jobset_uid:
            return pods
        # Only this launch's JobSet: not the pods of a dead attempt's JobSet still terminating.
        return [p for p in pods if (p.metadata.labels or {}).get(JOBSET_UID_LABEL) == self.jobset_uid]

    def _get(self, kind: str) -> dict | None:
        from kubernetes.client.rest import ApiException

        try:
            return self.api.get(kind, self.name, self.workload.namespace)
        except ApiException:  # 404
            return None

    def group_state(self, now: float) -> tuple[bool, str | None]:
        """(finished, failure line) from the workload's conditions and the JobSet's status."""
        w = self.workload
        ref = f"{w.kind} {w.namespace}/{w.name}"
        obj = self._get(w.kind)
        if obj is None:
            return False, f"kubernetes: {ref} was deleted while running (by someone else, or a TTL); rerun the step"
        jobset = obj if self.flavour.is_jobset else self._get("JobSet")
        js_status = (jobset or {}).get("status") or {}
        if jobset is not None and self.jobset_uid is None:
            self.jobset_uid = (jobset.get("metadata") or {}).get("uid")
        restarts = int(js_status.get("restarts") or 0)
        max_restarts = ((jobset or {}).get("spec", {}).get("failurePolicy") or {}).get("maxRestarts", 0)
        counted = int(js_status.get("restartsCountTowardsMax") or 0)
        if restarts > self.restarts:
            limit = max_restarts if self.limit is None else self.limit
            self.opts.log(f"[k8s] JobSet {w.namespace}/{w.name} restarted the whole group (restart {restarts}; "
                          f"{counted} of {limit} allowed counted)")
            self.restarts = restarts
        if self.limit is not None and counted > self.limit:
            return False, (f"kubernetes: {ref} restarted {counted} times, more than train.max_restarts={self.limit} "
                           f"({self.flavour.failed_fix('ReachedMaxRestarts')})")
        conditions = {c.get("type"): c for c in (obj.get("status") or {}).get("conditions") or []
                      if c.get("status") == "True"}
        if "Failed" in conditions:
            c = conditions["Failed"]
            fix = self.flavour.failed_fix(c.get("reason"))
            return False, (f"kubernetes: {ref} failed after {restarts} restart(s) ({c.get('reason')}: "
                           f"{first_line(c.get('message'))}); {fix}")
        if any(t in conditions for t in self.flavour.done_conditions):
            return True, None
        age = now - w.created_at
        if not js_status and age >= self.opts.operator_grace_seconds:
            return False, self.flavour.controller_missing(w.namespace, w.name, age)
        return False, None

    def _failed_create_group(self, now: float, pods) -> str | None:
        """FailedCreate Events of the child Jobs (an exceeded quota...), after the grace period."""
        events = [e for e in self.api.list_events(field_selector="involvedObject.kind=Job")
                  if e.reason in FAILED_CREATE_REASONS
                  and str(getattr(e.involved_object, "name", "") or "").startswith(f"{self.name}-")]
        return self._cannot_create("group", events, now, pods, self.namespace,
                                   lambda latest: f"Job {self.namespace}/{latest.involved_object.name}")

    def wait(self) -> None:
        """Until the workload is Completed; TrainingFailed on Failed or a failure that will not fix itself."""
        clock = self.opts.clock
        deadline = clock() + self.opts.timeout_seconds
        while True:
            now = clock()
            done, reason = self.group_state(now)
            pods = self.pods()
            has_chief = any((p.metadata.labels or {}).get(ROLE_LABEL) == "chief" for p in pods)
            for pod in pods:
                if self.is_chief(pod, has_chief) or pod.status.phase == "Failed":
                    self.stream_logs(pod)
            if reason:
                raise TrainingFailed(reason)
            if done:
                return
            current = [p for p in pods
                       if (p.metadata.labels or {}).get(RESTART_ATTEMPT_LABEL, "0") == str(self.restarts)]
            for pod in current:
                disrupted = any(c.type == "DisruptionTarget" and c.status == "True"
                                for c in pod.status.conditions or [])
                line = None if disrupted else self.diagnose(pod, now)  # a disrupted pod is recreated
                if line:
                    raise TrainingFailed(line)
            line = self._failed_create_group(now, pods)
            if line:
                raise TrainingFailed(line)
            if now > deadline:
                raise TrainingFailed(
                    f"kubernetes: {self.name} did not finish within {self.opts.timeout_seconds:.0f}s "
                    f"(pods: {_phases(pods)}); raise cluster.deadline_s or look at the pod logs"
                )
            time.sleep(self.opts.poll_seconds)
