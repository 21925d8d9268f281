"""`pinpoint plan RUN_DIR`: the plan, its prediction beside the baselines', the plan file."""

from __future__ import annotations

from pathlib import Path

from pinpoint.device_names import parse_name, sort_key
from pinpoint.errors import ConfigError
from pinpoint.plan.baselines import baselines
from pinpoint.plan.emit import plan_document, write_plan
from pinpoint.plan.graph import PlanGraph
from pinpoint.plan.links import LinkModel, load_links
from pinpoint.plan.memory import memory_doc, with_gpu_memory
from pinpoint.plan.predict import Prediction, predict
from pinpoint.plan.search import OBJECTIVES, search

SHOWN_MOVES = 10  # rationale lines printed; the plan file has them all


def target_devices(graph: PlanGraph, n: int | None) -> tuple[str, ...]:
    """The devices a plan spreads over: the parameter servers of a parameter_server run, else the
    GPUs (else every device but the host), the first n of them when n is given."""
    devices = sorted(set(graph.devices), key=sort_key)
    servers = [d for d in devices if parse_name(d)[0] == "ps"]
    gpus = [d for d in devices if parse_name(d)[2] == "GPU"]
    if graph.strategy == "parameter_server" and servers:
        pool, what = servers, "parameter servers"
    elif gpus:
        pool, what = gpus, "GPUs"
    else:
        pool, what = [d for d in devices if d != graph.host] or [graph.host], "devices"
    if n is None:
        return tuple(pool)
    if not 1 <= n <= len(pool):
        raise ConfigError(f"--devices: got {n}, but the run has {len(pool)} {what} ({', '.join(pool)}); "
                          f"pass 1 to {len(pool)}, or capture a run on more devices")
    return tuple(pool[:n])


def table(predictions: dict[str, Prediction]) -> str:
    """A readable table: one row per placement (with the parameter servers' balance when any)."""
    servers = any(p.ps_bytes for p in predictions.values())
    emulated = any(p.emulated_step_us is not None for p in predictions.values())
    memory = any(p.memory for p in predictions.values())
    head = ("placement", "step ms", "busiest/mean", "crossing/step", "peak var memory") + \
        (("largest ps/mean",) if servers else ()) + (("here ms (emulated)",) if emulated else ()) + \
        (("peak memory per device (needs on a GPU)",) if memory else ())
    rows = [head]
    for name, p in predictions.items():
        ratio, ps = p.busiest_over_mean, p.ps_over_mean
        rows.append((name, "-" if p.step_us is None else f"{p.step_us / 1e3:.3f}",
                     "-" if ratio is None else f"{ratio:.2f}x", _bytes(p.crossing_total), _bytes(p.peak_memory))
                    + (("-" if ps is None else f"{ps:.2f}x",) if servers else ())
                    + (("-" if p.emulated_step_us is None else f"{p.emulated_step_us / 1e3:.3f}",) if emulated else ())
                    + ((", ".join(f"{d} {_bytes(p.memory[d].needs)}" for d in p.devices if d in p.memory),)
                       if memory else ()))
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    return "\n".join("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths)))
                     for r in rows)


def _bytes(n: int) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


def plan_run(graph: PlanGraph, *, source_run: str, devices: int | None, objective: str | None,
             links: LinkModel, gpu_memory: int | None = None) -> tuple[dict, dict[str, Prediction]]:
    """(the plan document, predictions by placement name) for a PlanGraph; a mirrored run's plan
    also chooses its train.all_reduce (plan.allreduce: `all_reduce`, `all_reduce_plan`);
    `gpu_memory`: each GPU's size in bytes, which each device's predicted peak must fit (plan.memory)."""
    if objective is None:
        objective = "step_time" if graph.timed else "balance"
    if objective not in OBJECTIVES:
        raise ConfigError(f"--objective: got {objective!r}; use step_time or balance")
    if objective == "step_time" and not graph.timed:
        raise ConfigError(f"--objective: got step_time, but {source_run} was not timed; re-run with "
                          "placement.timing: true, or pass --objective balance")
    target = target_devices(graph, devices)
    graph = with_gpu_memory(graph, gpu_memory, target)
    plan = search(graph, links, objective, target)
    base = baselines(graph, target)
    predictions = {"plan": predict(graph, plan.placement, links, target)}
    predictions.update({name: predict(graph, p, links, target) for name, p in base.items()})
    doc = plan_document(graph, source_run=source_run, objective=objective, algorithm=plan.algorithm, devices=target,
                        links=links, plan=plan.placement, predictions=predictions, baselines=base)
    if graph.memory is not None:
        doc["memory"] = memory_doc(graph, plan.ruled_out)
    if graph.all_reduce is not None:
        from pinpoint.plan.allreduce import section

        doc.update(section(graph.all_reduce, links))
    return doc, predictions


def plan_command(run_dir: Path, *, devices: int | None = None, objective: str | None = None,
                 out: Path | None = None, links_file: str | None = None, gpu_memory: int | None = None) -> int:
    links = load_links(links_file)  # a bad --links fails before the run folder is read
    from pinpoint.plan.build import plan_graph  # the capture's side; its readers load only when planning

    graph = plan_graph(run_dir)
    doc, predictions = plan_run(graph, source_run=str(run_dir), devices=devices, objective=objective, links=links,
                                gpu_memory=gpu_memory)
    path = write_plan(out if out is not None else Path(run_dir) / "plan.yaml", doc)
    print_plan(doc, predictions, path)
    return 0


def print_plan(doc: dict, predictions: dict[str, Prediction], path: Path) -> None:
    """The table, the first rationale lines and where the plan file went."""
    print(table(predictions))
    if doc.get("all_reduce"):
        from pinpoint.plan.allreduce import table as all_reduce_table

        print(all_reduce_table(doc))
    shown = doc["rationale"][:SHOWN_MOVES]
    for line in shown:
        print(f"  {line}")
    if len(doc["rationale"]) > len(shown):
        print(f"  ... {len(doc['rationale']) - len(shown)} more moves in {path} (rationale)")
    print(f"pinpoint: plan ({doc['algorithm']}, objective {doc['objective']}, {len(doc['devices'])} device(s)) "
          f"-> {path}")
