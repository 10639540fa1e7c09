"""The commands' console: the lines a user reads, and only those.

Ray forwards its workers' output (Ray's and TensorFlow's logs) to the command only with
--verbose; either way it stays in Ray's log files. The lines meant for the user travel
from the training workers to the command through a `Console`, which the command prints.
"""

import contextlib
import dataclasses
import threading

import ray
from ray.util.queue import Queue
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from qml_ray import interrupts, storage_errors
from qml_ray.errors import EnvironmentProblem, UsageError

END = None  # said by the command when the work is over: the relay stops there


@dataclasses.dataclass(frozen=True)
class Workers:
    """Said by rank 0 as each attempt of an elastic run's worker group starts: its workers, of the most."""

    count: int
    most: int


def resize_line(before: int | None, now: Workers) -> str | None:
    """The console's line when an elastic run's worker group changed size (`before`: the last attempt's
    workers, None at the first), else None."""
    if before is None:
        return f"training on {now.count} of {now.most} workers" if now.count < now.most else None
    if now.count < before:
        return f"continuing on {now.count} of {now.most} workers (a node was lost)"
    if now.count == before:
        return None
    return f"back to {now.most} workers" if now.count == now.most else f"growing to {now.count} of {now.most} workers"


class Console:
    """Made by the command after joining Ray and handed to the workers, which `say` lines
    into it; the command prints them while `printing`."""

    def __init__(self):
        # On the command's own node (a head of 0 CPUs too): it outlives any worker node lost.
        here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
        self.queue = Queue(actor_options={"num_cpus": 0, "scheduling_strategy": here})

    def say(self, line: str) -> None:
        self.queue.put(line)

    def workers(self, count: int, most: int) -> None:
        """Rank 0's count of its attempt's workers: the command says when it changed (resize_line)."""
        self.queue.put(Workers(count, most))

    def stop(self, problem: EnvironmentProblem | UsageError) -> None:
        """End the command at once with `problem` (the storage full, a permission lost, a model that
        breaks the contract): Ray Train's restarts would only meet it again."""
        self.queue.put(problem)

    @contextlib.contextmanager
    def printing(self):
        """Print the lines said while the block runs: a relay thread waits on the queue, with no
        polling, until the block ends (every line said before then comes first). A signal ends it
        at once: the local Ray, and the queue with it, may be going down with the command."""

        def relay():
            workers = None
            with contextlib.suppress(ray.exceptions.RayError):  # Ray gone: the command is ending
                while (line := self.queue.get()) is not END:
                    if isinstance(line, EnvironmentProblem | UsageError):
                        interrupts.fail(line)
                    elif isinstance(line, Workers):
                        if said := resize_line(workers, line):
                            print(said, flush=True)
                        workers = line.count
                    else:
                        print(line, flush=True)

        thread = threading.Thread(target=relay, daemon=True)
        thread.start()
        try:
            yield self
        except interrupts.Interrupted:
            raise
        except BaseException:
            self.end(thread)
            raise
        self.end(thread)

    def end(self, relay: threading.Thread) -> None:
        """Stop the relay once it has printed every line said; a queue Ray has lost (its actor dead)
        ends the relay too, and the command goes on to its result."""
        with contextlib.suppress(ray.exceptions.RayError):
            self.queue.put(END)
        relay.join()


@contextlib.contextmanager
def problems_told(console: Console | None, run: str):
    """A worker's block: a UsageError (a model that breaks the contract, say) or an environment's
    problem (storage_errors.environment_problem) it meets is told to the command through `console`, which
    then ends at once, and the block ends quietly: raised, it would have Ray Train start the workers
    again (and reserve their CPUs anew) while the command and its job end. Without a console
    (a sweep's trial), it is raised."""
    try:
        yield
    except Exception as err:
        problem = err if isinstance(err, UsageError) else storage_errors.environment_problem(err, run)
        if not (console and problem):
            raise
        console.stop(problem)
