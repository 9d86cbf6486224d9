"""The instrumented parallel trainer; of collectors it imports only the telemetry writer, the instrumentation kit and the control channel's key and safe file reader."""
