"""FAKE JobSet and Kubeflow Trainer v2 controllers for FakeKubeApiServer (no cluster runs here).

They follow the upstream semantics this repo relies on, read from the sources (JobSet v0.9.1,
commit acea4e18c8d0: pkg/controllers/jobset_controller.go, failure_policy.go, success_policy.go,
startup_policy.go; Kubeflow Trainer v2.3.0, commit 658725bdae5c: pkg/runtime/framework/plugins/
jobset, plainml):

* A JobSet makes a headless Service named its subdomain (selector jobset-name) and, per
  replicatedJob, `replicas` child Jobs `<jobset>-<rjob>-<jobIdx>` labelled with the jobset-name,
  jobset-uid, replicatedjob-name, job-index and restart-attempt labels (Job and pod template).
  startupPolicy InOrder creates a replicatedJob's Jobs only once every earlier one's pods run.
* The fake Job controller makes one pod per completion index (`<job>-<index>`, a suffix when
  recreated) and applies the Job's own podFailurePolicy to a failed pod (rules in order: Ignore
  recreates it uncounted, FailJob fails the Job with reason PodFailurePolicy, otherwise it is
  counted and more than backoffLimit fails the Job with BackoffLimitExceeded); a Job
  successPolicy (succeededIndexes) or all completions succeeded make it Complete.
* The JobSet applies failurePolicy to a failed child Job one reconcile after the Job failed
  (rules in order, onJobFailureReasons / targetReplicatedJobs; unmatched: RestartJobSet):
  FailJobSet -> Failed/FailJobSetFailurePolicyAction; RestartJobSet -> Failed/ReachedMaxRestarts
  once restartsCountTowardsMax reached maxRestarts, else every child Job is deleted and
  recreated with status.restarts (and restartsCountTowardsMax) + 1;
  RestartJobSetAndIgnoreMaxRestarts -> the same without counting. No failurePolicy: Failed/FailedJobs.
  successPolicy (Any/All over targetReplicatedJobs) -> Completed/AllJobsCompleted, and the Jobs
  still active are deleted.
* A TrainJob instantiates its ClusterTrainingRuntime's JobSet template (seeded with add_runtime),
  named like the TrainJob: the replicatedJob labelled trainjob-ancestor-step=trainer gets
  replicas 1, parallelism = completions = trainer.numNodes, and its container 'node' the
  trainer's image, command, args, env and resourcesPerNode; runtimePatches are merged into the
  pod templates of the replicatedJobs they name. The TrainJob mirrors the JobSet's Completed
  (as Complete) and Failed conditions.

Pods of a JobSet follow these scenarios (FakeKubeApiServer's `scenario`), one step per pod list:
  success             every pod runs; workers succeed, then the chief (ps/evaluator keep running)
  worker_lost_once    in restart attempt 0, worker 0 exits 138; later attempts succeed
  worker_lost         worker 0 exits 138 in every attempt
  disruption          worker 0's first pod is preempted (DisruptionTarget, exit 143), then succeeds
  crash               the chief exits 1 after a traceback line
  hang                every pod stays Running
With pvc_root, the chief emulates checkpoints on the claim: it logs the step it restores from
(the last 'ckpt' file under its --out, or 0) and writes the step it reached there.
"""

from __future__ import annotations

from copy import deepcopy

JOBSET_NAME = "jobset.sigs.k8s.io/jobset-name"
JOBSET_UID = "jobset.sigs.k8s.io/jobset-uid"
RJOB_NAME = "jobset.sigs.k8s.io/replicatedjob-name"
JOB_INDEX = "jobset.sigs.k8s.io/job-index"
RESTART_ATTEMPT = "jobset.sigs.k8s.io/restart-attempt"
ANCESTOR = "trainer.kubeflow.org/trainjob-ancestor-step"
GROUP_SCENARIOS = ("success", "worker_lost_once", "worker_lost", "disruption", "crash", "hang")


class JobSetControllerMixin:
    """The FAKE JobSet / TrainJob controllers (mixed into FakeKubeApiServer)."""

    # ---- seeding ----------------------------------------------------------------------------
    def add_runtime(self, doc: dict) -> None:
        """A ClusterTrainingRuntime (cluster-scoped) the fake Trainer controller can instantiate."""
        self.runtimes[doc["metadata"]["name"]] = deepcopy(doc)

    # ---- TrainJob ---------------------------------------------------------------------------
    def _trainjob_created(self, tj: dict):
        """Instantiate the runtime's JobSet; a (status, body) error if the runtime is missing."""
        ref = tj["spec"]["runtimeRef"]
        runtime = self.runtimes.get(ref["name"])
        if runtime is None:
            return 422, {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 422, "reason": "Invalid",
                         "message": f'admission webhook "validator.trainjob.trainer.kubeflow.org" denied the request: '
                                    f'spec.runtimeRef: Not found: "ClusterTrainingRuntime.trainer.kubeflow.org '
                                    f'\\"{ref["name"]}\\" not found"'}
        ns, name = tj["metadata"]["namespace"], tj["metadata"]["name"]
        spec = deepcopy(runtime["spec"]["template"]["spec"])
        trainer = tj["spec"].get("trainer") or {}
        for rjob in spec["replicatedJobs"]:
            job_meta = rjob["template"].get("metadata") or {}
            pod_spec = rjob["template"]["spec"]["template"]["spec"]
            if (job_meta.get("labels") or {}).get(ANCESTOR) == "trainer":
                rjob["replicas"] = 1
                n = trainer.get("numNodes", runtime["spec"].get("mlPolicy", {}).get("numNodes", 1))
                rjob["template"]["spec"]["parallelism"] = rjob["template"]["spec"]["completions"] = n
                for c in pod_spec["containers"]:
                    if c["name"] != "node":
                        continue
                    for field in ("image", "command", "args"):
                        if field in trainer:
                            c[field] = deepcopy(trainer[field])
                    _upsert(c.setdefault("env", []), trainer.get("env") or [])
                    if "resourcesPerNode" in trainer:
                        c["resources"] = deepcopy(trainer["resourcesPerNode"])
            for patch in tj["spec"].get("runtimePatches") or []:
                for rp in (((patch.get("trainingRuntimeSpec") or {}).get("template") or {}).get("spec") or {}).get(
                        "replicatedJobs") or []:
                    if rp["name"] == rjob["name"]:
                        _patch_pod_template(rjob["template"]["spec"]["template"],
                                            rp["template"]["spec"]["template"])
        jobset = {
            "apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
            "metadata": {"name": name, "namespace": ns, "uid": self._uid(), "labels": dict(tj["metadata"].get("labels") or {}),
                         "ownerReferences": [{"apiVersion": tj["apiVersion"], "kind": "TrainJob", "name": name,
                                              "uid": tj["metadata"]["uid"], "controller": True}]},
            "spec": spec,
        }
        self.objects[("JobSet", ns, name)] = jobset
        tj["status"] = {"conditions": []}
        self._jobset_created(jobset)
        return None

    def _reconcile_trainjob(self, key, tj: dict) -> None:
        js = self.objects.get(("JobSet", key[1], key[2]))
        if js is None:
            return
        conds = tj["status"].setdefault("conditions", [])
        have = {c["type"] for c in conds}
        for c in (js.get("status") or {}).get("conditions") or []:
            t = {"Completed": "Complete", "Failed": "Failed"}.get(c["type"])
            if t and t not in have:
                conds.append({**c, "type": t})

    # ---- JobSet -----------------------------------------------------------------------------
    def _jobset_created(self, js: dict) -> None:
        js["status"] = {"restarts": 0, "restartsCountTowardsMax": 0, "conditions": []}
        self._ensure_children(js)

    def _subdomain(self, js: dict) -> str:
        return ((js["spec"].get("network") or {}).get("subdomain")) or js["metadata"]["name"]

    def _children(self, js: dict) -> list[dict]:
        uid = js["metadata"]["uid"]
        return [o for (k, _, _), o in self.objects.items()
                if k == "Job" and (o["metadata"].get("labels") or {}).get(JOBSET_UID) == uid]

    def _ensure_children(self, js: dict) -> None:
        """Headless Service and missing child Jobs (startupPolicy InOrder: in order, once running)."""
        ns, name = js["metadata"]["namespace"], js["metadata"]["name"]
        net = js["spec"].get("network") or {}
        sub = self._subdomain(js)
        if net.get("enableDNSHostnames", True) and ("Service", ns, sub) not in self.objects:
            self.objects[("Service", ns, sub)] = {
                "apiVersion": "v1", "kind": "Service",
                "metadata": {"name": sub, "namespace": ns, "uid": self._uid(), "ownerReferences": [_owner(js)]},
                "spec": {"clusterIP": "None", "selector": {JOBSET_NAME: name},
                         "publishNotReadyAddresses": net.get("publishNotReadyAddresses", True)},
            }
        in_order = (js["spec"].get("startupPolicy") or {}).get("startupPolicyOrder") == "InOrder"
        existing = {j["metadata"]["name"]: j for j in self._children(js)}
        for rjob in js["spec"]["replicatedJobs"]:
            jobs = []
            for idx in range(rjob.get("replicas", 1)):
                job_name = f"{name}-{rjob['name']}-{idx}"
                job = existing.get(job_name) or self._create_child(js, rjob, idx)
                jobs.append(job)
            if in_order and not all(self._job_running(j) for j in jobs):
                return  # the next replicatedJob waits until this one's pods run

    def _job_running(self, job: dict) -> bool:
        pods = self._job_pods(job)
        want = job["spec"].get("parallelism", 1)
        return len(pods) >= want and all(p["status"].get("phase") in ("Running", "Succeeded") for p in pods)

    def _create_child(self, js: dict, rjob: dict, idx: int) -> dict:
        ns, name = js["metadata"]["namespace"], js["metadata"]["name"]
        labels = {JOBSET_NAME: name, JOBSET_UID: js["metadata"]["uid"], RJOB_NAME: rjob["name"],
                  JOB_INDEX: str(idx), RESTART_ATTEMPT: str(js["status"]["restarts"])}
        tmpl = deepcopy(rjob["template"])
        spec = tmpl["spec"]
        pod_meta = spec["template"].setdefault("metadata", {})
        pod_meta["labels"] = {**(pod_meta.get("labels") or {}), **labels}
        if (js["spec"].get("network") or {}).get("enableDNSHostnames", True):
            spec["template"]["spec"]["subdomain"] = self._subdomain(js)
        job = {"apiVersion": "batch/v1", "kind": "Job",
               "metadata": {"name": f"{name}-{rjob['name']}-{idx}", "namespace": ns, "uid": self._uid(),
                            "labels": {**((tmpl.get("metadata") or {}).get("labels") or {}), **labels},
                            "ownerReferences": [_owner(js)]},
               "spec": spec, "status": {"failed": 0, "succeeded": 0, "conditions": []}}
        self.objects[("Job", ns, job["metadata"]["name"])] = job
        self.child_jobs.add(("Job", ns, job["metadata"]["name"]))
        for i in range(spec.get("completions", spec.get("parallelism", 1))):
            self._make_group_pod(job, i, gen=0)
        return job

    def _make_group_pod(self, job: dict, index: int, gen: int) -> dict:
        template = job["spec"]["template"]
        labels = template["metadata"]["labels"]
        role, role_index = (labels["pinpoint.dev/role"], index) if "pinpoint.dev/role" in labels else \
            _role_from_layout(template, index)
        pod = self._make_pod("Job", job, role, index, template, gen)
        pod["metadata"]["_role_index"] = role_index
        pod["metadata"]["_attempt"] = int(labels.get(RESTART_ATTEMPT, "0"))
        pod["metadata"]["_group"] = True
        return pod

    def _job_pods(self, job: dict) -> list[dict]:
        key = ("Job", job["metadata"]["namespace"], job["metadata"]["name"])
        return [p for p in self.pods.values() if p["metadata"]["_owner"] == key]

    def _reconcile_child(self, job: dict) -> None:
        """The fake Job controller for a JobSet's child Job."""
        st = job["status"]
        if any(c["type"] in ("Failed", "Complete") for c in st["conditions"]):
            return
        pods = self._job_pods(job)
        for pod in pods:
            meta = pod["metadata"]
            if pod["status"].get("phase") != "Failed" or meta.get("_handled"):
                continue
            meta["_handled"] = True
            action, rule = _pod_failure_action(job, pod)
            if action == "Ignore":
                self._remove_pod(pod)
                self._make_group_pod(job, meta["_index"], meta["_gen"] + 1)
                continue
            st["failed"] += 1
            if action == "FailJob":
                code = _exit_code(pod)
                self._fail_job(job, "PodFailurePolicy",
                               f"Container {pod['spec']['containers'][0]['name']} for pod {meta['namespace']}/"
                               f"{meta['name']} failed with exit code {code} matching FailJob rule at index {rule}")
                return
            if st["failed"] > job["spec"].get("backoffLimit", 6):
                self._fail_job(job, "BackoffLimitExceeded", "Job has reached the specified backoff limit")
                return
            self._remove_pod(pod)
            self._make_group_pod(job, meta["_index"], meta["_gen"] + 1)
        succeeded = {p["metadata"]["_index"] for p in pods if p["status"].get("phase") == "Succeeded"}
        st["succeeded"] = len(succeeded)
        rules = (job["spec"].get("successPolicy") or {}).get("rules") or []
        by_policy = any(str(i) in _index_set(r.get("succeededIndexes", "")) for r in rules for i in succeeded) if rules \
            else False
        if by_policy or len(succeeded) >= job["spec"].get("completions", 1):
            reason = "SuccessPolicy" if by_policy else "CompletionsReached"
            st["conditions"].append(_cond("Complete", reason, "Reached expected number of succeeded pods"))
            for p in pods:
                if p["status"].get("phase") not in ("Succeeded", "Failed"):
                    self._remove_pod(p)

    def _fail_job(self, job: dict, reason: str, message: str) -> None:
        job["status"]["conditions"].append(_cond("Failed", reason, message))
        job["metadata"]["_failed_at"] = self.pod_lists
        for p in self._job_pods(job):  # the Job controller terminates its active pods
            if p["status"].get("phase") not in ("Succeeded", "Failed"):
                self._remove_pod(p)

    def _remove_pod(self, pod: dict) -> None:
        meta = pod["metadata"]
        self.pods.pop((meta["namespace"], meta["name"]), None)

    def _reconcile_jobset(self, key, js: dict) -> None:
        st = js["status"]
        if st.get("terminalState"):
            return
        children = self._children(js)
        for job in children:
            self._reconcile_child(job)
        # The JobSet controller sees a Job's failure on a later reconcile than the Job controller.
        failed = [j for j in children if any(c["type"] == "Failed" for c in j["status"]["conditions"])
                  and j["metadata"].get("_failed_at", -1) < self.pod_lists]
        if failed:
            self._apply_failure_policy(js, failed)
            return
        if any(c["type"] == "Failed" for j in children for c in j["status"]["conditions"]):
            return
        done = [j for j in children if any(c["type"] == "Complete" for c in j["status"]["conditions"])]
        sp = js["spec"].get("successPolicy") or {"operator": "All"}
        targets = sp.get("targetReplicatedJobs") or [r["name"] for r in js["spec"]["replicatedJobs"]]
        matching = [j for j in done if j["metadata"]["labels"][RJOB_NAME] in targets]
        need = 1 if sp["operator"] == "Any" else sum(r.get("replicas", 1) for r in js["spec"]["replicatedJobs"]
                                                      if r["name"] in targets)
        if done and len(matching) >= need:
            self._finish(js, "Completed", "AllJobsCompleted", "jobset completed successfully")
            return
        self._ensure_children(js)

    def _apply_failure_policy(self, js: dict, failed: list[dict]) -> None:
        st = js["status"]
        action, first, reason = jobset_failure_action(
            js["spec"], [(j["metadata"]["name"], j["metadata"]["labels"][RJOB_NAME], _failure_reason(j)) for j in failed],
            st["restartsCountTowardsMax"])
        if action == "Fail":
            self._finish(js, "Failed", reason, JOBSET_FAILED_MESSAGES[reason].format(first=first))
            return
        # Recreate every child Job (BlockingRecreate: the old pods are gone first, here at once).
        for job in self._children(js):
            self._delete_child(job)
        st["restarts"] += 1
        if action == "RestartJobSet":
            st["restartsCountTowardsMax"] += 1
        self.jobset_restarts.append((js["metadata"]["name"], action, first))
        self._ensure_children(js)

    def _delete_child(self, job: dict) -> None:
        key = ("Job", job["metadata"]["namespace"], job["metadata"]["name"])
        for p in self._job_pods(job):
            self._remove_pod(p)
        self.objects.pop(key, None)
        self.child_jobs.discard(key)

    def _finish(self, js: dict, type_: str, reason: str, message: str) -> None:
        js["status"]["conditions"].append(_cond(type_, reason, message))
        js["status"]["terminalState"] = type_
        for job in self._children(js):  # the controller deletes the Jobs still active
            if not any(c["type"] in ("Failed", "Complete") for c in job["status"]["conditions"]):
                self._delete_child(job)

    # ---- pods of a JobSet ---------------------------------------------------------------------
    def _advance_group(self, pod: dict) -> None:
        meta, status = pod["metadata"], pod["status"]
        if status.get("phase") in ("Succeeded", "Failed"):
            return
        step = meta["_step"] = meta["_step"] + 1
        name, c = meta["name"], pod["spec"]["containers"][0]
        role, index, gen, attempt = meta["_role"], meta["_role_index"], meta["_gen"], meta["_attempt"]
        scenario = self.scenario
        has_chief = any(p["metadata"].get("_role") == "chief" for p in self.pods.values()
                        if p["metadata"]["_owner"][1] == meta["namespace"] and p["metadata"].get("_group"))
        is_chief = role == "chief" or (role == "worker" and index == 0 and not has_chief)
        if self.pods.get((meta["namespace"], meta["name"])) is not pod:
            return  # removed by a controller during this list

        def cs(state: dict, ready=False) -> list[dict]:
            return [{"name": c["name"], "image": c["image"], "imageID": "", "ready": ready,
                     "restartCount": 0, "started": ready, "state": state}]

        def exit_with(code: int, *lines: str) -> None:
            self._log(pod, *lines)
            status.update(phase="Failed", containerStatuses=cs({"terminated": {"exitCode": code, "reason": "Error"}}))

        if step == 1:
            status.update(phase="Pending", containerStatuses=cs({"waiting": {"reason": "ContainerCreating"}}))
            return
        if step == 2:
            status.update(phase="Running", conditions=[{"type": "Ready", "status": "True"}],
                          containerStatuses=cs({"running": {"startedAt": "2026-01-01T00:00:01Z"}}, True))
            self._log(pod, f"{name} starting (restart attempt {attempt})")
            if is_chief:
                self._checkpoint(pod, restore=True)
            return
        worker0 = role == "worker" and index == 0
        if scenario == "hang" or role in ("ps", "evaluator"):
            if step == 3 and is_chief:
                self._checkpoint(pod, restore=False)
            return  # servers and the side-car evaluator run until the JobSet ends
        if scenario in ("worker_lost", "worker_lost_once") and worker0 and (scenario == "worker_lost" or attempt == 0):
            exit_with(138, "peer lost; exiting 138 to be restarted")
            return
        if scenario == "disruption" and worker0 and gen == 0:
            self._log(pod, "SIGTERM: preempted")
            status.update(phase="Failed", reason="Preempted",
                          conditions=[{"type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler",
                                       "message": "Preempted in order to admit critical pod"}],
                          containerStatuses=cs({"terminated": {"exitCode": 143, "reason": "Error"}}))
            return
        if scenario == "crash" and is_chief:
            exit_with(1, "Traceback (most recent call last):", "ValueError: boom")
            return
        if is_chief:
            if step == 3:
                self._checkpoint(pod, restore=False)
                return
            peers = [p for p in self.pods.values() if p["metadata"].get("_group") and p is not pod
                     and p["metadata"]["_owner"][1] == meta["namespace"] and p["metadata"]["_role"] == "worker"]
            if all(p["status"].get("phase") == "Succeeded" for p in peers):
                self._log(pod, "step 2 loss 1.10", "done")
                self._succeed(pod, cs)
            return
        self._log(pod, "step 2 loss 1.10", "done")
        status.update(phase="Succeeded", containerStatuses=cs({"terminated": {"exitCode": 0, "reason": "Completed"}}))

    def _checkpoint(self, pod: dict, restore: bool) -> None:
        """Emulate the chief's checkpoint on the claim (pvc_root): restore the last step, or save one."""
        folder = self._claim_folder(pod)
        if folder is None:
            return
        ckpt = folder / "ckpt"
        if restore:
            step = int(ckpt.read_text()) if ckpt.exists() else 0
            self._log(pod, f"restored checkpoint at step {step}" if step else "no checkpoint: starting at step 0")
            pod["metadata"]["_from"] = step
        else:
            folder.mkdir(parents=True, exist_ok=True)
            ckpt.write_text(str(pod["metadata"].get("_from", 0) + 1))
            self._log(pod, f"saved checkpoint at step {pod['metadata'].get('_from', 0) + 1}")


def _owner(obj: dict) -> dict:
    return {"apiVersion": obj["apiVersion"], "kind": obj["kind"], "name": obj["metadata"]["name"],
            "uid": obj["metadata"]["uid"], "controller": True, "blockOwnerDeletion": True}


def _cond(type_: str, reason: str, message: str) -> dict:
    return {"type": type_, "status": "True", "reason": reason, "message": message,
            "lastTransitionTime": "2026-01-01T00:00:02Z"}


def _upsert(env: list[dict], new: list[dict]) -> None:
    for e in new:
        for i, old in enumerate(env):
            if old["name"] == e["name"]:
                env[i] = deepcopy(e)
                break
        else:
            env.append(deepcopy(e))


def _patch_pod_template(target: dict, patch: dict) -> None:
    """A runtimePatches pod template merged into a replicatedJob's (Trainer's patch semantics:
    labels/annotations merged, containers by name, lists appended)."""
    meta = patch.get("metadata") or {}
    tmeta = target.setdefault("metadata", {})
    for k in ("labels", "annotations"):
        if meta.get(k):
            tmeta[k] = {**(tmeta.get(k) or {}), **meta[k]}
    spec, tspec = patch.get("spec") or {}, target["spec"]
    for c in spec.get("containers") or []:
        (tc,) = [x for x in tspec["containers"] if x["name"] == c["name"]]
        _upsert(tc.setdefault("env", []), c.get("env") or [])
        tc.setdefault("volumeMounts", []).extend(deepcopy(c.get("volumeMounts") or []))
    for k in ("volumes", "tolerations", "imagePullSecrets"):
        if spec.get(k):
            tspec.setdefault(k, []).extend(deepcopy(spec[k]))
    if spec.get("nodeSelector"):
        tspec["nodeSelector"] = {**(tspec.get("nodeSelector") or {}), **spec["nodeSelector"]}


def _role_from_layout(template: dict, index: int) -> tuple[str, int]:
    """A TrainJob's pods share one Job: (role, index in role) of completion index `index`, from
    PINPOINT_TASK_LAYOUT."""
    env = {e["name"]: e.get("value") for c in template["spec"]["containers"] for e in c.get("env") or []}
    offset = 0
    for part in (env.get("PINPOINT_TASK_LAYOUT") or "worker:1000000").split(","):
        role, n = part.split(":")
        if index < offset + int(n):
            return role, index - offset
        offset += int(n)
    return "worker", index


def _exit_code(pod: dict) -> int | None:
    for cs in pod["status"].get("containerStatuses") or []:
        term = (cs.get("state") or {}).get("terminated")
        if term:
            return term["exitCode"]
    return None


def _pod_failure_action(job: dict, pod: dict) -> tuple[str, int | None]:
    """The Job's podFailurePolicy applied to a failed pod: (action, rule index); 'Count' if none matched."""
    rules = (job["spec"].get("podFailurePolicy") or {}).get("rules") or []
    conditions = {(c["type"], c["status"]) for c in pod["status"].get("conditions") or []}
    for i, rule in enumerate(rules):
        if "onPodConditions" in rule:
            if any((p["type"], p.get("status", "True")) in conditions for p in rule["onPodConditions"]):
                return rule["action"], i
        elif "onExitCodes" in rule:
            on = rule["onExitCodes"]
            for cs in pod["status"].get("containerStatuses") or []:
                term = (cs.get("state") or {}).get("terminated")
                if not term or term["exitCode"] == 0 or (on.get("containerName") and on["containerName"] != cs["name"]):
                    continue
                hit = term["exitCode"] in on["values"]
                if hit == (on["operator"] == "In"):
                    return rule["action"], i
    return "Count", None


JOBSET_FAILED_MESSAGES = {  # JobSet v0.9.1 pkg/constants, with messageWithFirstFailedJob
    "FailedJobs": "jobset failed due to one or more job failures (first failed job: {first})",
    "FailJobSetFailurePolicyAction": "applying FailJobSet failure policy action (first failed job: {first})",
    "ReachedMaxRestarts": "jobset failed due to reaching max number of restarts (first failed job: {first})",
}


def jobset_failure_action(spec: dict, failed: list[tuple[str, str, str | None]], counted: int) -> tuple[str, str, str]:
    """A JobSet's failurePolicy applied to its failed child Jobs [(job name, replicatedJob, Job
    failure reason)], with `counted` restarts so far: (action, first failed job, reason), the
    action being "Fail" (reason: the JobSet's Failed reason), "RestartJobSet" or
    "RestartJobSetAndIgnoreMaxRestarts" (failure_policy.go of JobSet v0.9.1)."""
    fp = spec.get("failurePolicy")
    first = failed[0][0]
    if fp is None:
        return "Fail", first, "FailedJobs"
    action = "RestartJobSet"  # no rule matched
    for rule in fp.get("rules") or []:
        hit = next((name for name, rjob, reason in failed
                    if (not rule.get("onJobFailureReasons") or reason in rule["onJobFailureReasons"])
                    and (not rule.get("targetReplicatedJobs") or rjob in rule["targetReplicatedJobs"])), None)
        if hit is not None:
            action, first = rule["action"], hit
            break
    if action == "FailJobSet":
        return "Fail", first, "FailJobSetFailurePolicyAction"
    if action == "RestartJobSet" and counted >= fp.get("maxRestarts", 0):
        return "Fail", first, "ReachedMaxRestarts"
    return action, first, ""


def job_failure_reason(job_spec: dict, statuses: list[dict]) -> str | None:
    """The Job controller's verdict on its failed pods (their pod `status`): the Failed reason of
    a Job whose pods failed this way, or None if it keeps going (pods Ignored by its
    podFailurePolicy, or within backoffLimit)."""
    counted = 0
    for status in statuses:
        action, _rule = _pod_failure_action({"spec": job_spec}, {"status": status})
        if action == "FailJob":
            return "PodFailurePolicy"
        if action != "Ignore":
            counted += 1
    return "BackoffLimitExceeded" if counted > job_spec.get("backoffLimit", 6) else None


def _failure_reason(job: dict) -> str | None:
    return next((c["reason"] for c in job["status"]["conditions"] if c["type"] == "Failed"), None)


def _index_set(text: str) -> set[str]:
    """'0,2-3' -> {'0', '2', '3'} (a Job successPolicy's succeededIndexes)."""
    out: set[str] = set()
    for part in filter(None, text.split(",")):
        lo, _, hi = part.partition("-")
        out.update(str(i) for i in range(int(lo), int(hi or lo) + 1))
    return out
