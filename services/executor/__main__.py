"""``python -m services.executor``."""

from services.executor.service import run
from services.executor.settings import ExecutorSettings
from shared.service import service_main

if __name__ == "__main__":
    service_main("executor", ExecutorSettings(), run)
