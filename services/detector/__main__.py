"""``python -m unicron.services.detector``."""

from unicron.services.detector.service import run
from unicron.services.detector.settings import DetectorSettings
from unicron.shared.service import service_main

if __name__ == "__main__":
    service_main("detector", DetectorSettings(), run)
