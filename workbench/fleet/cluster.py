"""Evaluation slots across hosts with Ray: one actor per GPU of the cluster runs the same EvaluationService.

The head (the workbench process) keeps the only journal writer: it sends each actor the task's oracle files once and
each job's source, and gets the result back as plain data. An actor that dies (its host lost, its process killed)
or stops answering retires its slot, and the pool moves its job to another slot once. Ray is imported here only,
and only when a run asks for `cluster="ray"`: `pip install -e '.[cluster]'` brings it.

    ray start --head                                  # on the head host
    ray start --address HEAD:6379                     # on each GPU host
    RAY_ADDRESS=HEAD:6379 workbench run kda --cluster ray
"""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict

from workbench.evaluator import scratch
from workbench.fleet.api import EvalJob, FleetError, SlotInfo
from workbench.fleet.local import SlotFault

if TYPE_CHECKING:
    from workbench.evaluator.result import EvalResult
    from workbench.fleet.observe import KernelObserver
    from workbench.tasks import Task

EXTRA = "pip install -e '.[cluster]'"
"""What installs Ray with the workbench."""
CONNECT_TIMEOUT_S = 5.0
"""How long the preflight waits for a TCP answer from RAY_ADDRESS."""
START_TIMEOUT_S = 180.0
"""How long the actors get to start (a worker process, our imports, the task's files) before the run gives up."""
RUN_TIMEOUT_S = 3600.0
"""A job whose actor has not answered in this long is lost (the service's own limits end any evaluation sooner)."""
PHASE_POLL_S = 0.5
"""How often the head asks a busy actor for its evaluation's step (for fleet views)."""


def import_ray() -> Any:
    """The ray module.

    Raises:
        FleetError: Ray is not installed (names the extra that installs it).
    """
    try:
        import ray
    except ImportError:
        raise FleetError(f"--cluster ray needs Ray, which is not installed here: {EXTRA}") from None
    return ray


def _host_port(address: str) -> tuple[str, int] | None:
    """(host, port) of a Ray address to probe ("host:port", "ray://host:port"); None for "auto" and "local"."""
    text = address.strip()
    if text in ("auto", "local", ""):
        return None
    if "://" in text:
        text = text.split("://", 1)[1]
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit():
        raise FleetError(f"RAY_ADDRESS={address!r} is not host:port (or ray://host:port, auto)")
    return host.strip("[]"), int(port)


def preflight(address: str | None = None) -> None:
    """Ray is installed and RAY_ADDRESS (when set) answers, checked in seconds before a session is made.

    Raises:
        FleetError: one line (the CLI exits 2).
    """
    import_ray()
    address = os.environ.get("RAY_ADDRESS") if address is None else address
    if not address:
        return  # a local Ray is started for the run
    target = _host_port(address)
    if target is None:
        return
    try:
        with socket.create_connection(target, timeout=CONNECT_TIMEOUT_S):
            pass
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise FleetError(f"the Ray cluster at {address} does not answer ({reason}): start it with `ray start --head` "
                         "there, or unset RAY_ADDRESS to start a local one") from None


def connect() -> Any:
    """Join RAY_ADDRESS (or the Ray this process already joined), else start a local Ray; returns ray.

    Raises:
        FleetError: Ray is missing, or the cluster refused the connection.
    """
    ray = import_ray()
    if ray.is_initialized():
        return ray
    preflight()
    try:
        ray.init(address=os.environ.get("RAY_ADDRESS") or None, log_to_driver=False, include_dashboard=False,
                 configure_logging=False)
    except (ConnectionError, RuntimeError, ValueError) as exc:
        first = str(exc).strip().splitlines()
        raise FleetError(f"could not join the Ray cluster: {first[0] if first else type(exc).__name__}") from None
    return ray


# -- the task, sent once to every actor ----------------------------------------------------------------------


class TaskBundle(TypedDict):
    """A task folder's files an actor needs: the oracle files (task_hash covers them) and the seed."""

    version: int
    name: str
    sha256: str
    files: dict[str, str]


BUNDLE_VERSION = 1


def bundle(task: "Task") -> TaskBundle:
    """The task's oracle files and seed, as text."""
    from workbench.tasks.hashing import oracle_files, task_hash

    paths = {p.name: p for p in oracle_files(task.dir)}
    paths.setdefault(task.seed.name, task.seed)
    return {"version": BUNDLE_VERSION, "name": task.name, "sha256": task_hash(task.dir)["sha256"],
            "files": {name: path.read_text(encoding="utf-8") for name, path in sorted(paths.items())}}


def unpack(data: TaskBundle, root: Path) -> "Task":
    """Write a bundle under root/<name>/ and load it, checking it hashes as it did on the head.

    Raises:
        FleetError: the files do not hash the same here (a different task would be evaluated).
    """
    from workbench.tasks import load_task_dir
    from workbench.tasks.hashing import task_hash

    folder = root / data["name"]
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in data["files"].items():
        (folder / Path(name).name).write_text(text, encoding="utf-8")
    digest = task_hash(folder)["sha256"]
    if digest != data["sha256"]:
        raise FleetError(f"task {data['name']}: its oracle files hash to {digest[:12]} on {socket.gethostname()}, "
                         f"not {data['sha256'][:12]} as on the head")
    return load_task_dir(folder)


# -- the actor (runs on a GPU host) ----------------------------------------------------------------------------


class Reply(TypedDict, total=False):
    """What an actor's run() sends back: a result, or why there is none."""

    result: "EvalResult"
    fault: str
    """The trusted side failed (with a result when the service recovered on its own)."""
    retire: bool
    error: str
    """The job could not be evaluated (not a fault of the slot)."""
    aborted: bool


class SlotActor:
    """One slot on a Ray worker: the task's files, this GPU's description, and a ServiceRunner once started.

    Ray runs it with max_concurrency=2, so phase() and abort() answer while run() evaluates.
    """

    def __init__(self, data: TaskBundle, device: str) -> None:
        self.tmp = scratch.make("actor")
        self.task = unpack(data, self.tmp)
        self.device = device
        self.host = socket.gethostname()
        self.gpu: str | None = None
        self.gpu_name: str | None = None
        self.uuid: str | None = None
        self.busy = ""
        self.rank, self.gpus_here = 0, 1
        """This GPU's place among its host's GPUs, and how many the host has (for the CPU shares)."""
        if device == "cuda":
            self._find_gpu()
        self.runner: Any = None
        self.phase_now = ""
        self._lock = threading.Lock()

    def _find_gpu(self) -> None:
        from workbench.fleet import gpus

        everything = gpus.discover(env={})
        mine = gpus.discover()  # Ray set CUDA_VISIBLE_DEVICES to this actor's GPU
        if not mine:
            raise FleetError(f"{self.host}: the Ray actor sees no GPU (CUDA_VISIBLE_DEVICES="
                             f"{os.environ.get('CUDA_VISIBLE_DEVICES')!r})")
        gpu = mine[0]
        self.gpu, self.gpu_name, self.uuid, self.busy = gpu.index, gpu.name, gpu.uuid, gpu.busy
        self.rank = next((i for i, g in enumerate(everything) if g.uuid == gpu.uuid), 0)
        self.gpus_here = max(1, len(everything))

    def describe(self) -> dict[str, Any]:
        """Where this actor is: host, GPU, whether that GPU is busy with someone else's job, its pid."""
        return {"host": self.host, "gpu": self.gpu, "gpu_name": self.gpu_name, "busy": self.busy,
                "pid": os.getpid()}

    def start(self, slot: str, share: int, shares: int, options: dict[str, Any],
              observer: "KernelObserver | None" = None) -> int:
        """Start the slot's service (share: this actor's place among the host's CPU slots); returns its pid."""
        from workbench.evaluator.service import EvaluationService, usable_cpus
        from workbench.fleet import gpus
        from workbench.fleet.runner import ServiceRunner

        info = SlotInfo(slot, self.device, gpu=self.gpu, host=self.host, gpu_name=self.gpu_name)
        if self.device == "cuda":
            plan = gpus.plan_cpus(self.gpus_here, usable_cpus(), "cuda")
            cpus, spare = plan.slots[self.rank], plan.spare
        else:
            plan = gpus.plan_cpus(shares, usable_cpus(), "cpu")
            cpus = spare = plan.slots[share]

        def make() -> EvaluationService:
            return EvaluationService(self.task, self.device, gpu=self.uuid or self.gpu, cpus=cpus or None,
                                     spare_cpus=spare or None, **options)

        self.runner = ServiceRunner(info, make, observer)
        self.runner.on_phase = self._set_phase
        health = self.runner.service.health()
        return int(health.pid or 0)

    def _set_phase(self, phase: str) -> None:
        self.phase_now = phase

    def service_pid(self) -> int | None:
        """The current service process (tests watch it go when the actor dies)."""
        service = self.runner.service if self.runner is not None else None
        return service.health().pid if service is not None else None

    def phase(self) -> str:
        """The evaluation's current step ('' when idle)."""
        return self.phase_now

    def run(self, job: EvalJob) -> Reply:
        """Evaluate one job from its source; every outcome as data (exceptions do not cross the wire)."""
        from workbench.evaluator.errors import EvalAborted

        with self._lock:
            try:
                return {"result": self.runner.run(job)}
            except SlotFault as exc:
                reply: Reply = {"fault": exc.message, "retire": exc.retire}
                if exc.result is not None:
                    reply["result"] = exc.result
                return reply
            except EvalAborted:
                return {"aborted": True}
            except Exception as exc:  # noqa: BLE001 - the job fails; the slot carries on
                return {"error": f"{type(exc).__name__}: {exc}"[:500]}
            finally:
                self.phase_now = ""

    def abort(self) -> None:
        """Stop the evaluation in flight."""
        if self.runner is not None:
            self.runner.abort()

    def close(self) -> None:
        """Stop the service and its processes."""
        if self.runner is not None:
            self.runner.close()


# -- the head's side ---------------------------------------------------------------------------------------------


class RayRunner:
    """A slot whose evaluations run in a Ray actor (SlotRunner): a lost actor is a SlotFault that retires it."""

    def __init__(self, ray: Any, actor: Any, info: SlotInfo) -> None:
        self._ray = ray
        self.actor = actor
        self.info = info
        self.on_phase: Callable[[str], None] | None = None
        """Told the remote evaluation's step now and then (the pool's set_phase for this slot)."""

    def run(self, job: EvalJob) -> "EvalResult":
        """Send the job, follow its phase, return its result.

        Raises:
            SlotFault: the actor was lost or stopped answering (retire), or its trusted side failed.
            RuntimeError: the job could not be evaluated, or it was aborted.
        """
        ray = self._ray
        from ray.exceptions import GetTimeoutError, RayActorError

        ref = self.actor.run.remote(job)
        waited = 0.0
        try:
            while True:
                ready, _ = ray.wait([ref], timeout=PHASE_POLL_S)
                if ready:
                    reply: Reply = ray.get(ref)
                    break
                waited += PHASE_POLL_S
                if waited > RUN_TIMEOUT_S:
                    ray.kill(self.actor)
                    raise SlotFault(f"{self.info.slot}: the Ray actor did not answer in {RUN_TIMEOUT_S:g} s "
                                    "(killed)", retire=True)
                self._poll_phase(ray, GetTimeoutError, RayActorError)
        except RayActorError as exc:
            first = str(exc).strip().splitlines()
            raise SlotFault(f"{self.info.slot}: the Ray actor was lost ({first[0][:200] if first else 'died'})",
                            retire=True) from None
        if "fault" in reply:
            raise SlotFault(reply["fault"], result=reply.get("result"), retire=bool(reply.get("retire")))
        if "result" in reply:
            return reply["result"]
        if reply.get("aborted"):
            raise RuntimeError("aborted")
        raise RuntimeError(reply.get("error", "the actor sent no result"))

    def _poll_phase(self, ray: Any, *ignored: type[BaseException]) -> None:
        if self.on_phase is None:
            return
        try:
            self.on_phase(ray.get(self.actor.phase.remote(), timeout=PHASE_POLL_S * 4))
        except ignored:
            pass  # a lost actor shows up on the job's own reference

    def abort(self) -> None:
        """Ask the actor to stop the evaluation in flight (it answers while evaluating)."""
        try:
            self.actor.abort.remote()
        except Exception:  # noqa: BLE001 - an actor already gone has nothing to abort
            pass

    def close(self) -> None:
        """Stop the actor's service, then the actor."""
        try:
            self._ray.get(self.actor.close.remote(), timeout=30)
        except Exception:  # noqa: BLE001 - a lost actor's processes went with it
            pass
        try:
            self._ray.kill(self.actor)
        except Exception:  # noqa: BLE001
            pass


def ray_slots(task: "Task", device: str, *, workers: int | None, service_options: dict[str, Any],
              observer: "KernelObserver | None" = None,
              ) -> tuple[list[tuple[SlotInfo, RayRunner]], list[tuple[SlotInfo, str]]]:
    """One actor per GPU of the cluster (CUDA; at most `workers`), or `workers` CPU actors (default one per node);
    each actor runs `observer` (sent by reference: a module-level function) for its own held-out checks.

    Raises:
        FleetError: no GPU in the cluster, more workers than it has, actors that do not start.
    """
    ray = connect()
    resources = ray.cluster_resources()
    if device == "cuda":
        have = int(resources.get("GPU", 0))
        if have == 0:
            raise FleetError("the Ray cluster has no GPU: start each GPU host with `ray start --address HEAD:6379`")
        if workers is not None and workers > have:
            raise FleetError(f"--workers {workers}: the Ray cluster has {have} GPU{'s' if have != 1 else ''}")
        count, options = workers or have, {"num_gpus": 1, "num_cpus": 1}
    else:
        nodes = [n for n in ray.nodes() if n.get("Alive")]
        have = int(resources.get("CPU", 0))
        count = workers or max(1, len(nodes))
        if count > have:
            raise FleetError(f"--workers {count} on the CPU: the Ray cluster has {have} CPUs, one per worker at most")
        options = {"num_cpus": 1, "scheduling_strategy": "SPREAD"}
    remote = ray.remote(SlotActor)
    data = bundle(task)
    actors = [remote.options(max_concurrency=2, max_restarts=0, **options).remote(data, device)
              for _ in range(count)]
    try:
        described = ray.get([a.describe.remote() for a in actors], timeout=START_TIMEOUT_S)
        slots, skipped, per_host = [], [], {}
        for actor, where in zip(actors, described):
            host = where["host"]
            if device == "cuda":
                name = f"ray:{host}:cuda:{where['gpu']}"
            else:
                name = f"ray:{host}:cpu:{per_host.get(host, 0)}"
            per_host[host] = per_host.get(host, 0) + 1
            info = SlotInfo(name, device, gpu=where["gpu"], host=host, gpu_name=where["gpu_name"])
            if where["busy"]:
                skipped.append((info, where["busy"]))
                ray.kill(actor)
            else:
                slots.append((info, actor))
        if not slots:
            raise FleetError(f"every GPU of the Ray cluster is busy with another job ({skipped[0][1]})")
        shares = {host: 0 for host in per_host}
        starts = []
        for info, actor in slots:
            starts.append(actor.start.remote(info.slot, shares[info.host], per_host[info.host],
                                             dict(service_options), observer))
            shares[info.host] += 1
        ray.get(starts, timeout=START_TIMEOUT_S)
    except FleetError:
        for actor in actors:
            ray.kill(actor)
        raise
    except Exception as exc:  # noqa: BLE001 - an actor that could not start, a timeout: one line
        for actor in actors:
            ray.kill(actor)
        first = str(exc).strip().splitlines()
        raise FleetError(f"the Ray evaluation actors did not start: {first[-1][:300] if first else type(exc).__name__}"
                         ) from None
    return [(info, RayRunner(ray, actor, info)) for info, actor in slots], skipped
