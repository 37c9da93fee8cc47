"""``python -m unicron.services.executor``."""

from unicron.services.executor.service import run
from unicron.services.executor.settings import ExecutorSettings
from unicron.shared.service import service_main

if __name__ == "__main__":
    service_main("executor", ExecutorSettings(), run)
