"""Entrypoint of a worker process of the built-in GPT trainer: ``python -m trainer.worker
[--spare]``; it runs :mod:`trainer.gpt`, a script on the public :mod:`unicron.train` API.

The node agent starts one per rank with the JSON of a ``WorkerLaunch`` in the environment
variable ``UNICRON_WORKER_LAUNCH``, or a warm spare (``--spare`` or ``UNICRON_WORKER_SPARE=1``)
that gets its launch later over the agent socket (:mod:`trainer.spare`). Exit codes: 0 the
job's last step is done (or a spare was released), 1 a step failed (and a
``WorkerException`` was sent to the agent first), 2 the launch was missing or invalid
(nothing was started; the reason is on stderr).
"""

from __future__ import annotations

import os
import sys

from pydantic import ValidationError

from unicron.shared.logging import configure_logging
from unicron.shared.messages import WorkerLaunch

LAUNCH_ENV = "UNICRON_WORKER_LAUNCH"

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_BAD_LAUNCH = 2


def read_launch(environ: dict[str, str] | None = None) -> WorkerLaunch:
    """Parse the launch from the environment; raises ValueError saying what is wrong."""
    raw = (os.environ if environ is None else environ).get(LAUNCH_ENV)
    if not raw:
        raise ValueError(f"{LAUNCH_ENV} is not set; a worker must be started by a node agent")
    try:
        return WorkerLaunch.model_validate_json(raw)
    except ValidationError as exc:
        raise ValueError(f"{LAUNCH_ENV} is not a valid WorkerLaunch: {exc}") from None


def launch_env(launch: WorkerLaunch) -> dict[str, str]:
    """The environment entries an agent adds to start a worker for ``launch``."""
    return {LAUNCH_ENV: launch.model_dump_json()}


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if "--spare" in args or os.environ.get("UNICRON_WORKER_SPARE") == "1":
        return spare_main()
    try:
        launch = read_launch()
    except ValueError as exc:
        print(f"trainer.worker: {exc}", file=sys.stderr)
        return EXIT_BAD_LAUNCH
    configure_logging(f"trainer.rank{launch.rank}")
    return train_gpt(launch)


def train_gpt(launch: WorkerLaunch) -> int:
    """Run the GPT trainer for ``launch``; an exception that ends it is reported and exits 1
    through the hook :func:`unicron.train.init` installs."""
    # Imported only now so that a bad launch fails fast, without loading torch.
    from unicron.train import init
    from unicron.trainer import gpt

    run = init(launch)
    gpt.train(run)
    run.close()
    return EXIT_OK


def spare_main() -> int:
    """A warm spare: load torch now, wait for a launch, then run it (see trainer.spare)."""
    from unicron.trainer import spare

    configure_logging("unicron.trainer.spare")
    path = os.environ.get(spare.AGENT_SOCKET_ENV)
    if not path:
        print(f"trainer.worker: {spare.AGENT_SOCKET_ENV} is not set for a spare", file=sys.stderr)
        return EXIT_BAD_LAUNCH
    spare.warm_up()
    try:
        taken = spare.wait_for_launch(path)
    except (OSError, ValueError) as exc:
        print(f"trainer.worker: spare got no valid launch: {exc}", file=sys.stderr)
        return EXIT_BAD_LAUNCH
    if taken is None:
        return EXIT_OK  # released by the agent
    configure_logging(f"trainer.rank{taken.launch.rank}")
    if taken.script is not None:
        return spare.run_script(taken.script)
    return train_gpt(taken.launch)


def exit_now(code: int) -> None:
    """Leave without running interpreter teardown, which can hang on a broken process group.

    Everything worth keeping (reports, checkpoints) is already out when the run is closed.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    exit_now(main())
