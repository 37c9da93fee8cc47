"""``python -m services.detector``."""

from services.detector.service import run
from services.detector.settings import DetectorSettings
from shared.service import service_main

if __name__ == "__main__":
    service_main("detector", DetectorSettings(), run)
