"""The detector: raw signals in, one classified ``failure.detected`` per fault out."""
