"""Sweeps spread over a Ray cluster: `kvbench sweep --ray [ADDRESS]`.

A sweep's work is the runner's units (`runner.plan_units`: one sample under up to --batch-configs
configs), so a unit computes exactly the rows a one-process sweep computes for its configs. Units go to Ray
actors, each of which loads the model once, on its share of the cluster (`cpus` threads, `gpus` GPUs), and
sends back a unit's scored rows (`runner.evaluate_unit`). The main process stays the single writer: it
claims the units' rows in the results store, then appends each unit's rows as they arrive
(`runner.run_plan`), so an interrupted sweep resumes like any other (only the rows the store lacks are
computed), other writers of the folder are not duplicated, and a sweep's rows are those of a one-process
sweep (the timings aside).

Use it when a sweep has many samples and there is more hardware than one process uses: several GPUs (one
worker per GPU, `--ray-gpus 1`), several machines (`--ray ADDRESS` of a running cluster whose nodes have
kvbench and the model), or a multi-core CPU where one process's threads stop scaling. For a handful of
samples, Ray's start (seconds) and each worker's model load cost more than they save.

Ray is an optional dependency: `pip install 'kvbench[ray]'`.
"""

import importlib.util
import logging
import re
import socket
from collections.abc import Iterator
from dataclasses import dataclass

from kvbench.bridge.models import first_line
from kvbench.core.config import PROTOCOLS
from kvbench.core.errors import BadInput, RayUnavailable
from kvbench.harness.runner import Plan, Unit, evaluate_unit
from kvbench.store.results import Row

logger = logging.getLogger(__name__)


def import_ray():
    try:
        import ray
    except ImportError:
        raise RayUnavailable(
            "--ray needs Ray: pip install 'kvbench[ray]' (in the checkout: uv run --extra ray kvbench ...)"
        ) from None
    return ray


class SweepWorker:
    """One Ray actor: the model, loaded once, answering units of the plan."""

    def __init__(self, threads: int, plan: Plan):
        import torch

        from kvbench.bridge.models import load_model
        from kvbench.presses import config_press, press_of
        from kvbench.tasks import register_user_metrics

        torch.set_num_threads(threads)
        register_user_metrics(plan.user_metrics)
        for protocol in plan.user_protocols.values():
            PROTOCOLS.register(protocol.name, protocol, replace=True)
        self.plan = plan
        self.model, self.tokenizer = load_model(plan.model, device=plan.device, dtype=plan.dtype)
        # Rows are keyed by the learned state the main process planned with: this worker must load the same.
        for config in plan.configs:
            press = config_press(config)
            if press is not None and config.press_state is not None:
                press.post_init_from_model(self.model)
                state = press_of(config).state(press)
                if state != config.press_state:
                    raise RayUnavailable(
                        f"a Ray worker loads other {config.press} state ({state}) than the "
                        f"sweep planned with ({config.press_state}): install the same kvbench on every node"
                    )

    def rows(self, unit: Unit) -> list[Row]:
        return evaluate_unit(self.model, self.tokenizer, unit, self.plan)


@dataclass
class RayExecutor:
    """Computes a sweep's units on Ray actors (a runner.Executor): `workers` actors (None: as many as the
    cluster's CPUs, or GPUs, allow), each with `cpus` threads and `gpus` GPUs, loading the plan's model on
    the plan's device, on the cluster at `address` (None: a local cluster started for the sweep and stopped
    after it)."""

    address: str | None = None
    workers: int | None = None
    cpus: int = 1
    gpus: float = 0.0

    def __post_init__(self):
        check_address(self.address)

    def __call__(self, units: list[Unit], plan: Plan) -> Iterator[list[Row]]:
        ray = import_ray()
        try:
            if not units:
                return
            count = min(self.start(), len(units))
            actor = ray.remote(num_cpus=self.cpus, num_gpus=self.gpus)(SweepWorker)
            pool = ray.util.ActorPool([actor.remote(self.cpus, plan) for _ in range(count)])
            logger.info("%d units of work on %d Ray workers", len(units), count)
            results = pool.map_unordered(lambda worker, unit: worker.rows.remote(unit), units)
            while True:
                try:
                    yield next(results)
                except StopIteration:
                    return
                except ray.exceptions.RayError as error:  # a worker's own error is raised here as itself
                    raise worker_error(error) from error
        finally:
            ray.shutdown()

    def start(self) -> int:
        """Join the cluster at `address` (or start a local one) and check that it holds a worker; how many
        workers the sweep gets. `runner.prepare_plan` calls it before the model loads, so that a cluster
        that cannot serve the sweep is a one-line error."""
        ray = import_ray()
        if not ray.is_initialized():
            check_reachable(self.address)
            # A local cluster's workers inherit this process's environment (KVBENCH_CACHE, HF_HOME, ...).
            options = dict(include_dashboard=False, log_to_driver=False, configure_logging=False)
            try:
                ray.init(address=self.address, **options)
            except Exception as error:  # Ray raises what its start-up met: ConnectionError, TimeoutError, ...
                where = (
                    f"reach the Ray cluster at {self.address}"
                    if self.address
                    else "start a local Ray cluster"
                )
                raise RayUnavailable(f"cannot {where}: {first_line(error)}") from None
        return self.worker_count(ray.cluster_resources())

    def worker_count(self, resources: dict) -> int:
        """`workers`, checked against the cluster's `resources`; by default as many as they hold."""
        fits = [int(resources.get("CPU", 0) // self.cpus)]
        if self.gpus:
            fits.append(int(resources.get("GPU", 0) // self.gpus))
        held = f"{resources.get('CPU', 0):g} CPUs and {resources.get('GPU', 0):g} GPUs"
        wanted = f"{self.cpus} CPUs and {self.gpus:g} GPUs"
        if min(fits) < 1:
            raise RayUnavailable(f"the Ray cluster has {held}: not enough for one worker of {wanted}")
        if self.workers is not None and self.workers > min(fits):
            raise RayUnavailable(
                f"--ray-workers {self.workers} do not fit the Ray cluster's {held} ({wanted} each)"
            )
        return self.workers or min(fits)


# What `--ray ADDRESS` may be: auto (the running cluster Ray finds), HOST:PORT of a head node, or
# ray://HOST:PORT, a Ray client address.
ADDRESS = re.compile(r"auto|(ray://)?[A-Za-z0-9.\-\[\]:]+:[0-9]{1,5}")


def check_address(address: str | None) -> None:
    """Refuse, before Ray starts, an address Ray would fail on after seconds or with a traceback: anything
    but auto, HOST:PORT and ray://HOST:PORT (an http:// dashboard URL, an empty string), and a ray:// address
    without Ray's client (kvbench[ray] does not install it: pip install 'ray[client]')."""
    if address is None:
        return
    if not ADDRESS.fullmatch(address):
        raise BadInput(f"--ray {address!r} is not a Ray address: give auto, HOST:PORT or ray://HOST:PORT")
    if address.startswith("ray://") and importlib.util.find_spec("grpc") is None:
        raise RayUnavailable(
            f"--ray {address} is a Ray client address, which needs: pip install 'ray[client]'"
        )


def check_reachable(address: str | None, timeout: float = 5.0) -> None:
    """Refuse a cluster address HOST:PORT that nothing answers on (Ray itself retries for minutes);
    `auto`, `ray://` client addresses and a local cluster (None) are left to Ray."""
    host, _, port = (address or "").rpartition(":")
    if not host or "://" in address or not port.isdigit():
        return
    try:
        socket.create_connection((host, int(port)), timeout=timeout).close()
    except OSError as error:
        raise RayUnavailable(f"cannot reach the Ray cluster at {address}: {error}") from None


def worker_error(error: Exception) -> Exception:
    """The exception a worker raised, out of Ray's wrappers (a failed actor start wraps its task's error)."""
    while getattr(error, "cause", None) is not None and isinstance(error.cause, Exception):
        error = error.cause
    return error
