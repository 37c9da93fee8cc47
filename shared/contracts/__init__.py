"""The contracts: one pydantic model per event, message, report and record, the job spec and
plans, the worker channel, the failure taxonomy and the lifecycles. Pure data and the rules
about it; nothing here does I/O, so every other layer may import it."""
