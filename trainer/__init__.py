"""The instrumented parallel trainer; it imports only the telemetry writer from collectors."""
