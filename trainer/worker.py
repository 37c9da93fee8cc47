"""Entrypoint of a worker process of the built-in GPT trainer: ``python -m unicron.trainer.worker``;
it runs :mod:`unicron.trainer.gpt`, a script on the public :mod:`unicron.train` API.

The node agent starts one per rank with the JSON of a ``WorkerLaunch`` in the environment
variable ``UNICRON_WORKER_LAUNCH``; a warm spare (:mod:`unicron.trainer.spare`) that takes a
launch naming this module runs it the same way, in its own process. Exit codes: 0 the job's
last step is done, 1 a step failed (and a ``WorkerException`` was sent to the agent first), 2
the launch was missing or invalid (nothing was started; the reason is on stderr).
"""

from __future__ import annotations

import sys

from unicron.shared.contracts.workerchannel import WorkerEnv, WorkerLaunch, env_name
from unicron.shared.logging import configure_logging
from unicron.trainer.exits import EXIT_BAD_LAUNCH, EXIT_OK, exit_now


def read_launch(environ: dict[str, str] | None = None) -> WorkerLaunch:
    """Parse the launch from the environment; raises ValueError saying what is wrong."""
    return required_launch(WorkerEnv.read(environ))


def required_launch(env: WorkerEnv) -> WorkerLaunch:
    if env.launch is None:
        name = env_name("launch")
        raise ValueError(f"{name} is not set; a worker must be started by a node agent")
    return env.launch


def main() -> int:
    try:
        launch = read_launch()
    except ValueError as exc:
        print(f"unicron.trainer.worker: {exc}", file=sys.stderr)
        return EXIT_BAD_LAUNCH
    configure_logging(f"trainer.rank{launch.rank}")
    return train_gpt(launch)


def train_gpt(launch: WorkerLaunch) -> int:
    """Run the GPT trainer for ``launch``; an exception that ends it is reported and exits 1
    through the hook :func:`unicron.train.init` installs."""
    # Imported only now so that a bad launch fails fast, without loading torch.
    from unicron.trainer import gpt
    from unicron.trainer.run import init

    run = init(launch)
    gpt.train(run)
    run.close()
    return EXIT_OK


if __name__ == "__main__":
    exit_now(main())
